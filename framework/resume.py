"""Where a run resumes from: `ckpt_path=PATH`, or `ckpt_path=auto` (the newest finite checkpoint of the run dir, or a
fresh start when it has none: the command a job scheduler can rerun unchanged). Checked before anything is written
(the preflight, against the run built on the meta device) and again by the run itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.checkpointing import check_checkpoint, load_checkpoint_file, newest_finite_checkpoint
from framework.errors import CheckpointError, InputError
from framework.rundir import GROWTH_KEY

AUTO = "auto"


def auto_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest finite checkpoint of `run_dir`: `checkpoints/*.ckpt`, and Lightning's SLURM requeue saves
    (`hpc_ckpt_N.ckpt` in the run dir itself); None when there is none."""
    run_dir = Path(run_dir)
    return newest_finite_checkpoint([*run_dir.glob("checkpoints/*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")])


def checked_resume(ckpt_path: str | None, lm: Any, run_dir: str | Path) -> tuple[int | None, str | None]:
    """The step a resumed run continues from and the checkpoint's absolute path; (None, None) for a fresh run
    (no `ckpt_path`, or `auto` in a run dir without a finite checkpoint). A missing, damaged, non-finite or
    foreign checkpoint is refused (InputError naming `ckpt_path=`); a checkpoint of a run that grew mid-training
    is compared with the grown architecture (`replay_on_copy`, on a meta-device copy)."""
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
