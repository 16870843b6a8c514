"""Helpers shared by the tests: run the real CLI, check exact resume."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from support import warm_cli

REPO = Path(__file__).resolve().parents[1]
GUIDES = REPO / "docs" / "guides"


def guide(name: str) -> str:
    """The text of the task guide docs/guides/NAME.md (its commands are run as printed by the tests that read it)."""
    return (GUIDES / f"{name}.md").read_text()


def run_cli(*args: str, module: str = "framework.train", timeout: int = 600, env: dict | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m MODULE ARGS` the way a user would; returns the finished process (text output). The train CLI
    runs in a child forked from a process that has done its imports (`support.warm_cli`)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return warm_cli.run(module, list(args), full_env, cwd or REPO, timeout=timeout)


def _weights(ckpt: Path) -> dict:
    return torch.load(ckpt, weights_only=True, map_location="cpu")["state_dict"]


def assert_resume_is_exact(cli, args: list[str], tmp_path: Path, resume_step: int) -> Path:
    """Run `args` once straight through and once resumed from its step-`resume_step` checkpoint: the final
    weights must be bitwise equal (and must have moved since the resume point). Returns the full run's dir."""
    args = [*args, "callbacks.checkpoint.every_n_train_steps=1", "callbacks.checkpoint.save_top_k=-1"]
    full, part = tmp_path / "full", tmp_path / "resumed"
    proc = cli(*args, f"hydra.run.dir={full}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    mid = full / "checkpoints" / f"step{resume_step:06d}.ckpt"
    proc = cli(*args, f"ckpt_path={mid}", f"hydra.run.dir={part}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _weights(full / "checkpoints" / "last.ckpt"), _weights(part / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert not all(torch.equal(a[k], _weights(mid)[k]) for k in a)
    return full


def regression_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step` in the distributed optimizer tests (16 rows, 8 inputs, 4 targets)."""
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)


def train_steps(model, opt, first: int, steps: int, shard: int | None = None, world: int = 2) -> None:
    """MSE steps `first .. first+steps-1` on `regression_batch`; with `shard`, on that rank's 1/world of it."""
    import torch.nn.functional as F

    for step in range(first, first + steps):
        x, y = regression_batch(step)
        if shard is not None:
            x, y = x.chunk(world)[shard], y.chunk(world)[shard]
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def rank_runs(worker, world: int, weights_only: bool = True) -> list[dict]:
    """Run `worker(rank, init_file, out_dir)` in `world` forked processes (fork: the ranks inherit the imports) and
    load what each saved as `out_dir/rank{r}.pt`."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, args=(str(Path(tmp) / "init"), tmp), nprocs=world, join=True, start_method="fork")
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=weights_only) for r in range(world)]


def assert_greedy_up_to_rounding(model, prompt: torch.Tensor, tokens: torch.Tensor, rel: float = 2e-4,
                                 **forward) -> None:
    """`tokens`, decoded greedily after `prompt` (through a KV cache or not), are the argmaxes of `model`'s full
    forward over prompt + tokens (`forward`: its gates and window) up to near-ties: each chosen logit is within `rel`
    of its row's largest |logit| of the row's maximum. A cache and the full forward run different attention kernels,
    whose fp32 logits differ by rounding (≤ 3e-5 of that scale in tests/probes' sharpened models), and some greedy
    choices there are closer than that: exact token equality would depend on the CPU."""
    with torch.no_grad():
        logits = model(torch.cat([prompt, tokens], dim=1), **forward)[:, prompt.shape[1] - 1 : -1]
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert bool((chosen >= logits.amax(-1) - rel * logits.abs().amax(-1)).all())


#: far more steps than a smoke-sized run takes before its first checkpoint: a run given them is still going when a
#: signal sent after `wait_for_a_checkpoint` arrives
ENDLESS_STEPS = 1_000_000


def wait_for_a_checkpoint(proc, run_dir: Path, timeout: float = 240) -> None:
    """Return once `proc` (a run of `run_dir`) has written a step checkpoint, asserting it is still running. Any one
    counts, not one by name: the bounded checkpoint history deletes the oldest as the run goes."""
    deadline = time.time() + timeout
    while not any((run_dir / "checkpoints").glob("step*.ckpt")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before its first checkpoint"


# ---- SIGKILL and resume (tests/test_fault_injection.py, tests/hf/) ---------------------------------------------
KILL = ["+callbacks.kill._target_=support.faults.KillAtStep"]  # test code: tests/ goes on the runs' PYTHONPATH


def start_cli(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """`python -m framework.train ARGS` started (imports done: `support.warm_cli`), tests/ on its PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})}
    return warm_cli.popen("framework.train", args, full, REPO)


def finish(proc: subprocess.Popen, timeout: int = 600) -> tuple[int, str]:
    """Wait for a `start_cli` process: (exit code, stderr)."""
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def train_state(ckpt: Path) -> dict:
    """What an exact resume must reproduce: weights, optimizer state, the callbacks' states and the step."""
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)
    return {"state_dict": raw["state_dict"], "optimizer_states": raw.get("optimizer_states", []),
            "callbacks": {k: v for k, v in raw.get("callbacks", {}).items() if not k.startswith("ModelCheckpoint")},
            "global_step": raw["global_step"]}  # (ModelCheckpoint's state holds its run dir's paths)


def assert_same_state(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts/lists of tensors and values, equal bit for bit (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b), f"differs at {where}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"keys differ at {where}: {set(a) ^ set(b)}"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"lengths differ at {where}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, f"differs at {where}"
    else:
        assert a == b, f"differs at {where}: {a!r} vs {b!r}"
