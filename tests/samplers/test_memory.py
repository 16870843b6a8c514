"""The per-rank memory formulas of `framework.samplers.memory` (quoted in docs/data_agent.md) equal the bytes the
tensors of a real selection hold: the score table, the sampler, the amortised agent's epoch, the per-step gather."""

from __future__ import annotations

import torch

from framework.samplers import AmortisedAgentPolicy, DataAgentPolicy, ScoreTable, SelectionSampler
from framework.samplers.memory import main, selection_memory
from framework.samplers.step import RankGather

N, DIM, CLASSES, BATCH = 97, 24, 7, 8


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.nbytes for t in tensors)


def step(index: torch.Tensor, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(index[0]))
    return {"index": index, "features": torch.randn(index.numel(), DIM, generator=g).to(dtype),
            "logits": torch.randn(index.numel(), CLASSES, generator=g).to(dtype),
            "targets": torch.randint(0, CLASSES, (index.numel(),), generator=g)}


def test_the_table_and_the_sampler_hold_what_the_formula_says():
    ranks = 4  # 97 samples on 4 ranks: a full epoch pads 3 = ranks − 1 duplicates, the most there can be
    expected = selection_memory(N, DIM, CLASSES, ranks=ranks)
    table = ScoreTable(N)
    assert nbytes(table.scores, table.last_seen, table.count, table.ema_mean, table.ema_var) == expected["table"]
    sampler = SelectionSampler(table, num_epochs=1, rank=0, world_size=ranks)
    sampler.set_epoch(0)
    assert nbytes(sampler.selection, sampler.weights) == expected["sampler"]


def test_an_amortised_learning_epoch_holds_what_the_formula_says_in_the_features_own_dtype():
    expected = selection_memory(N, DIM, CLASSES, batch=BATCH, feature_bytes=2, logit_bytes=2, update_size=16)
    policy, table = AmortisedAgentPolicy(seed=0, learn_every=1, update_size=16), ScoreTable(N)
    sampler = SelectionSampler(table, policy, num_epochs=4, seed=0)
    sampler.set_epoch(0)  # a pruned epoch: ⌊ρN⌋ samples
    order = sampler.selection
    for start in range(0, order.numel(), BATCH):
        policy.observe_local(step(order[start : start + BATCH], torch.bfloat16), RankGather(), table, 0, 4)
    assert nbytes(*(t for r in policy.records for t in r.values())) == expected["amortised"]
    assert nbytes(policy._epoch_keys(N, 0)) == expected["amortised_keys"]
    assert nbytes(*policy.subsample.values()) == expected["amortised_subsample"]
    assert policy.subsample["features"].dtype == torch.bfloat16


def test_the_agents_rollout_and_a_gathered_step_hold_what_the_formula_says():
    ranks = 3
    expected = selection_memory(N, DIM, CLASSES, ranks=ranks, batch=BATCH, update_every=10)
    policy, table = DataAgentPolicy(seed=0, update_every=10), ScoreTable(N)
    gather = RankGather(lambda t: torch.stack([t] * ranks), rank=0, world_size=ranks)  # every rank sends the same
    for i in range(9):  # the rollout just before its 10th step triggers the update
        gathered = gather(step(torch.arange(BATCH) + BATCH * (i % 4)))
        policy.observe(gathered, table, 0)
    rollout = nbytes(*(t for ts in policy.agent.buffer.values() for t in ts))
    assert rollout == expected["agent_rollout"] * 9 // 10
    assert nbytes(*gathered.values()) == expected["step_gather"]
    assert expected["step_gather_before"] == ranks * BATCH * 8 * (2 + DIM + CLASSES)


def test_the_command_writes_the_table_for_an_imagenet_sized_fit(tmp_path, capsys):
    out = tmp_path / "memory.md"
    main(["--out", str(out)])
    text = out.read_text()
    assert text.startswith("<!-- written by `python -m framework.samplers.memory") and "N = 1,281,167" in text
    assert capsys.readouterr().out in text
    assert "| `data_agent_amortised` in all: the first five rows |" in text
