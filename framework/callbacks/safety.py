"""Two guards for long runs, usable in any Lightning project.

`StopOnNonFinite`: a NaN/inf training loss, or an optimizer step that leaves NaN/inf in the weights or the optimizer
state, stops training at that step with a message that names it, before the checkpoint callbacks of the same step
run (Lightning calls `ModelCheckpoint` last), so the last checkpoint on disk is the last good one.
`GracefulInterrupt`: the first Ctrl-C (SIGINT), SIGTERM or SIGUSR1 finishes the current step, writes a checkpoint and
stops; the resume command is printed. The same signal again interrupts at once.
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

from framework.checkpointing import all_finite, newest_finite_checkpoint, non_finite
from framework.errors import NonFiniteLossError


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


def usable_checkpoint(trainer: L.Trainer, max_step: int, exclude: set[int] | frozenset[int] = frozenset()
                      ) -> str | None:
    """The newest checkpoint in the run's checkpoint folder from a step ≤ `max_step` and not in `exclude` whose
    weights and optimizer state are finite (`last.ckpt` when it is that one); None if there is none."""
    cb = trainer.checkpoint_callback
    folder = Path(cb.dirpath) if cb is not None and getattr(cb, "dirpath", None) else None
    if folder is None or not folder.is_dir():
        return None
    last = Path(getattr(cb, "last_model_path", "") or "").name or "last.ckpt"
    found = newest_finite_checkpoint(folder.glob("*.ckpt"), max_step, exclude, prefer=last)
    return str(found) if found else None


class StopOnNonFinite(L.Callback):
    """Raise `NonFiniteLossError` at the first step whose loss, weights or optimizer state hold NaN/±inf (any rank).

    The weights and the optimizer state are checked after each optimizer step (`check_state=True`; one sum per
    tensor, one host sync per device): a finite loss can still come with a step that overflows the weights or
    Adam's second moment, and the checkpoint of that step must not be written. A diverging run has usually ruined
    its weights a step or two before anything overflows, so the message names the newest finite checkpoint whose
    weights gave a finite training loss no higher than the fit's first loss + `divergence`·max(1, |first loss|),
    not merely the newest one. `resume_hint` is the command to print (the checkpoint path is appended as
    `ckpt_path=...`), e.g. the run's own command with a lower lr.
    """

    def __init__(self, check_state: bool = True, resume_hint: str | None = None, divergence: float = 10.0):
        if not divergence > 0:
            raise ValueError(f"divergence={divergence} must be > 0 (a multiple of the starting loss's magnitude)")
        self.check_state = check_state
        self.resume_hint = resume_hint
        self.divergence = divergence
        self._checked_step = -1
        self._weights_step: int | None = None  # the global step of the weights the current batch was computed with
        self._first_loss: float | None = None
        self._diverged: set[int] = set()  # steps whose weights gave a non-finite or diverged loss

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._weights_step, self._first_loss, self._diverged = trainer.global_step, None, set()

    def _record(self, value: float, step: int) -> None:
        """Remember whether the weights of `step` gave a loss far from where this fit started."""
        if self._first_loss is None and math.isfinite(value):
            self._first_loss = value
        if not math.isfinite(value) or value > self._limit():
            self._diverged.add(step)

    def _limit(self) -> float:
        first = self._first_loss
        return math.inf if first is None else first + self.divergence * max(1.0, abs(first))

    def _state(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[tuple[str, torch.Tensor]]:
        named = [(n, p) for n, p in pl_module.named_parameters() if p.is_floating_point() and p.numel()]
        names = {id(p): n for n, p in named}
        for i, opt in enumerate(trainer.optimizers):
            for param, state in opt.state.items():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                        named.append((f"optimizer {i} {key} of {names.get(id(param), 'a parameter')}", value))
        return named

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = _loss_of(outputs)
        value = float(loss.detach().float().mean()) if loss is not None else 0.0
        weights_step = trainer.global_step - 1 if self._weights_step is None else self._weights_step
        self._weights_step = trainer.global_step
        if loss is not None:
            self._record(value, weights_step)
        named: list[tuple[str, torch.Tensor]] = []
        state_ok = True
        if self.check_state and trainer.global_step != self._checked_step:  # once per optimizer step
            self._checked_step = trainer.global_step
            named = self._state(trainer, pl_module)
            state_ok = all_finite(t for _, t in named)
        if not _any_rank(trainer, not (math.isfinite(value) and state_ok)):
            return
        step = trainer.global_step
        if not math.isfinite(value):
            what = f"training loss is {value} at step {step}"
        elif not state_ok:
            bad, total = non_finite(named)
            what = (f"training loss is {value:.4g} at step {step}, but that step's optimizer update left NaN/inf in "
                    f"{len(bad)} of {total} weight and optimizer-state tensors (e.g. {bad[0]})")
        else:
            what = f"training loss or weights became NaN/inf on another rank at step {step}"
        if not state_ok:  # the weights of this step never reach a checkpoint; they are not a resume point either
            self._diverged.add(step)
        ckpt = usable_checkpoint(trainer, step, self._diverged)
        if ckpt:
            how = (f"resume with a lower learning rate: {self.resume_hint} ckpt_path={ckpt}" if self.resume_hint
                   else f"resume with ckpt_path={ckpt} and a lower learning rate")
            keep = f"the last good checkpoint is {ckpt} ({how})"
        else:
            keep = "no checkpoint from before the loss diverged had been written" + (
                f"; start again with a lower learning rate: {self.resume_hint}" if self.resume_hint else "")
        diverged = sorted(self._diverged)[-3:]
        criterion = "non-finite" + (f", or a loss above {self._limit():.4g}" if self._first_loss is not None else "")
        why = (f"; the weights of step{'s' if len(diverged) > 1 else ''} {', '.join(map(str, diverged))} had diverged "
               f"({criterion})") if diverged else ""
        raise NonFiniteLossError(
            f"{what} (batch {batch_idx} of epoch {trainer.current_epoch}); training stopped and no checkpoint was "
            f"written with these weights{why}; {keep}."
        )


#: the stop requests a run honours: Ctrl-C, a scheduler's SIGTERM (SLURM, Kubernetes, `docker stop`), and SLURM's
#: warning signal SIGUSR1 (left to whoever holds it already, e.g. Lightning's SLURM auto-requeue)
STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGUSR1")) if s is not None)


class StopRequested(Exception):  # noqa: N818 - a request, not a fault
    """Raised by `GracefulInterrupt` to end `Trainer.fit` once the interrupted checkpoint is saved: unlike
    `should_stop`, it runs no extra validation and logs no extra row (Lightning does both on a requested stop).
    Catch it around `fit`; `GracefulInterrupt.saved_path` says where the checkpoint is."""


class GracefulInterrupt(L.Callback):
    """A stop request (Ctrl-C, SIGTERM, SIGUSR1): finish the step, save `interrupted.ckpt` next to the other
    checkpoints, stop, print how to resume. The same signal again aborts at once (KeyboardInterrupt).

    The checkpoint is saved when the next step would begin, and `StopRequested` ends the fit (catch it around
    `Trainer.fit`). The handlers are installed when training starts, after Lightning's own (which on SIGTERM would
    kill the other ranks and end the fit with exit status 0), and put back when it ends. A SIGUSR1 handler someone
    else installed (Lightning's SLURM auto-requeue) is kept. `resume_hint` is the command line to print (the
    checkpoint path is appended as `ckpt_path=...`); `signum` says which signal stopped the run.
    """

    def __init__(self, resume_hint: str | None = None, filename: str = "interrupted.ckpt",
                 signals: tuple[int, ...] = STOP_SIGNALS):
        self.resume_hint = resume_hint
        self.filename = filename
        self.signals = tuple(signals)
        self.requested = False
        self._stop_next = False
        self.signum: int | None = None
        self.saved_path: str | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == self.signum:  # the same request twice: the user means it
            self._restore()
            raise KeyboardInterrupt
        self.requested, self.signum = True, self.signum or signum
        again = "Ctrl-C" if signum == signal.SIGINT else name
        print(f"\n{name}: finishing this step, then saving a checkpoint ({again} again to abort now)",
              file=sys.stderr, flush=True)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.requested, self.signum, self.saved_path, self._stop_next = False, None, None, False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            current = signal.getsignal(signum)
            if signum == getattr(signal, "SIGUSR1", None) and current not in (signal.SIG_DFL, None):
                continue  # someone's requeue handler (Lightning's under SLURM): theirs to answer
            self._previous[signum] = signal.signal(signum, self._handler)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous.items():
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._stop_next = _any_rank(trainer, self.requested)  # every rank decides alike (a collective)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        """Stop before the next step: the previous one is complete, its logging, validation and checkpoints
        included, so the resumed run continues exactly where an uninterrupted one would be."""
        if not self._stop_next:
            return
        cb = trainer.checkpoint_callback
        folder = Path(cb.dirpath) if cb is not None and getattr(cb, "dirpath", None) else Path(
            trainer.default_root_dir) / "checkpoints"
        path = folder / self.filename
        trainer.save_checkpoint(str(path))
        for logger in trainer.loggers:
            logger.save()  # what the loggers buffered so far is on disk before the fit unwinds
        self.saved_path = str(path)
        if trainer.is_global_zero:
            resume = f"{self.resume_hint} ckpt_path={path}" if self.resume_hint else f"ckpt_path={path}"
            print(f"interrupted at step {trainer.global_step}: checkpoint written to {path}\nresume with: {resume}",
                  file=sys.stderr, flush=True)
        self._restore()  # a signal from here on (the fit unwinding, the record) is the default one again
        raise StopRequested(f"stopped at step {trainer.global_step} on request; checkpoint {path}")

    def results(self) -> dict[str, Any]:
        return {"interrupted": 1.0} if self.saved_path else {}
