"""Every recipe, in bf16-mixed, killed with SIGKILL mid-training and resumed from its last checkpoint, ends bitwise
equal to an uninterrupted run: weights, optimizer state (OLion momentum included) and the callbacks' states. One small
case per kind of module runs by default (every recipe trains in bf16 by default); the small case of every other
recipe and the longer runs killed at a random step are marked `slow` (`make test-slow`)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import zlib
from pathlib import Path

import pytest
import torch
from helpers import KILL
from helpers import assert_same_state as _assert_same
from helpers import finish as _finish
from helpers import start_cli as _start
from helpers import train_state as _state

from framework.recipe import SMOKE
from framework.registry import RECIPES

# In every `make test`, the SIGKILL/resume check runs for the recipes whose module has no other bitwise-resume test
# there: the flagship MDLM with its extra loss, the RLKV probe and the GICDM evaluation. The causal LM (test_train_cli,
# test_scheduler), Data Agent selection (callbacks/test_data_agent_cli) and MoE growth (growth/test_growth_callback)
# are resumed bitwise by their own tests; they and every other recipe run it in `make test-slow` and, by default,
# train in bf16 to finite metrics (one process instead of three), to keep the suite short.
KILLED_BY_DEFAULT = ("mdlm_mask_agnostic",)  # the others train in bf16 in make test, and are killed in make test-slow


#: recipes whose default model and data are Hub ids (recipe=sft: a chat model and a chat dataset), served by tiny
#: stand-ins under those ids on the local Hub; their make-test run is tests/hf/test_sft_cli.py's, so here slow only
ON_THE_HUB = ("sft",)
#: recipes whose bf16 run is in make test-slow only: each shares its module, model family and data kind with a recipe
#: that trains in bf16 in make test (char_lm, pointer_chase_lm: olion_char_lm's causal LM; mdlm_*: mdlm_mask_agnostic's
#: bf16 resume below; moe_growth_scratch: moe_growth; selection_compare: data_agent_digits' classifier and sampler)
BF16_IN_SLOW = ("char_lm", "pointer_chase_lm", "mdlm_baseline", "mdlm_kv_recall", "mdlm_text", "moe_growth_scratch",
                "selection_compare")


def _kill_params() -> list:
    return [name if name in KILLED_BY_DEFAULT else pytest.param(name, marks=pytest.mark.slow)
            for name in RECIPES.names()]


def _env(request, name: str) -> dict | None:
    """The environment a recipe's CLI needs: the local Hub with the stand-ins for a recipe in ON_THE_HUB."""
    if name not in ON_THE_HUB:
        return None
    from support.stand_ins import serve_chat

    hub = request.getfixturevalue("hub")
    serve_chat(hub.api)
    return {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(hub.root / "hf_home")}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ON_THE_HUB + BF16_IN_SLOW else n
                                  for n in RECIPES.names() if n not in KILLED_BY_DEFAULT])
def test_every_other_recipe_trains_in_bf16_to_finite_metrics(tmp_path, name, request):
    args = [f"recipe={name}", *SMOKE[name], "trainer.precision=bf16-mixed", f"hydra.run.dir={tmp_path}"]
    code, err = _finish(_start(args, _env(request, name)))
    assert code == 0, err[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["recipe"] == name and results["global_step"] > 0
    assert results["metrics"] and all(math.isfinite(v) for v in results["metrics"].values()), results["metrics"]
    assert "trainer.precision=bf16-mixed" in results["command"]


@pytest.mark.parametrize("name", _kill_params())
def test_recipe_runs_in_bf16_and_a_sigkilled_run_resumes_bitwise_equal(tmp_path, name, request):
    """In bf16-mixed (native on CPUs with bf16 kernels, emulated elsewhere; what a GPU run uses): the weights and
    optimizer state stay fp32, so resuming is exact in it as in fp32 (char_lm's fp32 resume: test_scheduler)."""
    assert name in SMOKE, f"recipe {name} has no smoke size (conf/size/smoke.yaml, conf/preset/{name}/smoke.yaml)"
    args = [f"recipe={name}", *SMOKE[name], "callbacks.checkpoint.every_n_train_steps=1",
            "trainer.precision=bf16-mixed"]
    steps = next(int(a.split("=")[1]) for a in args[::-1] if a.startswith("trainer.max_steps="))
    kill_at = 1 + zlib.crc32(name.encode()) % (steps - 1)  # a fixed "random" step per recipe, after a checkpoint
    full, cut, env = tmp_path / "full", tmp_path / "cut", _env(request, name)
    ref = _start([*args, f"hydra.run.dir={full}"], env)  # the two run side by side, one thread each
    killed = _start([*args, *KILL, f"+callbacks.kill.step={kill_at}", f"hydra.run.dir={cut}"], env)
    (code, err), (kcode, kerr) = _finish(ref), _finish(killed)

    assert code == 0, err[-3000:]
    results = json.loads((full / "results.json").read_text())  # the smoke run's own checks
    assert results["recipe"] == name and results["global_step"] == steps
    assert results["metrics"] and all(math.isfinite(v) for v in results["metrics"].values()), results["metrics"]
    assert (full / ".hydra" / "config.yaml").exists() and (full / "csv" / "metrics.csv").exists()
    assert kcode == -9, f"the killed run was not killed by SIGKILL (exit {kcode}):\n{kerr[-3000:]}"
    assert _state(cut / "checkpoints" / "last.ckpt")["global_step"] == kill_at
    assert not (cut / "results.json").exists()

    resumed = tmp_path / "resumed"
    code, err = _finish(_start([*args, f"ckpt_path={cut / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={resumed}"],
                               env))
    assert code == 0, err[-3000:]
    a, b = _state(full / "checkpoints" / "last.ckpt"), _state(resumed / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == steps
    _assert_same(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES.names())
def test_a_longer_run_killed_at_a_random_step_resumes_bitwise_equal(tmp_path, name, request):
    """40 steps (several epochs of the smallest datasets, validation every 10), killed at a step drawn at random
    (seeded by the recipe's name and FAULT_SEED, printed on failure), resumed, compared bitwise."""
    seed = os.environ.get("FAULT_SEED", "0")
    steps = 40
    kill_at = random.Random(f"{name}/{seed}").randrange(2, steps)
    args = [f"recipe={name}", *SMOKE[name], f"trainer.max_steps={steps}", "trainer.val_check_interval=10",
            "callbacks.checkpoint.every_n_train_steps=1"]
    full, cut, resumed, env = tmp_path / "full", tmp_path / "cut", tmp_path / "resumed", _env(request, name)
    ref = _start([*args, f"hydra.run.dir={full}"], env)
    killed = _start([*args, *KILL, f"+callbacks.kill.step={kill_at}", f"hydra.run.dir={cut}"], env)
    (code, err), (kcode, kerr) = _finish(ref, timeout=1800), _finish(killed, timeout=1800)
    where = f"(kill at step {kill_at}, FAULT_SEED={seed})"
    assert code == 0, err[-3000:]
    assert kcode == -9, f"not killed by SIGKILL {where} (exit {kcode}):\n{kerr[-3000:]}"
    assert _state(cut / "checkpoints" / "last.ckpt")["global_step"] == kill_at
    code, err = _finish(_start([*args, f"ckpt_path={cut / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={resumed}"],
                               env), timeout=1800)
    assert code == 0, f"{where}\n{err[-3000:]}"
    a, b = _state(full / "checkpoints" / "last.ckpt"), _state(resumed / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == steps, where
    _assert_same(a, b, where)


# ---- a run that diverges, resumed in place with the command its error printed ---------------------------------
DIVERGE = ["recipe=char_lm", *SMOKE["char_lm"], "trainer.val_check_interval=4", "trainer.log_every_n_steps=1",
           "callbacks.checkpoint.every_n_train_steps=1", "callbacks.checkpoint.save_top_k=-1"]  # every step's file kept


def _all_finite(folder: Path) -> dict[str, int]:
    """{file: global step} of every checkpoint in `folder`, after checking each tensor in each is finite."""
    from framework.checkpointing import checkpoint_non_finite

    steps = {}
    for path in sorted(folder.glob("*.ckpt")):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        assert checkpoint_non_finite(ckpt)[0] == [], path.name
        steps[path.name] = ckpt["global_step"]
    return steps


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """`run`: killed (SIGKILL) after 6 healthy steps of 12, resumed in place with optimizer.lr=1e6 (diverges), then
    resumed in place with the printed command at the recipe's lr; `ref`: the same 12 steps uninterrupted."""
    root = tmp_path_factory.mktemp("diverged")
    run, ref = root / "run", root / "ref"
    reference = _start([*DIVERGE, "trainer.max_steps=12", f"hydra.run.dir={ref}"])  # runs beside the other three
    kcode, kerr = _finish(_start([*DIVERGE, "trainer.max_steps=12", *KILL, "+callbacks.kill.step=6",
                                  f"hydra.run.dir={run}"]))
    assert kcode == -9, kerr[-3000:]
    bad = _finish(_start([*DIVERGE, "trainer.max_steps=12", "optimizer.lr=1e6",
                          f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={run}"]))
    code, err = _finish(reference)
    assert code == 0, err[-3000:]
    after_divergence = _all_finite(run / "checkpoints")
    printed = re.search(r"resume with a lower learning rate: python -m framework\.train (.*?ckpt_path=\S+)\)", bad[1])
    assert printed, bad[1][-3000:]
    resume = shlex.split(printed.group(1))
    again = _finish(_start([a if not a.startswith("optimizer.lr=") else "optimizer.lr=0.003" for a in resume]))
    return {"run": run, "ref": ref, "bad": bad, "after_divergence": after_divergence, "resume": resume,
            "again": again}


def test_a_diverging_run_writes_only_finite_checkpoints_and_prints_a_resume_command(diverged):
    code, err = diverged["bad"]
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert "resuming with lr 1e+06 instead of the checkpoint's 0.003" in err  # the command line's lr was applied
    assert re.search(r"error: training loss is \S+ at step \d+.*the last good checkpoint is .*step000006\.ckpt", err)
    steps = diverged["after_divergence"]
    assert steps["last.ckpt"] == max(steps.values()) > 6  # it ran on, and every file it wrote is finite
    good = diverged["run"] / "checkpoints" / "step000006.ckpt"  # the last one from before the divergence
    assert diverged["resume"][-3:] == [f"hydra.run.dir={diverged['run']}", "optimizer.lr=1e+05", f"ckpt_path={good}"]


def test_the_printed_command_with_a_lower_lr_resumes_in_place_and_ends_as_an_uninterrupted_run(diverged):
    code, err = diverged["again"]
    assert code == 0, err[-3000:]
    run, ref = diverged["run"], diverged["ref"]
    results = json.loads((run / "results.json").read_text())
    assert results["global_step"] == 12 and results["resumed_from"] == str(run / "checkpoints" / "step000006.ckpt")
    assert all(v == v for v in results["metrics"].values())  # finite: NaN is how results.json spells non-finite
    _assert_same(_state(ref / "checkpoints" / "last.ckpt"), _state(run / "checkpoints" / "last.ckpt"))


def test_an_in_place_resume_keeps_last_ckpt_newest_and_appends_to_the_metrics_csv(diverged):
    run, ref = diverged["run"], diverged["ref"]
    steps = _all_finite(run / "checkpoints")
    assert sorted(steps) == ["last.ckpt"] + [f"step{i:06d}.ckpt" for i in range(1, 13)]  # no last-v1.ckpt, no -v1
    assert steps["last.ckpt"] == 12
    # the rows from before the resumed step are kept, the diverged ones replaced: the file an uninterrupted run writes
    assert (run / "csv" / "metrics.csv").read_text() == (ref / "csv" / "metrics.csv").read_text()
