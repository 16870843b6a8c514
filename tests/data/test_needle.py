"""The needle retrieval task (docs/mdlm.md)."""

import pytest
import torch

from framework.data.needle import (
    BOS,
    EOS,
    MASK,
    NDL,
    PAD,
    SEP,
    NeedleData,
    needle_eval_batch,
    needle_position,
    needle_prompts,
    needle_rows,
    prompt_length,
)
from framework.losses.mdlm import LogLinearSchedule, mdlm_nelbo

torch.set_num_threads(1)

P = prompt_length(16)


def test_rows_hold_one_needle_at_its_slot_and_the_answer_right_after_the_prompt():
    rows = needle_rows(500, torch.Generator().manual_seed(0))
    tokens, slot, value, length = rows["tokens"], rows["slot"], rows["value"], rows["length"]
    i = torch.arange(500)
    assert tokens.shape == (500, P + 3 + 32) and P == 18
    assert (tokens[:, 0] == BOS).all() and (tokens[:, P - 1] == SEP).all()
    assert ((tokens == NDL).sum(1) == 1).all()
    assert (tokens[i, needle_position(slot)] == NDL).all() and (tokens[i, needle_position(slot) + 1] == value).all()
    assert (tokens[:, P] == value).all() and (tokens[:, P + 1] == SEP).all() and (tokens[:, P + 2] == value).all()
    context = tokens[:, 1 : P - 1]
    assert ((context >= 6) | (context == NDL)).all() and (context < 18).all()
    pos = torch.arange(tokens.shape[1])[None]
    eos = (pos >= P + 3) & (pos < length[:, None])
    assert (tokens[eos] == EOS).all() and (tokens[pos >= length[:, None]] == PAD).all()
    assert length.min() == P + 3 and length.max() == P + 3 + 32
    assert set(slot.tolist()) == set(range(8)) and set(value.tolist()) == set(range(6, 18))
    assert torch.equal(rows["attention_mask"], pos < length[:, None])
    assert torch.equal(rows["prompt_mask"], (pos < P).expand(500, -1))


def test_slot_zero_is_farthest_from_the_answer():
    distances = [P - needle_position(q) for q in range(8)]
    assert distances == sorted(distances, reverse=True) and distances[0] == 17 and distances[-1] == 3


def test_same_seed_gives_the_same_rows_and_another_seed_does_not():
    a, b = (needle_rows(64, torch.Generator().manual_seed(7)) for _ in range(2))
    c = needle_rows(64, torch.Generator().manual_seed(8))
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["tokens"], c["tokens"])


def test_eval_batch_appends_one_plus_m_masks_and_keeps_the_prompts_across_m():
    small = needle_eval_batch(2, slots=[0, 7], n_per_slot=5, generator=torch.Generator().manual_seed(0))
    large = needle_eval_batch(64, slots=[0, 7], n_per_slot=5, generator=torch.Generator().manual_seed(0))
    assert small["tokens"].shape == (10, P + 3) and large["tokens"].shape == (10, P + 65)
    assert torch.equal(small["tokens"][:, :P], large["tokens"][:, :P])
    assert (large["tokens"][:, P:] == MASK).all() and small["answer_position"] == P
    assert small["slot"].tolist() == [0] * 5 + [7] * 5
    i = torch.arange(10)
    assert (small["prompt"][i, needle_position(small["slot"]) + 1] == small["answer"]).all()


def test_slots_outside_the_context_are_rejected():
    with pytest.raises(ValueError, match=r"slots must lie in \[0, 7\], got \[8\]"):
        needle_prompts(torch.tensor([8]))
    with pytest.raises(ValueError, match="context_len=15 must be an even number"):
        NeedleData(context_len=15)


def test_datamodule_exposes_ids_builds_deterministic_splits_and_trains_with_sft_masking():
    dm = NeedleData(n_train=256, n_val=64, batch_size=32, seed=3)
    assert (dm.vocab_size, dm.mask_id, dm.pad_id, dm.max_len, dm.prompt_length) == (18, MASK, PAD, 53, 18)
    dm.setup("fit")
    again = NeedleData(n_train=256, n_val=64, batch_size=32, seed=3)
    again.setup("fit")
    assert torch.equal(dm.train_set.rows["tokens"], again.train_set.rows["tokens"])
    assert not torch.equal(dm.train_set.rows["tokens"][:64], dm.val_set.rows["tokens"])
    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape == (32, 53) and batch["prompt_mask"].dtype == torch.bool
    assert len(dm.train_dataloader()) == 8 and len(dm.val_dataloader()) == 2

    seen = []

    def model(x, key_padding_mask=None):
        seen.append(x)
        return torch.zeros(*x.shape, dm.vocab_size)

    mdlm_nelbo(model, batch["tokens"], dm.mask_id, LogLinearSchedule(), attention_mask=batch["attention_mask"],
               prompt_mask=batch["prompt_mask"], t=torch.full((32,), 0.99))
    assert not (seen[0][:, :P] == MASK).any() and (seen[0][:, P:] == MASK).any()
    assert not (seen[0][~batch["attention_mask"]] == MASK).any()
    eval_batch = dm.eval_batch(m=4, n_per_slot=3)
    assert eval_batch["tokens"].shape == (24, P + 5) and torch.equal(eval_batch["tokens"],
                                                                      dm.eval_batch(m=4, n_per_slot=3)["tokens"])
