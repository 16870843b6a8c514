"""`trainer.strategy=fsdp2`: the registered FSDP2 strategy, the modules' `configure_model()` sharding, and a CLI run
on 2 CPU processes (gloo) that trains OLion on sharded weights with an EMA copy, resumes bitwise, and stops a
diverging run with one error line."""

from __future__ import annotations

import re
import socket

import pytest
import torch
import torch.distributed as dist
from helpers import assert_resume_is_exact, run_cli
from lightning.pytorch.strategies import StrategyRegistry
from torch import nn

from framework.models.transformer import TransformerLM
from framework.modules.causal_lm import CausalLM
from framework.modules.mdlm import MDLMModule
from framework.strategies import FSDP2Strategy, reshard, shard


@pytest.fixture
def one_rank_mesh(monkeypatch):
    """A 1-process gloo group and its 1-D CPU device mesh (FSDP2 shards over it like over many ranks)."""
    from torch.distributed.device_mesh import init_device_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
    finally:
        dist.destroy_process_group()


def _lm(**kw) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(vocab_size=11, dim=16, depth=2, heads=2, max_seq_len=8, **kw)


def _param_types(module: nn.Module) -> set[str]:
    return {type(p).__name__ for p in module.parameters()}


def test_fsdp2_is_a_registered_strategy_name_with_data_parallel_defaults():
    assert "fsdp2" in StrategyRegistry
    strategy = StrategyRegistry.get("fsdp2")
    assert isinstance(strategy, FSDP2Strategy)
    assert strategy._tensor_parallel_size == 1 and strategy._save_distributed_checkpoint is False
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2: .* valid: 1"):
        FSDP2Strategy(tensor_parallel_size=2)


def test_configure_model_shards_each_block_then_the_model_and_only_under_a_mesh(one_rank_mesh):
    from torch.distributed.fsdp import FSDPModule

    lm = CausalLM(model=_lm())
    lm.configure_model()  # no device mesh (every strategy but fsdp2): nothing happens
    assert _param_types(lm.model) == {"Parameter"}

    lm._device_mesh = one_rank_mesh
    lm.configure_model()
    assert _param_types(lm.model) == {"DTensor"}
    assert [isinstance(b, FSDPModule) for b in lm.model.blocks] == [True, True] and isinstance(lm.model, FSDPModule)
    before = {n: id(p) for n, p in lm.model.named_parameters()}
    lm.configure_model()  # Lightning calls it again for each validate/fit/test: the model is left as it is
    assert {n: id(p) for n, p in lm.model.named_parameters()} == before


def test_an_evaluated_ema_copy_is_resharded_before_its_update(one_rank_mesh):
    """FSDP2 keeps the root's weights gathered after a forward with no backward; the EMA update must not meet them."""
    lm = MDLMModule(model=_lm(causal=False), mask_id=10, ema_decay=0.5)
    lm.setup("fit")
    lm._device_mesh = one_rank_mesh
    lm.configure_model()
    assert _param_types(lm.ema) == {"DTensor"}
    with torch.no_grad():
        lm.ema(torch.zeros(2, 8, dtype=torch.long))
    assert "Parameter" in _param_types(lm.ema)  # what the EMA update would have met
    target = {n: p.full_tensor().clone() for n, p in lm.model.named_parameters()}
    with torch.no_grad():
        for p in lm.model.parameters():
            p.add_(1.0)
    lm.update_ema()
    assert _param_types(lm.ema) == {"DTensor"}
    for n, e in lm.ema.named_parameters():  # decay 0.5 towards the moved weights: old + 0.5
        torch.testing.assert_close(e.full_tensor(), target[n] + 0.5)
    reshard(nn.Linear(2, 2))  # a module that is not sharded: nothing to do


def test_shard_refuses_a_two_dimensional_mesh():
    class FakeMesh:
        ndim, mesh_dim_names = 2, ("data_parallel", "tensor_parallel")

    with pytest.raises(ValueError, match="1-D data-parallel mesh, got 2 dims"):
        shard(_lm(), FakeMesh())


FSDP2 = ["recipe=mdlm_text", "size=smoke", "optimizer=olion", "trainer.strategy=fsdp2", "trainer.devices=2",
         "trainer.accelerator=cpu", "trainer.max_steps=4", "threads=1"]


@pytest.mark.slow  # ~20 s; make test: the README's FSDP2 line with OLion (test_readme_commands) and the EMA's
# resharding above, in process
def test_the_cli_trains_olion_on_fsdp2_weights_with_ema_and_resumes_bitwise(tmp_path):
    """2 gloo processes: the run's checkpoint is one full file (EMA copy included); resumed from step 2 it ends
    bitwise equal to the uninterrupted run."""
    full = assert_resume_is_exact(run_cli, FSDP2, tmp_path, resume_step=2)
    state = torch.load(full / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert any(k.startswith("ema.") for k in state) and all(type(v) is torch.Tensor for v in state.values())


# make test-slow: make test stops a DDP run whose rank goes non-finite (callbacks/test_guard_cli.py)
@pytest.mark.slow
def test_a_diverging_fsdp2_run_stops_with_one_error_line(tmp_path):
    proc = run_cli(*FSDP2, "optimizer.lr=1e6", "optimizer.adamw_lr=null", f"hydra.run.dir={tmp_path}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(errors) == 1 and "start again with a lower learning rate" in errors[0], proc.stderr[-3000:]


REFUSED = [  # (recipe, what the one error line says): FSDP2 would leave trained parameters unsynchronised, or
    # the callback cannot run on sharded weights
    ("rlkv_probe", r"module RLKVProbe trains parameters outside the model FSDP2 shards \(gates\), .* use "
                   r"trainer\.strategy=ddp"),
    ("gicdm_eval", r"module MetricEval does not shard itself for FSDP2 .* use trainer\.strategy=ddp"),
    ("moe_growth", r"callbacks\.orthogonal_growth: OrthogonalGrowth grows unsharded models .* not under FSDP2Strategy"),
]


@pytest.mark.parametrize(("recipe", "expected"), REFUSED, ids=[r for r, _ in REFUSED])
def test_a_recipe_fsdp2_cannot_run_is_refused_in_one_line_before_anything_is_written(recipe, expected, tmp_path,
                                                                                     capsys):
    from framework.cli import check_command_line
    from framework.errors import report_and_exit

    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        report_and_exit(check_command_line, [f"recipe={recipe}", "trainer.strategy=fsdp2", "trainer.devices=2",
                            "trainer.accelerator=cpu", f"hydra.run.dir={run_dir}"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert re.fullmatch(f"error: trainer\\.strategy=fsdp2: {expected}.*", err), err
    assert not run_dir.exists()
