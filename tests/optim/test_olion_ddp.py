"""OLion under DDP (spec §1.5, §1.6 T13–T14): 2 gloo ranks on CPU equal one process on the global batch."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from framework.optim import OLion

torch.set_num_threads(1)
WORLD, STEPS = 2, 3


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(8, 32), act1=nn.Tanh(), fc2=nn.Linear(32, 32), act2=nn.Tanh(), head=nn.Linear(32, 4)
        )
    )


def make_opt(named_params) -> OLion:
    return OLion(named_params, lr=1e-2, ns_dtype=torch.float32)  # fp32 NS: the comparison is exact


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        model = make_model()
        ddp = DistributedDataParallel(model)
        opt = make_opt(ddp.named_parameters())
        for step in range(STEPS):
            x, y = (t.chunk(WORLD)[rank] for t in global_batch(step))
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()
        mesh = init_device_mesh("cpu", (WORLD,))
        shard = nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]))
        try:
            OLion([("layer.weight", shard)])
            refusal = ""
        except NotImplementedError as err:
            refusal = str(err)
        torch.save(
            {"params": model.state_dict(), "state": opt.state_dict()["state"], "refusal": refusal},
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def single_process_run() -> tuple[dict, dict]:
    """One process, whole global batch: the grads are the mean of the two halves' grads, as DDP averages."""
    model = make_model()
    opt = make_opt(model.named_parameters())
    for step in range(STEPS):
        halves = []
        for x, y in zip(*(t.chunk(WORLD) for t in global_batch(step)), strict=True):
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
            halves.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *halves, strict=True):
            p.grad = g0 / 2 + g1 / 2
        opt.step()
    return model.state_dict(), opt.state_dict()["state"]


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory) -> list[dict]:
    """Spawn the 2-rank run once (process start-up dominates the cost) and load what each rank saved."""
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(str(out / "init"), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.mark.ddp
def test_two_gloo_ranks_on_half_batches_equal_one_process_on_the_global_batch(rank_results):
    params, state = single_process_run()
    for name, ref in params.items():
        for r in rank_results:
            assert torch.equal(r["params"][name], ref), name
    # every rank holds the momentum of every parameter, so a rank-0 checkpoint is complete
    for idx, ref in state.items():
        for key, value in ref.items():
            for r in rank_results:
                assert torch.equal(torch.as_tensor(r["state"][idx][key]), torch.as_tensor(value)), (idx, key)
    assert len(rank_results[0]["state"]) == len(params)


@pytest.mark.ddp
def test_sharded_dtensor_matrices_are_refused_with_a_clear_error(rank_results):
    for r in rank_results:
        assert "'layer.weight'" in r["refusal"] and "DTensor" in r["refusal"] and "DDP" in r["refusal"]
