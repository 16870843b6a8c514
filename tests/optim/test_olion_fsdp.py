"""OLion on FSDP2-sharded weights: 2 gloo ranks on a CPU device mesh, `fully_shard` DTensor params.

The owner of each matrix orthogonalises the full momentum direction, every rank keeps its shard of the update and of
the momentum; the result equals one unsharded process within fp32 rounding, through a torch.distributed.checkpoint
save and load."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import rank_runs, train_steps
from torch import nn

from framework.optim import OLion

torch.set_num_threads(1)
WORLD, STEPS, RESUMED = 2, 3, 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            embed=nn.Linear(8, 32), act0=nn.Tanh(),
            fc1=nn.Linear(32, 33), act1=nn.Tanh(),  # 33 rows: uneven shards (17 + 16)
            fc2=nn.Linear(33, 32), act2=nn.Tanh(), fc3=nn.Linear(32, 32), act3=nn.Tanh(), head=nn.Linear(32, 4),
        )
    )  # fmt: skip


def make_opt(model: nn.Module, distributed: str = "round_robin") -> OLion:
    return OLion(model.named_parameters(), lr=1e-2, ns_dtype=torch.float32, distributed=distributed)


def sharded_model(mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for module in model:
        if isinstance(module, nn.Linear):
            fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        model = sharded_model(mesh)
        opt = make_opt(model)
        train_steps(model, opt, 0, STEPS, rank, world=WORLD)
        m = opt.state[model.fc1.weight]["momentum_buffer"]
        layout = (isinstance(m, DTensor), tuple(m.placements), tuple(m.to_local().shape))
        after = {n: p.full_tensor() for n, p in model.named_parameters()}

        ckpt = str(Path(out_dir) / "dcp")
        dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
                 checkpoint_id=ckpt)
        model2 = sharded_model(mesh)
        opt2 = make_opt(model2)
        state = {"model": get_model_state_dict(model2), "optim": get_optimizer_state_dict(model2, opt2)}
        dcp.load(state, checkpoint_id=ckpt)
        set_model_state_dict(model2, state["model"])
        set_optimizer_state_dict(model2, opt2, state["optim"])
        loaded_equal = all(
            torch.equal(opt2.state[p2]["momentum_buffer"].to_local(), opt.state[p]["momentum_buffer"].to_local())
            for p, p2 in zip(model.parameters(), model2.parameters(), strict=True) if p in opt.state
            and "momentum_buffer" in opt.state[p]
        )
        train_steps(model2, opt2, STEPS, RESUMED, rank, world=WORLD)
        resumed = {n: p.full_tensor() for n, p in model2.named_parameters()}

        model3 = sharded_model(mesh)
        train_steps(model3, make_opt(model3, "redundant"), 0, STEPS, rank, world=WORLD)
        redundant = {n: p.full_tensor() for n, p in model3.named_parameters()}

        mesh2 = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("replicate", "shard"))
        w = nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh2, [Replicate(), Shard(0)]))
        try:
            OLion([("layer.weight", w)])
            refusal = ""
        except NotImplementedError as err:
            refusal = str(err)
        torch.save({"after": after, "redundant": redundant, "resumed": resumed, "layout": layout,
                    "loaded_equal": loaded_equal, "refusal": refusal}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def rank_results() -> list[dict]:
    """Start the 2-rank runs once and load what each rank saved."""
    return rank_runs(_worker, WORLD, weights_only=False)


def single_process(steps: int) -> dict[str, torch.Tensor]:
    model = make_model()
    train_steps(model, make_opt(model), 0, steps)
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.ddp
@pytest.mark.parametrize("mode", ["after", "redundant"])  # owners gather and broadcast / every rank does all
def test_fully_sharded_olion_equals_one_unsharded_process_within_fp32_rounding(rank_results, mode):
    ref = single_process(STEPS)
    start = dict(make_model().named_parameters())
    for r in rank_results:
        assert r[mode].keys() == ref.keys()
        for name, w in ref.items():
            assert not torch.equal(w, start[name]), name  # every parameter moved
            torch.testing.assert_close(r[mode][name], w, rtol=0, atol=1e-6, msg=name)


@pytest.mark.ddp
def test_momentum_stays_sharded_one_shard_per_rank(rank_results):
    from torch.distributed.tensor import Shard

    assert [r["layout"] for r in rank_results] == [(True, (Shard(0),), (17, 32)), (True, (Shard(0),), (16, 32))]


@pytest.mark.ddp
def test_distributed_checkpoint_round_trip_resumes_like_an_uninterrupted_run(rank_results):
    ref = single_process(STEPS + RESUMED)
    for r in rank_results:
        assert r["loaded_equal"]
        for name, w in ref.items():
            torch.testing.assert_close(r["resumed"][name], w, rtol=0, atol=1e-6, msg=name)


@pytest.mark.ddp
def test_dtensors_on_a_two_dimensional_mesh_are_refused_by_name(rank_results):
    for r in rank_results:
        assert "'layer.weight'" in r["refusal"] and "2-D mesh" in r["refusal"] and "valid: a 1-D mesh" in r["refusal"]


@pytest.mark.slow
@pytest.mark.ddp
def test_lightning_model_parallel_strategy_trains_olion_on_fsdp2_weights_on_cpu(tmp_path):
    """Lightning's ModelParallelStrategy (its FSDP2 strategy) on 2 CPU processes: the script's rank 0 compares the
    final weights with one unsharded process on the same global batches (slow: Lightning launches 2 interpreters)."""
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_olion_lightning_fsdp.py")), str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["param_types"] == ["DTensor"]
    assert max(result["max_abs_diff"].values()) <= 1e-6, result
