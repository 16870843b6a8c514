"""`GICDM` under torchmetrics' forward contract, in the pattern of torchmetrics' `MetricTester` (our own code).

A subclass whose `update` takes `(preds, target)`, as torchmetrics' tester calls it, goes through the tester's
checks: per-batch `forward` values and the final `compute()` against a reference (class test, also with
`compute_on_cpu` and `dist_sync_on_step`), 2 gloo ranks on CPU, float16/bfloat16 inputs, and a non-differentiable
output. The reference is the `prdc` package for P/R/D/C and `framework.metrics.prdc` for the hubness keys.
Regression: `forward(x, real)` evaluated `if real` on the target tensor ("Boolean value of Tensor with more than one
value is ambiguous") in every one of these.
"""

from __future__ import annotations

import json
import pickle
import socket
import tempfile
from copy import deepcopy
from pathlib import Path

import prdc as prdc_ref
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from framework.metrics import GICDM, prdc

K = 5
PRDC = ("precision", "recall", "density", "coverage")
KEYS = (*PRDC, "real_k_occurrence_skewness", "approx_graph")  # correction none: no corrected skewness
N_BATCHES, BATCH, DIM = 4, 32, 16  # 4 batches: 2 per rank under DDP


class PredsTargetGICDM(GICDM):
    """`update(preds, target)`: generated inputs and reals, the signature torchmetrics' tester calls."""

    def update(self, preds: Tensor, target: Tensor) -> None:  # type: ignore[override]
        super().update(preds, real=False)
        super().update(target, real=True)


def batches(seed: int = 0) -> tuple[Tensor, Tensor]:
    """(N_BATCHES, BATCH, DIM) generated and real features; shifted and wider, so no score is 0 or 1."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(N_BATCHES, BATCH, DIM, generator=g)
    return torch.randn(N_BATCHES, BATCH, DIM, generator=g) * 1.1 + 0.1, target


def reference(preds: Tensor, target: Tensor) -> dict[str, float]:
    """P/R/D/C of `prdc.compute_prdc`, the hub skewness of `framework.metrics.prdc`, no candidate graph."""
    preds, target = preds.reshape(-1, DIM).float(), target.reshape(-1, DIM).float()
    out = {k: float(v) for k, v in prdc_ref.compute_prdc(target.numpy(), preds.numpy(), nearest_k=K).items()}
    ours = prdc(target, preds, K)
    return {**out, "real_k_occurrence_skewness": ours["real_k_occurrence_skewness"], "approx_graph": 0.0}


def floats(out: dict[str, Tensor]) -> dict[str, float]:
    assert set(out) == set(KEYS) and all(isinstance(v, Tensor) for v in out.values())
    return {k: float(v) for k, v in out.items()}


def rows(state: list[Tensor]) -> int:
    return sum(int(t.shape[0]) for t in state)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"compute_on_cpu": True}, {"dist_sync_on_step": True}],
    ids=["reduce_state_forward", "compute_on_cpu", "dist_sync_on_step_full_state_forward"],
)
def test_class_forward_per_batch_and_compute_on_all_batches_equal_the_reference(kwargs):
    preds, target = batches()
    metric = PredsTargetGICDM(k=K, **kwargs)
    for attr in ("is_differentiable", "higher_is_better"):  # torchmetrics guards these class facts
        with pytest.raises(RuntimeError):
            setattr(metric, attr, not getattr(metric, attr))
    metric = pickle.loads(pickle.dumps(metric.clone()))
    by_update = deepcopy(metric)
    for i in range(N_BATCHES):
        batch = floats(metric(preds[i], target[i]))
        assert batch == pytest.approx(reference(preds[i], target[i]), abs=1e-6), f"batch {i}"
        if i == 0:  # forward's batch value is update() then compute() on a fresh metric
            by_update.update(preds[i], target[i])
            assert batch == floats(by_update.compute())
        assert rows(metric.real_features) == rows(metric.fake_features) == (i + 1) * BATCH
    assert metric.state_dict() == {}  # the feature lists are not persistent, like torchmetrics' states
    assert floats(metric.compute()) == pytest.approx(reference(preds, target), abs=1e-6)
    assert metric.info["n_real"] == metric.info["n_fake"] == N_BATCHES * BATCH


def test_kept_reals_count_once_and_the_reals_each_batch_adds_are_kept():
    """With `reset_real_features=False` the batch state holds the kept reals plus the batch's; forward's reduce step
    would store the kept ones twice. Each batch value is scored against every real seen so far."""
    preds, target = batches(4)
    metric = PredsTargetGICDM(k=K, reset_real_features=False)
    metric.update(preds[0], target[0])
    metric.reset()  # target[0] stays, preds[0] goes
    for i in range(1, N_BATCHES):
        batch = floats(metric(preds[i], target[i]))
        assert batch == pytest.approx(reference(preds[i], target[: i + 1]), abs=1e-6), f"batch {i}"
        assert rows(metric.real_features) == (i + 1) * BATCH and rows(metric.fake_features) == i * BATCH
    assert floats(metric.compute()) == pytest.approx(reference(preds[1:], target), abs=1e-6)

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_are_scored_in_float32(dtype):
    """`update` casts features to float32 before any arithmetic, so half inputs are scored exactly as their rounded
    values: equal to the reference on those within 1e-6. Against the float32 inputs, rounding (relative 2^-11 for
    float16, 2^-8 for bfloat16) moves each distance by a fraction of a percent and can flip only the ball tests
    decided within that margin; a flip moves P, R or C by 1 / n (density by 1 / (k n)), n the points scored. Two
    flips are allowed (seen over 6 seeds and both dtypes: at most one, 1 / 32 on a batch, 1 / 128 on all data)."""
    preds, target = batches(1)
    low_p, low_t = preds.to(dtype), target.to(dtype)
    metric = PredsTargetGICDM(k=K)
    for i in range(N_BATCHES):
        batch = floats(metric(low_p[i], low_t[i]))
        assert batch == pytest.approx(reference(low_p[i], low_t[i]), abs=1e-6), f"batch {i}"
        fp32 = reference(preds[i], target[i])
        assert {k: batch[k] for k in PRDC} == pytest.approx({k: fp32[k] for k in PRDC}, abs=2 / BATCH), f"batch {i}"
    assert all(t.dtype == torch.float32 for t in (*metric.real_features, *metric.fake_features))
    out, fp32 = floats(metric.compute()), reference(preds, target)
    assert out == pytest.approx(reference(low_p, low_t), abs=1e-6)
    assert {k: out[k] for k in PRDC} == pytest.approx({k: fp32[k] for k in PRDC}, abs=2 / (N_BATCHES * BATCH))


def test_not_differentiable_forward_on_inputs_requiring_grad_gives_values_without_a_graph():
    """torchmetrics' tester asserts `out.requires_grad == metric.is_differentiable` for forward's outputs."""
    preds, target = batches(2)
    preds.requires_grad_(True)
    target.requires_grad_(True)
    metric = PredsTargetGICDM(k=K)
    assert metric.is_differentiable is False
    out = metric(preds[0], target[0])
    assert all(v.requires_grad is metric.is_differentiable and v.grad_fn is None for v in out.values())
    assert not any(t.requires_grad for t in (*metric.real_features, *metric.fake_features))
    assert floats(out) == pytest.approx(reference(preds[0].detach(), target[0].detach()), abs=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, port: int, out_dir: str) -> None:
    """Each rank forwards its shard (batches rank, rank + 2); the per-batch values and compute() are recorded."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        preds, target = batches(3)
        results: dict[str, object] = {}
        for name, kwargs in (("local_step", {}), ("sync_step", {"dist_sync_on_step": True})):
            metric = PredsTargetGICDM(k=K, **kwargs)
            steps = [{k: float(v) for k, v in metric(preds[i], target[i]).items()} for i in range(rank, N_BATCHES, 2)]
            results[name] = {"steps": steps, "rows": rows(metric.real_features),
                             "compute": {k: float(v) for k, v in metric.compute().items()}}
        # the KID pattern with update(x, real): reals kept across reset, sharded; generated batches by forward
        kept = GICDM(k=K, reset_real_features=False)
        kept.update(target.reshape(-1, DIM).chunk(2)[rank], real=True)
        for i in range(rank, N_BATCHES, 2):
            kept(preds[i], real=False)
        results["kept_reals"] = {"rows": rows(kept.real_features),
                                 "compute": {k: float(v) for k, v in kept.compute().items()}}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_ddp_two_gloo_ranks_forward_their_shards_and_compute_equals_the_reference_on_all_batches():
    preds, target = batches(3)
    with tempfile.TemporaryDirectory() as tmp:
        # fork, like test_metric_ddp.py: the ranks start in well under a second instead of re-importing torchmetrics
        mp.start_processes(_ddp_worker, args=(_free_port(), tmp), nprocs=2, join=True, start_method="fork")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    everything = reference(preds, target)
    for rank, result in enumerate(ranks):
        mine = range(rank, N_BATCHES, 2)
        for name in ("local_step", "sync_step", "kept_reals"):
            assert result[name]["compute"] == pytest.approx(everything, abs=1e-6), (rank, name)
        assert result["local_step"]["rows"] == result["sync_step"]["rows"] == 2 * BATCH  # the rank's own shard
        assert result["kept_reals"]["rows"] == N_BATCHES * BATCH // 2  # its half of the reals, once
        for i, step in zip(mine, result["local_step"]["steps"], strict=True):  # each rank's batch on its own
            assert step == pytest.approx(reference(preds[i], target[i]), abs=1e-6), (rank, i)
        for i, step in zip(mine, result["sync_step"]["steps"], strict=True):  # the batch gathered over both ranks
            pair = slice(i - rank, i - rank + 2)
            assert step == pytest.approx(reference(preds[pair], target[pair]), abs=1e-6), (rank, i)
