"""Fault injection for tests and chaos runs: kill the training process at a chosen step, the hard way.

Add it to any run from the command line without registering anything, with `tests/` on the path (it is test
code, not part of the installed package):
`PYTHONPATH=tests python -m framework.train ... +callbacks.kill._target_=support.faults.KillAtStep
+callbacks.kill.step=3`.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning as L


class KillAtStep(L.Callback):
    """Send `signal_name` (default SIGKILL: no cleanup, no final save) to this process when step `step` begins.

    Step k begins after step k-1's `on_train_batch_end`, where `ModelCheckpoint` writes its checkpoints, so the
    process dies mid-training with exactly the checkpoints a real crash at that point would leave.
    """

    def __init__(self, step: int, signal_name: str = "SIGKILL"):
        if step < 1:
            raise ValueError(f"step={step} must be >= 1 (the kill happens when that step begins)")
        self.step, self.signal, self.sent = step, getattr(signal, signal_name), False

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step >= self.step and not self.sent:  # once: a scheduler signals once, too
            self.sent = True
            os.kill(os.getpid(), self.signal)


class PoisonAtStep(L.Callback):
    """Fill the module's first weight with NaN on rank `rank` when step `step` begins: that rank's loss turns NaN at
    once, and under DDP the averaged gradients carry it to every rank one step later."""

    def __init__(self, step: int, rank: int = 0):
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            import torch

            with torch.no_grad():
                next(module.parameters()).fill_(float("nan"))
