"""Where a run starts or resumes: `ckpt_path=PATH`, or `ckpt_path=auto` (the newest usable checkpoint of the run dir,
or a fresh start when it has none: the command a job scheduler can rerun unchanged). Checked before anything is
written (the preflight, against the run built on the meta device; `check_start` under the run dir's lock) and again
by the run itself. A fresh start never lands in a run dir that already holds a run: that would replace its results,
logs and checkpoints."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from framework.checkpointing import check_checkpoint, load_checkpoint_file, newest_finite_checkpoint
from framework.errors import CheckpointError, InputError
from framework.rundir import GROWTH_KEY, RESULTS_NAME

AUTO = "auto"
METRICS_FILE = Path("csv") / "metrics.csv"


class RunDirOccupiedError(InputError):
    """A fresh start into a run dir that holds a run; the message says what it holds and the two ways on."""


def checkpoint_files(run_dir: str | Path) -> list[Path]:
    """The checkpoints a run dir holds: `checkpoints/*.ckpt`, and Lightning's SLURM requeue saves (`hpc_ckpt_N.ckpt`
    in the run dir itself)."""
    run_dir = Path(run_dir)
    return sorted([*run_dir.glob("checkpoints/*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")])


def auto_checkpoint(run_dir: str | Path, skipped: list[tuple[Path, str]] | None = None) -> Path | None:
    """The newest finite, readable checkpoint of `run_dir`; None when it holds no checkpoint at all. Damaged or
    non-finite files are passed over (each with why, into `skipped`); when every file is, InputError: a fresh start
    would overwrite them, so the files are left as they are and the run is refused."""
    passed: list[tuple[Path, str]] = []
    found = newest_finite_checkpoint(checkpoint_files(run_dir), skipped=passed)
    if found is None and passed:
        why = "; ".join(f"{_name(path, run_dir)} {reason}" for path, reason in passed)
        raise InputError(f"ckpt_path=auto: no checkpoint in {run_dir} can be resumed from ({why}); the files were"
                         " left as they are. Name a checkpoint to resume from (ckpt_path=PATH),"
                         " or start anew with another hydra.run.dir=...")
    if skipped is not None:
        skipped.extend(passed)
    return found


def _name(path: Path, run_dir: str | Path) -> str:
    return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)


def checked_resume(ckpt_path: str | None, lm: Any, run_dir: str | Path) -> tuple[int | None, str | None]:
    """The step a resumed run continues from and the checkpoint's absolute path; (None, None) for a fresh run
    (no `ckpt_path`, or `auto` in a run dir without a checkpoint). A missing, damaged, non-finite or foreign
    checkpoint is refused (InputError naming `ckpt_path=`); a checkpoint of a run that grew mid-training is compared
    with the grown architecture (`replay_on_copy`, on a meta-device copy)."""
    if not ckpt_path:
        return None, None
    path = auto_checkpoint(run_dir) if ckpt_path == AUTO else Path(ckpt_path)
    if path is None:
        return None, None
    try:
        ckpt = load_checkpoint_file(path)
        module = lm
        growth = ckpt.get(GROWTH_KEY)
        if isinstance(growth, dict) and growth.get("done"):  # OrthogonalGrowth rebuilds this shape on load
            from framework.callbacks.growth import replay_on_copy

            module = replay_on_copy(lm, growth)
        check_checkpoint(path, module, ckpt)
    except CheckpointError as err:
        raise InputError(f"ckpt_path={ckpt_path}: {err}") from err
    return int(ckpt.get("global_step", 0)), str(path.resolve())


def run_holdings(run_dir: str | Path) -> list[str]:
    """What of a run `run_dir` holds, as the refusal names it: results.json (and its status), checkpoints, metrics."""
    run_dir, held = Path(run_dir), []
    results = run_dir / RESULTS_NAME
    if results.is_file():
        try:
            status = json.loads(results.read_text()).get("status")
        except (OSError, ValueError, AttributeError):
            status = None
        held.append(f"{RESULTS_NAME} ({status} run)" if status else RESULTS_NAME)
    ckpts = checkpoint_files(run_dir)
    if ckpts:
        held.append(f"{len(ckpts)} checkpoint{'s' if len(ckpts) > 1 else ''}")
    if (run_dir / METRICS_FILE).is_file():
        held.append(str(METRICS_FILE))
    return held


def check_start(run_dir: str | Path, ckpt_path: str | None, key: str = "hydra.run.dir",
                multirun: bool = False) -> None:
    """Refuse (RunDirOccupiedError) a fresh start into a run dir that already holds a run, or a sweep dir any of whose
    job dirs does. A resume goes on: `ckpt_path=PATH`, or `auto` where a usable checkpoint exists (the files it
    passes over are named in `note:` lines). `auto` in a dir holding only the metrics of a run stopped before its
    first checkpoint starts afresh: nothing there could be continued. Called under the run dir's lock."""
    run_dir = Path(run_dir)
    if ckpt_path and ckpt_path != AUTO:
        return  # a resume from a named checkpoint (the preflight checked that it fits)
    jobs = [run_dir, *sorted(p for p in run_dir.iterdir() if p.is_dir())] if multirun and run_dir.is_dir() else [
        run_dir]
    for job in jobs:
        held = run_holdings(job)
        if ckpt_path == AUTO:
            skipped: list[tuple[Path, str]] = []
            if auto_checkpoint(job, skipped) is not None:
                for path, why in skipped:
                    print(f"note: ckpt_path=auto skips {_name(path, job)}: it {why}", file=sys.stderr)
                continue
            held = [h for h in held if h != str(METRICS_FILE)]
        if held:
            where = f"{key}={run_dir}" + (f" (its job dir {job.name})" if job != run_dir else "")
            raise RunDirOccupiedError(
                f"{where} already holds a run ({', '.join(held)}); nothing"
                f" was written. To continue it: ckpt_path=auto; to start anew: another {key}=...")
