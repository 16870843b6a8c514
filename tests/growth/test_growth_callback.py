"""OrthogonalGrowth inside Lightning: optimizer policy and schedule (G10), checkpoint round trip (G11), a run
killed after growth and resumed (bitwise equal to an uninterrupted one), and offline growth → Hub → from_pretrained."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import REPO
from support import warm_cli

from framework.callbacks.growth import OrthogonalGrowth
from framework.checkpointing import CheckpointError, check_checkpoint
from framework.data.text import ByteCorpus
from framework.errors import InputError
from framework.grow.cli import main as grow_main
from framework.models.moe import MoETransformerLM
from framework.modules.causal_lm import CausalLM
from framework.optim import OLion
from framework.optim.schedulers import warmup_cosine
from framework.resume import checked_resume

STEPS, AT = 6, 3


def lm(optimizer: str = "adamw") -> CausalLM:
    torch.manual_seed(0)
    model = MoETransformerLM(vocab_size=256, dim=32, depth=2, heads=2, num_experts=2, top_k=1)
    factory = partial(torch.optim.AdamW, lr=1e-3) if optimizer == "adamw" else partial(OLion, lr=1e-3)
    return CausalLM(model, optimizer=factory, scheduler=partial(warmup_cosine, warmup_steps=2))


def fit(module, callbacks, tmp_path, ckpt_every=0, ckpt_path=None, steps=STEPS):
    if ckpt_every:
        callbacks = [*callbacks, L.pytorch.callbacks.ModelCheckpoint(
            dirpath=tmp_path / "ckpt", filename="step{step}", auto_insert_metric_name=False, save_top_k=-1,
            every_n_train_steps=ckpt_every)]
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=callbacks,
                        enable_checkpointing=bool(ckpt_every), enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        default_root_dir=tmp_path)
    data = ByteCorpus(max_bytes=20000, seq_len=16, batch_size=4, seed=0)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer


class Probe(L.Callback):
    """Records, at every batch start, the optimizer, its lrs and a copy of its state."""

    def __init__(self):
        self.seen = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        opt = trainer.optimizers[0]
        state = {p: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for p, s in opt.state.items()}
        self.seen[trainer.global_step] = {"opt": opt, "lrs": [g["lr"] for g in opt.param_groups], "state": state}


def growth(**kw):
    return OrthogonalGrowth(**{"at_step": AT, "depth_factor": 2, "width_factor": 2, **kw})


# ---- G10 -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["adamw", "olion"])
def test_reset_policy_rebuilds_an_empty_optimizer_over_the_grown_parameters_and_the_schedule_continues(
        optimizer, tmp_path):
    before, after, grown = Probe(), Probe(), lm(optimizer)
    fit(grown, [before, growth(), after], tmp_path)
    baseline = Probe()
    fit(lm(optimizer), [baseline], tmp_path / "plain")
    new = after.seen[AT]["opt"]
    assert new is not before.seen[AT]["opt"] and before.seen[AT]["state"]  # the old optimizer had state
    assert after.seen[AT]["state"] == {}
    params = {p for g in new.param_groups for p in g["params"]}
    assert params == set(grown.model.parameters()) and len(grown.model.blocks) == 4
    assert [after.seen[s]["lrs"] for s in range(STEPS)] == [baseline.seen[s]["lrs"] for s in range(STEPS)]


@pytest.mark.parametrize("optimizer", ["adamw", "olion"])
def test_duplicate_policy_gives_each_copy_the_state_of_its_source(optimizer, tmp_path):
    before, after, module = Probe(), Probe(), lm(optimizer)
    moe = module.model.blocks[1].moe
    src = {"expert": moe.experts[1].fc.weight, "router": moe.router.weight, "embed": module.model.embed.weight}
    fit(module, [before, growth(optimizer_state="duplicate"), after], tmp_path, steps=AT + 1)
    old, new = before.seen[AT]["state"], after.seen[AT]["state"]
    key = "momentum_buffer" if optimizer == "olion" else "exp_avg"
    copy_block = module.model.blocks[3]  # interposition: layers 2, 3 are layer 1 and its copy
    assert module.model.blocks[2].moe.experts[1].fc.weight is src["expert"]
    assert torch.equal(new[copy_block.moe.experts[1].fc.weight][key], old[src["expert"]][key])
    assert torch.equal(new[copy_block.moe.experts[3].fc.weight][key], old[src["expert"]][key])  # its width copy
    assert torch.equal(new[copy_block.moe.router.weight][key], old[src["router"]][key].repeat(2, 1))
    assert torch.equal(new[module.model.embed.weight]["exp_avg"], old[src["embed"]]["exp_avg"])
    assert len(new) == len(list(module.model.parameters()))


def test_bad_policy_and_schedule_values_are_named():
    with pytest.raises(ValueError, match="optimizer_state='keep' is invalid; valid: reset, duplicate"):
        OrthogonalGrowth(at_step=1, optimizer_state="keep")
    with pytest.raises(ValueError, match="set exactly one of at_step or at_epoch"):
        OrthogonalGrowth(depth_factor=2)
    with pytest.raises(ValueError, match=r"at_step values \[5, 2\] must be in growth order"):
        OrthogonalGrowth(schedule=[{"at_step": 5}, {"at_step": 2}])
    with pytest.raises(ValueError, match=r"schedule\[1\] has unknown keys \['width'\]"):
        OrthogonalGrowth(schedule=[{"at_step": 1}, {"at_step": 2, "width": 2}])


def test_a_schedule_grows_depth_then_width_at_their_own_steps(tmp_path):
    module = lm()
    cb = OrthogonalGrowth(schedule=[{"at_step": 1, "depth_factor": 2}, {"at_step": 3, "width_factor": 2}])
    fit(module, [cb], tmp_path, steps=4)
    assert [r["global_step"] for r in cb.done] == [1, 3]
    assert module.model.init_config == {**module.model.init_config, "depth": 4, "num_experts": 4, "top_k": 2}
    assert json.loads((tmp_path / "growth.json").read_text())[1]["measured"]["layers_after"] == 4
    assert (tmp_path / "growth_norm_profile.png").stat().st_size > 0


class CriterionLM(L.LightningModule):
    """A plain LightningModule whose `loss` is a criterion (input, target), not a method taking a batch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = MoETransformerLM(vocab_size=256, dim=32, depth=2, heads=2, num_experts=2, top_k=1)
        self.loss = torch.nn.CrossEntropyLoss()

    def next_token_loss(self, batch):
        return self.loss(self.model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())

    def training_step(self, batch, batch_idx):
        return self.next_token_loss(batch) + self.model.pop_aux_loss()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def test_a_criterion_named_loss_is_refused_before_training_with_a_message_naming_loss_fn(tmp_path):
    module = CriterionLM()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(TypeError, match=r"CriterionLM\.loss \(CrossEntropyLoss\).*loss_fn=lambda module, batch"):
        fit(module, [growth()], tmp_path)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # refused before any step
    with pytest.raises(TypeError, match="loss_fn=3 must be a function"):
        OrthogonalGrowth(at_step=1, loss_fn=3)


def test_loss_fn_measures_growth_on_a_module_whose_loss_is_a_criterion(tmp_path):
    calls = []

    def measured_loss(module, batch):
        value = module.next_token_loss(batch)
        calls.append((module.training, float(value)))
        return value

    module = CriterionLM()
    cb = growth(loss_fn=measured_loss, noise_alpha=0.0)
    fit(module, [cb], tmp_path)
    measured = cb.done[0]["measured"]
    assert len(calls) == 2 and not any(training for training, _ in calls)  # before and after, in eval mode
    assert measured["loss_before"] == calls[0][1] and measured["loss_after"] == calls[1][1]
    assert measured["layers_after"] == 4
    # the same loss by name: a method taking a batch
    named = growth(loss_fn="next_token_loss", noise_alpha=0.0)
    fit(CriterionLM(), [named], tmp_path / "named")
    assert named.done[0]["measured"]["loss_before"] == pytest.approx(calls[0][1], abs=0)


# ---- G11 -------------------------------------------------------------------------------------------------
def test_a_post_growth_checkpoint_loads_into_a_fresh_ungrown_module_with_strict_keys(tmp_path):
    module = lm()
    fit(module, [growth(zero_init_copies=True)], tmp_path, ckpt_every=1)
    ckpt = torch.load(tmp_path / "ckpt" / f"step{AT + 1}.ckpt", weights_only=True)
    config = ckpt["orthogonal_growth"]["config"]
    assert (config["depth"], config["num_experts"], config["top_k"]) == (4, 4, 2)
    rebuilt = MoETransformerLM(**config)
    rebuilt.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}, strict=True)
    small = lm()
    step, _ = checked_resume(str(tmp_path / "ckpt" / f"step{AT + 1}.ckpt"), small, tmp_path)  # replays the growth
    assert step == AT + 1 and len(small.model.blocks) == 2  # ... on a meta-device copy: the module is untouched
    with pytest.raises(CheckpointError, match="saved from a different model"):  # the reader alone compares as given
        check_checkpoint(tmp_path / "ckpt" / f"step{AT + 1}.ckpt", small)
    other = CausalLM(MoETransformerLM(vocab_size=256, dim=48, depth=2, heads=2, num_experts=2, top_k=1))
    with pytest.raises(InputError, match="saved from a different model"):
        checked_resume(str(tmp_path / "ckpt" / f"step{AT + 1}.ckpt"), other, tmp_path)
    fresh, cb = lm(), growth(zero_init_copies=True)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[cb], enable_progress_bar=False,
                        limit_val_batches=1, enable_model_summary=False)
    trainer.validate(fresh, datamodule=ByteCorpus(max_bytes=20000, seq_len=16, batch_size=4),
                     ckpt_path=tmp_path / "ckpt" / f"step{AT + 1}.ckpt", verbose=False)
    assert len(fresh.model.blocks) == 4 and cb.done and cb.done[0]["global_step"] == AT
    assert all(torch.equal(v, ckpt["state_dict"][k]) for k, v in fresh.state_dict().items())
    pre = lm()
    trainer.validate(pre, datamodule=ByteCorpus(max_bytes=20000, seq_len=16, batch_size=4),
                     ckpt_path=tmp_path / "ckpt" / f"step{AT}.ckpt", verbose=False)
    assert len(pre.model.blocks) == 2  # a checkpoint from before the growth loads into the small model


# ---- killed after growth, resumed: same weights as an uninterrupted run -----------------------------------------
ARGS = ["recipe=moe_growth", "threads=1", "trainer.max_steps=12", "trainer.val_check_interval=null",
        "trainer.limit_val_batches=0", "validate_before_fit=false", "callbacks.orthogonal_growth.measure_batches=0",
        "trainer.enable_progress_bar=false", "data.max_bytes=60000", "data.seq_len=32",
        "data.batch_size=8", "model.dim=32", "model.depth=1", "model.heads=2", "model.num_experts=2",
        f"callbacks.orthogonal_growth.at_step={AT}", "callbacks.orthogonal_growth.optimizer_state=duplicate",
        "callbacks.checkpoint.every_n_train_steps=1", "callbacks.checkpoint.save_top_k=-1"]


def cli(*args):
    """`python -m framework.train ARGS` and its environment (run by `warm_cli`: the imports done once)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return [sys.executable, "-m", "framework.train", *args], env


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full")
    cmd, env = cli(*ARGS, f"hydra.run.dir={run_dir}")
    proc = warm_cli.run("framework.train", cmd[3:], env, REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def weights(path: Path) -> dict:
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


def test_a_run_killed_after_growth_resumes_to_the_same_weights_as_an_uninterrupted_one(full_run, tmp_path):
    killed, resumed = tmp_path / "killed", tmp_path / "resumed"
    cmd, env = cli(*ARGS, f"hydra.run.dir={killed}")
    proc = warm_cli.popen("framework.train", cmd[3:], env, REPO)
    mid = killed / "checkpoints" / f"step{AT + 3:06d}.ckpt"
    try:
        deadline = time.time() + 300
        while not (killed / "checkpoints" / f"step{AT + 4:06d}.ckpt").exists():  # the next one: `mid` is complete
            assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (killed / "results.json").exists()
    assert len([k for k in weights(mid) if k.endswith("fc.weight")]) == 2 * 4  # grown: 2 layers × 4 experts
    cmd, env = cli(*ARGS, f"ckpt_path={mid}", f"hydra.run.dir={resumed}")
    done = warm_cli.run("framework.train", cmd[3:], env, REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = weights(full_run / "checkpoints" / "last.ckpt"), weights(resumed / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    assert not all(torch.equal(a[k], weights(mid)[k]) for k in a)
    results = json.loads((resumed / "results.json").read_text())
    assert results["global_step"] == 12 and results["metrics"]["growth/layers_after"] == 2
    spec = json.loads((resumed / "model_config.json").read_text())
    assert (spec["config"]["depth"], spec["config"]["num_experts"], spec["config"]["top_k"]) == (2, 4, 2)


# ---- offline growth: the output is pushable and loads back with from_pretrained --------------------------------
def test_offline_growth_output_pushes_to_the_hub_and_loads_back_with_from_pretrained(full_run, tmp_path):
    from support.local_hub import LocalHub, patch_client

    from framework.hub import from_pretrained, push_to_hub

    out = tmp_path / "grown"
    assert grow_main([str(full_run), "--depth", "2", "--width", "2", "--zero-init", "--alpha", "0", "--out",
                      str(out)]) == 0
    spec = json.loads((full_run / "model_config.json").read_text())
    small = MoETransformerLM(**spec["config"]).eval()
    small.load_state_dict({k.removeprefix("model."): v for k, v in weights(full_run / "checkpoints" / "last.ckpt")
                           .items()})
    config = json.loads((out / "config.json").read_text())
    assert (config["config"]["depth"], config["config"]["num_experts"], config["config"]["top_k"]) == (4, 8, 4)
    with LocalHub(tmp_path / "hub") as hub, patch_client(hub.url, tmp_path / "cache", token="dummy"):
        push_to_hub(out, "local-user/grown-moe")
        grown = from_pretrained("local-user/grown-moe")
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    assert len(grown.blocks) == 4 and rel_err(grown(x), small(x)) < 1e-5  # zero-init + α = 0: the same function
    assert grow_main(["no/such-dir.ckpt", "--out", str(tmp_path / "x")]) == 2


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.slow
def test_growth_under_ddp_keeps_the_two_ranks_identical(tmp_path):
    cmd, env = cli(*ARGS[:-2], "trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu",
                   "trainer.limit_val_batches=2",
                   f"hydra.run.dir={tmp_path}")
    proc = warm_cli.run("framework.train", cmd[3:], env, REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / name).read_text())["metrics"] for name in ("results.json", "results.rank1.json")]
    assert ranks[0]["val/loss"] == ranks[1]["val/loss"]  # same weights after growth and 9 more synced steps
    assert ranks[0]["growth/layers_after"] == ranks[1]["growth/layers_after"] == 2
    assert json.loads((tmp_path / "model_config.json").read_text())["config"]["num_experts"] == 4
