"""The pointer-chasing workload: rows follow the permutation in the prompt, stop where the task says, and are
deterministic per seed; the exact-match reward scores whole answers."""

from __future__ import annotations

import pytest
import torch

from framework.data.pointer_chase import (
    BOS,
    EOS,
    PAD,
    SEP,
    PointerChaseData,
    answer_length,
    chase_rows,
    prompt_length,
)
from framework.probes.rewards import exact_match, token_accuracy


def follow(row: torch.Tensor, n_pairs: int, offset: int = 0) -> tuple[int, dict[int, int], list[int]]:
    """Start symbol, the map f read from the prompt, and the answer symbols before EOS (minus `offset`)."""
    p = prompt_length(n_pairs)
    pairs = row[1 : 2 * n_pairs + 1].view(n_pairs, 2).tolist()
    f = {a: b for a, b in pairs}
    answer = row[p:].tolist()
    return int(row[p - 1]), f, [t - offset for t in answer[: answer.index(EOS)]]


def test_chain_rows_follow_the_permutation_until_it_returns_to_the_start():
    rows = chase_rows(300, torch.Generator().manual_seed(0), n_pairs=6, n_symbols=12)
    assert rows.shape == (300, prompt_length(6) + answer_length(6))
    lengths = []
    for row in rows:
        assert row[0] == BOS and row[13] == SEP
        start, f, chain = follow(row, 6, offset=12)  # answers use their own copy of the 12 symbols
        assert sorted(f) == sorted(f.values())  # f permutes the listed symbols
        x, expected = start, []
        while True:
            x = f[x]
            expected.append(x)
            if x == start:
                break
        assert chain == expected
        after = row[prompt_length(6) + len(chain) + 1 :]
        assert (after == PAD).all()
        lengths.append(len(chain))
    assert set(lengths) == set(range(1, 7))  # every cycle length occurs, so stopping is part of the task


def test_fixed_hop_and_lookup_rows():
    hops = chase_rows(50, torch.Generator().manual_seed(1), n_pairs=8, n_symbols=16, hops=6, distinct_answers=False)
    for row in hops:
        start, f, chain = follow(row, 8)
        x = start
        for token in chain:
            x = f[x]
            assert token == x
        assert len(chain) == 6
    lookup = chase_rows(50, torch.Generator().manual_seed(1), task="lookup")
    assert lookup.shape[1] == prompt_length(8) + 2
    for row in lookup:
        start, f, chain = follow(row, 8, offset=16)
        assert chain == [f[start]]


def test_rows_are_deterministic_per_seed_and_bad_shapes_name_the_value():
    a = chase_rows(10, torch.Generator().manual_seed(5))
    assert torch.equal(a, chase_rows(10, torch.Generator().manual_seed(5)))
    assert not torch.equal(a, chase_rows(10, torch.Generator().manual_seed(6)))
    with pytest.raises(ValueError, match="n_symbols=4 >= n_pairs"):
        chase_rows(2, n_pairs=8, n_symbols=4)
    with pytest.raises(ValueError, match="task='multi'"):
        chase_rows(2, task="multi")


def test_datamodule_serves_train_task_rows_for_training_and_chain_rows_for_validation_and_pretraining():
    data = PointerChaseData(n_pairs=4, n_symbols=8, train_task="lookup", n_train=64, n_val=16, batch_size=8)
    data.setup()
    assert data.vocab_size == 4 + 2 * 8 and data.prompt_length == 11 and data.max_new_tokens == 5
    train = next(iter(data.train_dataloader()))
    assert train.shape == (8, 13)  # prompt + f(s) + EOS
    val = next(iter(data.val_dataloader()))
    assert val.shape == (16, 16)
    pre = next(iter(data.pretrain_dataloader(batch_size=4)))
    assert pre.shape == (4, 16)
    prompt, answer = data.split(val)
    assert prompt.shape[1] == 11 and answer.shape[1] == 5


def test_exact_match_needs_every_token_and_token_accuracy_gives_partial_credit():
    answer = torch.tensor([[5, 6, EOS, PAD], [7, EOS, PAD, PAD]])
    generated = torch.tensor([[5, 6, EOS, PAD], [7, 7, EOS, PAD]])
    assert exact_match(generated, answer).tolist() == [1.0, 0.0]
    assert token_accuracy(generated, answer).tolist() == [1.0, 0.5]
