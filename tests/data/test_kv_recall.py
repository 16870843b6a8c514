"""Key-value associative recall (the needle task's harder variant): layout, determinism, eval inputs, the interface."""

import pytest
import torch

from framework.callbacks.mask_sweep import mask_sweep
from framework.data.kv_recall import (
    BOS,
    EOS,
    FIRST_KEY,
    MASK,
    PAD,
    SEP,
    KVRecallData,
    key_position,
    kv_eval_batch,
    kv_rows,
    prompt_length,
)
from framework.losses.mdlm import LogLinearSchedule, mdlm_nelbo
from framework.models.transformer import TransformerLM

torch.set_num_threads(1)

N, K, V = 8, 16, 16
P = prompt_length(N)


def test_rows_pair_distinct_keys_with_values_and_answer_the_queried_key_after_the_prompt():
    rows = kv_rows(500, torch.Generator().manual_seed(0), N, K, V, max_eos=32)
    tokens, slot, value, length = rows["tokens"], rows["slot"], rows["value"], rows["length"]
    i = torch.arange(500)
    assert P == 19 and tokens.shape == (500, P + 1 + 32)
    assert (tokens[:, 0] == BOS).all() and (tokens[:, P - 2] == SEP).all()
    keys, values = tokens[:, 1 : P - 2 : 2], tokens[:, 2 : P - 2 : 2]
    assert ((keys >= FIRST_KEY) & (keys < FIRST_KEY + K)).all()  # keys and values never share a token
    assert ((values >= FIRST_KEY + K) & (values < FIRST_KEY + K + V)).all()
    assert all(len(set(row.tolist())) == N for row in keys)  # distinct keys: the answer is unique
    assert (tokens[:, P - 1] == tokens[i, key_position(slot)]).all()  # the query repeats pair `slot`'s key
    assert (tokens[i, key_position(slot) + 1] == value).all() and (tokens[:, P] == value).all()
    pos = torch.arange(tokens.shape[1])[None]
    assert (tokens[(pos > P) & (pos < length[:, None])] == EOS).all()
    assert (tokens[pos >= length[:, None]] == PAD).all()
    assert torch.equal(rows["attention_mask"], pos < length[:, None])
    assert torch.equal(rows["prompt_mask"], (pos < P).expand(500, -1))
    assert set(slot.tolist()) == set(range(N)) and length.min() == P + 1 and length.max() == P + 33


def test_same_seed_gives_the_same_rows_and_another_seed_does_not():
    a, b = (kv_rows(64, torch.Generator().manual_seed(7)) for _ in range(2))
    c = kv_rows(64, torch.Generator().manual_seed(8))
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["tokens"], c["tokens"])


def test_eval_batch_appends_one_plus_m_masks_after_the_same_prompts_for_every_m():
    small = kv_eval_batch(2, slots=[0, 7], n_per_slot=5, generator=torch.Generator().manual_seed(0))
    large = kv_eval_batch(64, slots=[0, 7], n_per_slot=5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(small["prompt"], large["prompt"]) and torch.equal(small["answer"], large["answer"])
    assert small["tokens"].shape == (10, P + 3) and large["tokens"].shape == (10, P + 65)
    assert (large["tokens"][:, P:] == MASK).all() and small["answer_position"] == P
    assert small["slot"].tolist() == [0] * 5 + [7] * 5
    i = torch.arange(10)
    prompt = small["prompt"]
    assert (prompt[i, key_position(small["slot"]) + 1] == small["answer"]).all()


def test_datamodule_reports_the_needle_interface_and_trains_an_mdlm_and_a_mask_sweep():
    data = KVRecallData(n_train=32, n_val=16, batch_size=8, seed=0)
    data.setup()
    assert (data.vocab_size, data.mask_id, data.pad_id, data.n_slots) == (5 + K + V, MASK, PAD, N)
    assert data.prompt_length == data.answer_position == P
    batch = next(iter(data.val_dataloader()))
    assert set(batch) >= {"tokens", "attention_mask", "prompt_mask"} and batch["tokens"].shape == (8, P + 33)
    model = TransformerLM(data.vocab_size, dim=16, depth=1, heads=2, causal=False)
    loss, _ = mdlm_nelbo(model, batch["tokens"], data.mask_id, LogLinearSchedule(),
                         attention_mask=batch["attention_mask"], prompt_mask=batch["prompt_mask"])
    assert torch.isfinite(loss)
    table = mask_sweep(model, data, ms=[0, 4], n_per_slot=2, seed=3)
    assert table["m"] == [0, 4] and len(table["acc_by_slot"]["4"]) == N
    assert torch.equal(data.eval_batch(2, 3, seed=1)["tokens"], data.eval_batch(2, 3, seed=1)["tokens"])


def test_impossible_shapes_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="n_keys=4 >= n_pairs"):
        KVRecallData(n_pairs=8, n_keys=4)
    with pytest.raises(ValueError, match="slots must lie in"):
        kv_eval_batch(0, slots=[8], n_per_slot=1)
