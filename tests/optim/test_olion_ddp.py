"""OLion under DDP: 2 gloo ranks on CPU equal one process on the global batch, bit for
bit, whether the ranks share the Newton–Schulz work (round_robin) or each computes all of it (redundant), through a
state_dict save / load / resume."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import rank_runs, regression_batch, train_steps
from torch import nn

import framework.optim.olion as olion_module
from framework.optim import OLion

torch.set_num_threads(1)
WORLD, STEPS, RESUMED = 2, 3, 2
# (distributed, ns_batch): the loop, the redundant mode, and batched units of two same-shape matrices
CONFIGS = (("round_robin", 1), ("redundant", 1), ("round_robin", 2))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            embed=nn.Linear(8, 32), act0=nn.Tanh(),  # "embed": routed to the AdamW branch (decayed)
            fc1=nn.Linear(32, 32), act1=nn.Tanh(), fc2=nn.Linear(32, 32), act2=nn.Tanh(),
            fc3=nn.Linear(32, 48), act3=nn.Tanh(), fc4=nn.Linear(48, 32), act4=nn.Tanh(),
            fc5=nn.Linear(32, 32), act5=nn.Tanh(), head=nn.Linear(32, 4),
        )
    )  # fmt: skip


def make_opt(named_params, distributed: str, ns_batch: int) -> OLion:
    # fp32 NS so the comparison is exact
    return OLion(named_params, lr=1e-2, ns_dtype=torch.float32, distributed=distributed, ns_batch=ns_batch)


def count_ns_calls() -> list[int]:
    """Wrap OLion's orthogonalize and count the matrices it orthogonalises."""
    calls = [0]
    original = olion_module.orthogonalize

    def counting(x, **kw):
        calls[0] += 1 if x.ndim == 2 else x.shape[0]
        return original(x, **kw)

    olion_module.orthogonalize = counting  # only inside a rank process
    return calls


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        calls = count_ns_calls()
        out = {}
        for distributed, ns_batch in CONFIGS:
            calls[0] = 0
            ddp = DistributedDataParallel(make_model())
            opt = make_opt(ddp.named_parameters(), distributed, ns_batch)
            train_steps(ddp, opt, 0, STEPS, shard=rank, world=WORLD)
            saved = opt.state_dict()
            first_calls = calls[0]
            resumed = DistributedDataParallel(make_model())
            resumed.module.load_state_dict(ddp.module.state_dict())
            opt2 = make_opt(resumed.named_parameters(), distributed, ns_batch)
            opt2.load_state_dict(saved)
            train_steps(resumed, opt2, STEPS, RESUMED, shard=rank, world=WORLD)
            out[f"{distributed}_{ns_batch}"] = {
                "params": resumed.module.state_dict(), "state": opt2.state_dict()["state"], "ns_calls": first_calls
            }
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def single_process_run(distributed: str, ns_batch: int) -> tuple[dict, dict]:
    """One process, whole global batch: the grads are the mean of the two halves' grads, as DDP averages."""
    model = make_model()
    opt = make_opt(model.named_parameters(), distributed, ns_batch)
    for step in range(STEPS + RESUMED):
        halves = []
        for x, y in zip(*(t.chunk(WORLD) for t in regression_batch(step)), strict=True):
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
            halves.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *halves, strict=True):
            p.grad = g0 / 2 + g1 / 2
        opt.step()
    return model.state_dict(), opt.state_dict()["state"]


@pytest.fixture(scope="module")
def rank_results() -> list[dict]:
    """Start the 2-rank runs once and load what each rank saved."""
    return rank_runs(_worker, WORLD, weights_only=True)


@pytest.mark.ddp
@pytest.mark.parametrize(("distributed", "ns_batch"), CONFIGS)
def test_two_gloo_ranks_on_half_batches_equal_one_process_bitwise_through_a_resume(rank_results, distributed,
                                                                                    ns_batch):
    params, state = single_process_run(distributed, ns_batch)
    runs = [r[f"{distributed}_{ns_batch}"] for r in rank_results]
    for name, ref in params.items():  # hidden matrices, the AdamW-routed embed/head and the biases
        for run in runs:
            assert torch.equal(run["params"][name], ref), name
    # every rank holds the momentum of every parameter, so a rank-0 checkpoint is complete
    assert len(state) == len(params)
    for idx, ref in state.items():
        for key, value in ref.items():
            for run in runs:
                assert torch.equal(torch.as_tensor(run["state"][idx][key]), torch.as_tensor(value)), (idx, key)


@pytest.mark.ddp
def test_round_robin_splits_the_newton_schulz_work_and_redundant_repeats_it(rank_results):
    hidden_matrices = 5  # fc1..fc5
    robin = [r["round_robin_1"]["ns_calls"] for r in rank_results]
    redundant = [r["redundant_1"]["ns_calls"] for r in rank_results]
    assert redundant == [hidden_matrices * STEPS] * WORLD
    assert sum(robin) == hidden_matrices * STEPS and all(c > 0 for c in robin), robin
    # costs m·n·min(m,n): fc3 and fc4 (32·48·32) on one rank, fc1, fc2, fc5 (32·32·32) on the other
    assert sorted(robin) == [2 * STEPS, 3 * STEPS]
