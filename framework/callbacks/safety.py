"""Two guards for long runs, usable in any Lightning project.

`StopOnNonFinite`: a NaN/inf training loss stops training at that step with a message that names it, before the
checkpoint callbacks of the same step run (Lightning calls `ModelCheckpoint` last), so the last checkpoint on disk
is the last good one. `GracefulInterrupt`: the first Ctrl-C (SIGINT) finishes the current step, writes a checkpoint
and stops; the resume command is printed. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; the message names the step and the checkpoint to resume from."""


def _any_rank(trainer: L.Trainer, flag: bool) -> bool:
    """True on every rank if it is true on one (a collective: every rank must call it at the same point)."""
    if trainer.world_size > 1:
        return bool(trainer.strategy.reduce_boolean_decision(flag, all=False))
    return flag


def _loss_of(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
        return outputs["loss"]
    return None


def last_checkpoint(trainer: L.Trainer) -> str | None:
    """The newest checkpoint the run's checkpoint callback has written (None before the first)."""
    cb = trainer.checkpoint_callback
    path = (getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")) if cb is not None else ""
    return path if path and Path(path).exists() else None


class StopOnNonFinite(L.Callback):
    """Raise `NonFiniteLossError` at the first step whose training loss is NaN or ±inf (on any rank)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = _loss_of(outputs)
        value = float(loss.detach().float().mean()) if loss is not None else 0.0
        if not _any_rank(trainer, not math.isfinite(value)):
            return
        step = trainer.global_step
        ckpt = last_checkpoint(trainer)
        keep = (f"the last good checkpoint is {ckpt} (resume with ckpt_path={ckpt} and a lower learning rate)"
                if ckpt else "no checkpoint had been written yet")
        raise NonFiniteLossError(
            f"training loss is {value} at step {step} (batch {batch_idx} of epoch {trainer.current_epoch}); "
            f"training stopped and no checkpoint was written with these weights; {keep}."
        )


class GracefulInterrupt(L.Callback):
    """First Ctrl-C: finish the step, save `interrupted.ckpt` next to the other checkpoints, stop, print how to resume.

    `resume_hint` is the command line to print (the checkpoint path is appended as `ckpt_path=...`).
    """

    def __init__(self, resume_hint: str | None = None, filename: str = "interrupted.ckpt"):
        self.resume_hint = resume_hint
        self.filename = filename
        self.requested = False
        self.saved_path: str | None = None
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:  # the second Ctrl-C: the user means it
            signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: finishing this step, then saving a checkpoint (Ctrl-C again to abort now)",
              file=sys.stderr, flush=True)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.requested, self.saved_path = False, None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not _any_rank(trainer, self.requested):
            return
        cb = trainer.checkpoint_callback
        folder = Path(cb.dirpath) if cb is not None and getattr(cb, "dirpath", None) else Path(
            trainer.default_root_dir) / "checkpoints"
        path = folder / self.filename
        trainer.save_checkpoint(str(path))
        trainer.should_stop = True
        self.saved_path = str(path)
        if trainer.is_global_zero:
            resume = f"{self.resume_hint} ckpt_path={path}" if self.resume_hint else f"ckpt_path={path}"
            print(f"interrupted at step {trainer.global_step}: checkpoint written to {path}\nresume with: {resume}",
                  file=sys.stderr, flush=True)

    def results(self) -> dict[str, Any]:
        return {"interrupted": 1.0} if self.saved_path else {}
