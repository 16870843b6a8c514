"""Checkpoints that a crash cannot corrupt, and checks that say what is wrong with a checkpoint before training.

`AtomicCheckpointIO` is a Lightning `CheckpointIO` plugin (`Trainer(plugins=[AtomicCheckpointIO()])`): each file is
written to a temporary name in the same folder, flushed to disk, then renamed over the target, so a process killed
mid-save (or a full disk) leaves the previous `last.ckpt` whole; it refuses to write NaN/inf weights or optimizer
state. `check_checkpoint` opens a checkpoint with `weights_only=True` and compares it with the module about to load
it. `ResumableCSVLogger` continues a run dir's `metrics.csv` when the run resumes in place instead of erasing it.
"""

from __future__ import annotations

import csv
import errno
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from framework.errors import CheckpointError


def named_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every floating-point tensor in nested dicts/lists, with its path (`state_dict/model.w`, `...[0]/state/3/...`)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel() and not obj.is_sparse:
            yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from named_tensors(v, f"{prefix}/{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from named_tensors(v, f"{prefix}[{i}]")


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP), the tensor itself otherwise: checking it needs no collective."""
    t = t.detach()
    return t.to_local() if hasattr(t, "to_local") else t


def _screen(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t`: NaN/inf if any entry is (no false negatives); a finite tensor may overflow it (confirm)."""
    return t.sum(dtype=torch.float32 if t.element_size() < 4 else None)


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """True if no tensor holds a NaN or ±inf: one sum per tensor and one host sync per device; an overflowing sum
    (values near the dtype's limit) is confirmed entry by entry before the answer is False."""
    tensors = [_local(t) for t in tensors]
    sums: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        sums.setdefault(t.device, []).append(_screen(t).float())
    if all(bool(torch.stack(s).isfinite().all()) for s in sums.values()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def non_finite(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[str], int]:
    """(names of the tensors holding NaN/inf, how many tensors were checked)."""
    named = list(named)
    if all_finite(t for _, t in named):
        return [], len(named)
    return [n for n, t in named if not bool(torch.isfinite(_local(t)).all())], len(named)


def checkpoint_non_finite(checkpoint: dict[str, Any]) -> tuple[list[str], int]:
    """The non-finite tensors among a checkpoint's weights (`state_dict`) and optimizer state, and the count checked."""
    return non_finite(named_tensors({k: checkpoint[k] for k in ("state_dict", "optimizer_states") if k in checkpoint}))


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` to `.NAME.tmp-PID`, fsync, then `os.replace` onto NAME (atomic on POSIX file systems).

    A checkpoint whose weights or optimizer state hold NaN/inf is refused with `CheckpointError` (nothing is
    written) unless `allow_non_finite=True`: resuming from it would only reproduce the divergence.
    """

    def __init__(self, allow_non_finite: bool = False):
        super().__init__()
        self.allow_non_finite = allow_non_finite

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"storage_options={storage_options!r}: AtomicCheckpointIO writes local files only")
        target = Path(path)
        if not self.allow_non_finite:
            bad, total = checkpoint_non_finite(checkpoint)
            if bad:
                kept = f"the previous {target.name} is intact" if target.exists() else f"no {target.name} was written"
                raise CheckpointError(
                    f"refusing to write checkpoint {target}: {len(bad)} of its {total} weight and optimizer-state "
                    f"tensors hold NaN/inf (e.g. {bad[0]}); {kept}. Resume from an earlier checkpoint with a lower "
                    "learning rate (AtomicCheckpointIO(allow_non_finite=True) writes such files for debugging)."
                )
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


#: the first bytes of what `torch.save` writes: a zip archive (the default) or a bare pickle (legacy format)
_TORCH_SAVE_MAGIC = (b"PK\x03\x04", b"\x80")


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """The one reader of checkpoint files: `torch.load(weights_only=True)` on the CPU, nothing unpickled.

    CheckpointError says whether the file is missing, not a torch file at all, or truncated/corrupt/holding code.
    `mmap=True` maps the tensors instead of reading them (cheap when only a few entries are looked at)."""
    p = Path(path)
    if not p.is_file():
        hint = sorted(x.name for x in p.parent.glob("*.ckpt")) if p.parent.is_dir() else []
        raise CheckpointError(f"checkpoint {p} does not exist" + (f"; that folder has {hint}" if hint else ""))
    with open(p, "rb") as f:
        head = f.read(4)
    if not head.startswith(_TORCH_SAVE_MAGIC):
        raise CheckpointError(f"{p} is not a checkpoint: it was not written by torch.save / Lightning")
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True, mmap=mmap and head.startswith(b"PK"))
    except Exception as err:  # truncated zip, random bytes, a pickle needing code: all are refused the same way
        size = p.stat().st_size
        raise CheckpointError(
            f"checkpoint {p} ({size} bytes) is truncated or corrupt, or holds more than tensors, and cannot be read"
            f" with weights_only=True ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})."
            " Use an earlier checkpoint from the same folder."
        ) from err
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{p} holds a {type(ckpt).__name__}, not a checkpoint dictionary")
    return ckpt


def load_checkpoint_file(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint (`read_checkpoint`, then it must hold a 'state_dict'); CheckpointError otherwise."""
    ckpt = read_checkpoint(path)
    if "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a Lightning checkpoint (no 'state_dict' entry)")
    return ckpt


def newest_finite_checkpoint(paths: Iterable[Path], max_step: int | None = None,
                             exclude: Iterable[int] = (), prefer: str = "last.ckpt",
                             skipped: list[tuple[Path, str]] | None = None) -> Path | None:
    """Of `paths`, the checkpoint from the highest step (≤ `max_step`, not in `exclude`) whose weights and optimizer
    state are all finite; at equal steps the newest file, `prefer` first. None if there is none. Steps are read
    with `mmap` (no tensor is read until a candidate is checked); unreadable files are skipped. `skipped`, when
    given, receives (path, why) for each damaged or non-finite file passed over on the way to the answer."""
    found, excluded = [], set(exclude)
    note = skipped.append if skipped is not None else (lambda _: None)
    for path in paths:
        try:
            raw = read_checkpoint(path, mmap=True)
        except CheckpointError:
            note((path, "cannot be read (truncated, corrupt, or not a torch checkpoint)"))  # no resume point
            continue
        if "state_dict" not in raw:
            note((path, "is not a Lightning checkpoint (no 'state_dict' entry)"))
            continue
        step = int(raw.get("global_step", -1))
        if 0 <= step and (max_step is None or step <= max_step) and step not in excluded:
            found.append((step, path.name == prefer, path.stat().st_mtime, path))
    for *_, path in sorted(found, key=lambda f: f[:3], reverse=True):
        bad = checkpoint_non_finite(load_checkpoint_file(path))[0]
        if not bad:
            return path
        note((path, f"holds NaN/inf in {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}"))
    return None


def _earlier_checkpoints(path: Path) -> list[str]:
    """The other checkpoints in `path`'s folder whose weights and optimizer state are all finite."""
    good = []
    for other in sorted(path.parent.glob("*.ckpt")):
        if other.resolve() != path.resolve():
            try:
                if not checkpoint_non_finite(load_checkpoint_file(other))[0]:
                    good.append(other.name)
            except CheckpointError:
                pass
    return good


def check_checkpoint(path: str | Path, module: torch.nn.Module, ckpt: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """Raise `CheckpointError` unless `path` (or `ckpt`, already read from it) is a finite checkpoint with the same
    parameter names and shapes as `module` (a run that grew mid-training passes the grown module)."""
    ckpt = load_checkpoint_file(path) if ckpt is None else ckpt
    bad, total = checkpoint_non_finite(ckpt)
    if bad:
        good = _earlier_checkpoints(Path(path))
        raise CheckpointError(
            f"checkpoint {path} holds NaN/inf in {len(bad)} of its {total} weight and optimizer-state tensors "
            f"(e.g. {bad[0]}): resuming from it would diverge at once. Resume from a finite checkpoint"
            + (f" in the same folder ({', '.join(good)})" if good else "") + " with a lower learning rate."
        )
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


def _csv_step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or "nan")
    except ValueError:
        return float("nan")


class _ContinuedWriter(ExperimentWriter):
    """Keeps the rows of an existing metrics.csv logged before step `before_step` instead of deleting the file."""

    def __init__(self, log_dir: str, before_step: int):
        self.before_step = before_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows, keys = list(reader), list(reader.fieldnames or [])
        kept = [r for r in rows if not _csv_step(r) >= self.before_step]  # a row without a step number stays
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(tmp, path)
        self.metrics_keys = keys  # Lightning's writer appends with this header and widens it for new columns


class ResumableCSVLogger(CSVLogger):
    """`CSVLogger` that, given `resume_step` (the checkpoint's global step), continues an existing metrics.csv.

    Rows logged at steps ≥ `resume_step` belonged to the run after its checkpoint (the resumed run logs those
    steps again) and are dropped; earlier rows are kept and new ones appended under the same header. Without
    `resume_step` it is Lightning's `CSVLogger` (a fresh file).
    """

    def __init__(self, *args: Any, resume_step: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None and self.resume_step is not None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuedWriter(self.log_dir, self.resume_step)
        return super().experiment


class StepSeeds(L.Callback):
    """Seeds torch's global random stream at the start of every training batch from (the run's seed, the batch's
    number in the fit, the rank). Draws that take no generator of their own (a Hugging Face model's dropout, a timm
    model's drop-path) then depend on the batch alone, not on what ran before it, so a run resumed from a checkpoint
    draws exactly what the unbroken run drew, however many data-loader iterators or validations came in between
    (each consumes a draw). The framework's own draws use their own generators and are untouched. The run's seed is
    kept in the checkpoint, so a resumed run continues the same streams."""

    def __init__(self) -> None:
        self.base: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.base is None:
            self.base = torch.initial_seed()  # what seed_everything set, before any batch reseeds

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
                             ) -> None:
        count = trainer.fit_loop.epoch_loop.batch_progress.total.ready  # restored on resume; counts micro-batches
        torch.manual_seed((int(self.base or 0) * 1_000_003 + count * 7_919 + trainer.global_rank * 104_729) % 2**63)

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base = state_dict.get("base", self.base)
