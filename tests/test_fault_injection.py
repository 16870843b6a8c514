"""Every recipe, killed with SIGKILL mid-training and resumed from its last checkpoint, ends bitwise equal to an
uninterrupted run: weights, optimizer state (OLion momentum included) and the callbacks' states. One small case
per recipe runs by default; the longer runs killed at a random step are marked `slow` (`make test-slow`)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from helpers import REPO

from framework.recipe import SMOKE
from framework.registry import RECIPES

KILL = ["+callbacks.kill._target_=framework.testing.faults.KillAtStep"]


def _start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "framework.train", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen, timeout: int = 600) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def _state(ckpt: Path) -> dict:
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)
    return {"state_dict": raw["state_dict"], "optimizer_states": raw.get("optimizer_states", []),
            "callbacks": {k: v for k, v in raw.get("callbacks", {}).items() if not k.startswith("ModelCheckpoint")},
            "global_step": raw["global_step"]}  # (ModelCheckpoint's state holds its run dir's paths)


def _assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), f"differs at {where}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"keys differ at {where}: {set(a) ^ set(b)}"
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"lengths differ at {where}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, f"differs at {where}"
    else:
        assert a == b, f"differs at {where}: {a!r} vs {b!r}"


@pytest.mark.parametrize("name", RECIPES.names())
def test_recipe_runs_and_a_sigkilled_run_resumes_bitwise_equal(tmp_path, name):
    assert name in SMOKE, f"recipe {name} declares no smoke= overrides (framework.recipe.recipe(..., smoke=[...]))"
    args = [f"recipe={name}", *SMOKE[name], "callbacks.checkpoint.every_n_train_steps=1"]
    steps = next(int(a.split("=")[1]) for a in args[::-1] if a.startswith("trainer.max_steps="))
    kill_at = 1 + zlib.crc32(name.encode()) % (steps - 1)  # a fixed "random" step per recipe, after a checkpoint
    full, cut = tmp_path / "full", tmp_path / "cut"
    ref = _start([*args, f"hydra.run.dir={full}"])  # the two run side by side, one thread each
    killed = _start([*args, *KILL, f"+callbacks.kill.step={kill_at}", f"hydra.run.dir={cut}"])
    (code, err), (kcode, kerr) = _finish(ref), _finish(killed)

    assert code == 0, err[-3000:]
    results = json.loads((full / "results.json").read_text())  # the smoke run's own checks
    assert results["recipe"] == name and results["global_step"] == steps
    assert (full / ".hydra" / "config.yaml").exists() and (full / "csv" / "metrics.csv").exists()
    assert kcode == -9, f"the killed run was not killed by SIGKILL (exit {kcode}):\n{kerr[-3000:]}"
    assert _state(cut / "checkpoints" / "last.ckpt")["global_step"] == kill_at
    assert not (cut / "results.json").exists()

    resumed = tmp_path / "resumed"
    code, err = _finish(_start([*args, f"ckpt_path={cut / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={resumed}"]))
    assert code == 0, err[-3000:]
    a, b = _state(full / "checkpoints" / "last.ckpt"), _state(resumed / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == steps
    _assert_same(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES.names())
def test_a_longer_run_killed_at_a_random_step_resumes_bitwise_equal(tmp_path, name):
    """40 steps (several epochs of the smallest datasets, validation every 10), killed at a step drawn at random
    (seeded by the recipe's name and FAULT_SEED, printed on failure), resumed, compared bitwise."""
    seed = os.environ.get("FAULT_SEED", "0")
    steps = 40
    kill_at = random.Random(f"{name}/{seed}").randrange(2, steps)
    args = [f"recipe={name}", *SMOKE[name], f"trainer.max_steps={steps}", "trainer.val_check_interval=10",
            "callbacks.checkpoint.every_n_train_steps=1"]
    full, cut, resumed = tmp_path / "full", tmp_path / "cut", tmp_path / "resumed"
    ref = _start([*args, f"hydra.run.dir={full}"])
    killed = _start([*args, *KILL, f"+callbacks.kill.step={kill_at}", f"hydra.run.dir={cut}"])
    (code, err), (kcode, kerr) = _finish(ref, timeout=1800), _finish(killed, timeout=1800)
    where = f"(kill at step {kill_at}, FAULT_SEED={seed})"
    assert code == 0, err[-3000:]
    assert kcode == -9, f"not killed by SIGKILL {where} (exit {kcode}):\n{kerr[-3000:]}"
    assert _state(cut / "checkpoints" / "last.ckpt")["global_step"] == kill_at
    code, err = _finish(_start([*args, f"ckpt_path={cut / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={resumed}"]),
                        timeout=1800)
    assert code == 0, f"{where}\n{err[-3000:]}"
    a, b = _state(full / "checkpoints" / "last.ckpt"), _state(resumed / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == steps, where
    _assert_same(a, b, where)
