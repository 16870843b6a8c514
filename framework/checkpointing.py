"""Checkpoints that a crash cannot corrupt, and checks that say what is wrong with a checkpoint before training.

`AtomicCheckpointIO` is a Lightning `CheckpointIO` plugin (`Trainer(plugins=[AtomicCheckpointIO()])`): each file is
written to a temporary name in the same folder, flushed to disk, then renamed over the target, so a process killed
mid-save (or a full disk) leaves the previous `last.ckpt` whole. `check_checkpoint` opens a checkpoint with
`weights_only=True` and compares it with the module about to load it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or used; the message says which file and why."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` to `.NAME.tmp-PID`, fsync, then `os.replace` onto NAME (atomic on POSIX file systems)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"storage_options={storage_options!r}: AtomicCheckpointIO writes local files only")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
                kept = f"the previous {target.name} is intact" if target.exists() else f"no {target.name} was written"
                raise CheckpointError(
                    f"no space left on the device while saving checkpoint {target}; {kept} and nothing else was "
                    "changed. Free some space (or set hydra.run.dir on another disk) and resume from the last "
                    "checkpoint with ckpt_path=..."
                ) from err
            raise


def load_checkpoint_file(path: str | Path) -> dict[str, Any]:
    """Open a Lightning checkpoint without unpickling code; a clear `CheckpointError` if it is missing or damaged."""
    p = Path(path)
    if not p.is_file():
        hint = sorted(x.name for x in p.parent.glob("*.ckpt")) if p.parent.is_dir() else []
        raise CheckpointError(f"checkpoint {p} does not exist" + (f"; that folder has {hint}" if hint else ""))
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, random bytes, a pickle needing code
        size = p.stat().st_size
        raise CheckpointError(
            f"checkpoint {p} ({size} bytes) is truncated or corrupt and cannot be read ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}). Use an earlier checkpoint from the same folder."
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{p} is not a Lightning checkpoint (no 'state_dict' entry)")
    return ckpt


def check_checkpoint(path: str | Path, module: torch.nn.Module) -> dict[str, Any]:
    """Raise `CheckpointError` unless `path` is readable and holds the same parameter names and shapes as `module`."""
    ckpt = load_checkpoint_file(path)
    growth = ckpt.get("orthogonal_growth")
    if isinstance(growth, dict) and growth.get("done"):  # grown mid-run: OrthogonalGrowth rebuilds this shape on load
        from framework.callbacks.growth import replay_on_copy

        module = replay_on_copy(module, growth)
    saved = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if hasattr(v, "shape")}
    own = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = sorted(k for k in set(own) & set(saved) if own[k] != saved[k])
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            k = shapes[0]
            parts.append(f"{len(shapes)} shape mismatches (e.g. {k}: checkpoint {saved[k]} vs model {own[k]})")
        if missing:
            parts.append(f"{len(missing)} parameters missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        raise CheckpointError(
            f"checkpoint {path} was saved from a different model: " + "; ".join(parts)
            + ". Resume with the same recipe and model settings it was trained with (see its run's .hydra/config.yaml)."
        )
    return ckpt
