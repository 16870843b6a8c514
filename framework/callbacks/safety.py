"""Two guards for long runs, usable in any Lightning project.

`StopOnNonFinite`: a NaN/inf training loss, or an optimizer step that leaves NaN/inf in the weights or the optimizer
state, stops training with a message that names the step, before any checkpoint holding it is written, so the last
checkpoint on disk is the last good one. It keeps each step's loss on its device and looks every N steps, before
each validation and each checkpoint save, and at the end: no host sync per step.
`GracefulInterrupt`: the first Ctrl-C (SIGINT), SIGTERM or SIGUSR1 finishes the current step, writes a checkpoint and
stops; the resume command is printed. The same signal again interrupts at once.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn

from framework.checkpointing import all_finite, newest_finite_checkpoint, non_finite
from framework.errors import NonFiniteLossError


def _any_rank(trainer: L.Trainer, flag: bool) -> bool:
    """True on every rank if it is true on one (a collective: every rank must call it at the same point)."""
    if trainer.world_size > 1:
        return bool(trainer.strategy.reduce_boolean_decision(flag, all=False))
    return flag


def _first_on_any_rank(trainer: L.Trainer, step: int | None) -> int | None:
    """The smallest `step` over the ranks (None where a rank has none), the same on every rank (a collective)."""
    if trainer.world_size <= 1:
        return step
    none = 2**62
    mine = torch.tensor(none if step is None else step, dtype=torch.int64, device=trainer.strategy.root_device)
    first = int(trainer.strategy.reduce(mine, reduce_op="min"))
    return None if first == none else first


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


class _Seen(NamedTuple):
    """One training batch as the guard keeps it until its next check: the loss stays on its device."""

    loss: torch.Tensor
    weights_step: int  # the global step of the weights the batch was computed with
    step: int  # the global step after it
    batch_idx: int
    epoch: int


class StopOnNonFinite(L.Callback):
    """Raise `NonFiniteLossError` when a training loss, or the weights or optimizer state, hold NaN/±inf (any rank),
    before any checkpoint holding them is written; the message names the first such step.

    No host sync per step: each step's loss stays on its device and is read, with the weights and the optimizer state
    (one sum per tensor), every `every_n_steps` optimizer steps, before each validation and each checkpoint save,
    and when training ends. A diverging run has usually ruined its weights a step or two before anything overflows,
    so the message names the newest finite checkpoint whose weights gave a finite training loss that had not
    diverged, not merely the newest one.

    Args:
        check_state: also check the weights and optimizer state (one sum per tensor); False checks losses only.
        resume_hint: command printed to resume from the good checkpoint (`ckpt_path=...` appended); None: none.
        divergence: a loss above first loss + divergence·max(1, |first loss|) counts as diverged (> 0).
        every_n_steps: optimizer steps between checks (≥ 1; 1 checks every step); validation and saves always check.
    """

    def __init__(self, check_state: bool = True, resume_hint: str | None = None, divergence: float = 10.0,
                 every_n_steps: int = 50):
        if not divergence > 0:
            raise ValueError(f"divergence={divergence} must be > 0 (a multiple of the starting loss's magnitude)")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r} must be an integer >= 1 (optimizer steps between "
                             "checks; 1 checks every step)")
        self.check_state = check_state
        self.resume_hint = resume_hint
        self.divergence = divergence
        self.every_n_steps = every_n_steps
        self._seen: list[_Seen] = []  # the batches since the last check
        self._checked_at = -1  # the global step of the last check
        self._state_ok_at: int | None = None  # the last global step whose weights and optimizer state were finite
        self._weights_step: int | None = None  # the global step of the weights the current batch was computed with
        self._first_loss: float | None = None
        self._diverged: set[int] = set()  # steps whose weights gave a non-finite or diverged loss

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._weights_step, self._first_loss, self._diverged, self._seen = trainer.global_step, None, set(), []
        self._checked_at = self._state_ok_at = trainer.global_step  # a fresh start or a checked checkpoint

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
        weights_step = trainer.global_step - 1 if self._weights_step is None else self._weights_step
        self._weights_step = step = trainer.global_step
        if loss is not None:  # a reference, no kernel and no sync: read at the next check
            self._seen.append(_Seen(loss.detach(), weights_step, step, batch_idx, trainer.current_epoch))
        if step != self._checked_at and step % self.every_n_steps == 0:  # once per optimizer step
            self.check(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # no validation (nor its callbacks) sees non-finite weights
            self.check(trainer, pl_module)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
                           ) -> None:
        self.check(trainer, pl_module)  # raising here stops the save before anything is written

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read the losses kept since the last check (one host sync) and, with `check_state`, the weights and the
        optimizer state; raise NonFiniteLossError if any rank found NaN/inf. Every rank must call it alike."""
        step = trainer.global_step
        if not self._seen and (self._state_ok_at == step or not self.check_state):
            return  # nothing new since the last check (the same on every rank)
        seen, self._seen, self._checked_at = self._seen, [], step
        values = torch.stack([s.loss.float().mean() for s in seen]).tolist() if seen else []
        bad = None
        for value, batch in zip(values, seen, strict=True):
            self._record(value, batch.weights_step)
            if not math.isfinite(value):
                bad = (value, batch)
                break
        named: list[tuple[str, torch.Tensor]] = []
        state_ok, previous_ok = True, self._state_ok_at
        if self.check_state and self._state_ok_at != step:
            named = self._state(trainer, pl_module)
            state_ok = all_finite(t for _, t in named)
            self._state_ok_at = step if state_ok else self._state_ok_at
        first = _first_on_any_rank(trainer, bad[1].step if bad else (None if state_ok else step))
        if first is None:
            return
        if bad and bad[1].step == first:
            self._stop(trainer, first, f"training loss is {bad[0]} at step {first}", bad[1])
        if not state_ok and step == first:
            last = f"training loss is {values[-1]:.4g} at step {step}, but " if values else ""
            update = "that step's optimizer update" if previous_ok == step - 1 else (
                f"an optimizer update after step {previous_ok} (the last check)" if previous_ok is not None else
                f"an optimizer update up to step {step}")
            names, total = non_finite(named)
            self._diverged.add(step)  # the weights of this step never reach a checkpoint; nor are they a resume point
            self._stop(trainer, first, f"{last}{update} left NaN/inf in {len(names)} of {total} weight and "
                       f"optimizer-state tensors (e.g. {names[0]})", seen[-1] if seen else None)
        self._stop(trainer, first, f"training loss or weights became NaN/inf on another rank at step {first}")

    def _stop(self, trainer: L.Trainer, first: int, what: str, where: _Seen | None = None) -> NoReturn:
        """Raise NonFiniteLossError: `what` went wrong at step `first`, and from which checkpoint to resume."""
        ckpt = usable_checkpoint(trainer, first, self._diverged)
        if ckpt:
            how = (f"resume with a lower learning rate: {self.resume_hint} ckpt_path={ckpt}" if self.resume_hint
                   else f"resume with ckpt_path={ckpt} and a lower learning rate")
            keep = f"the last good checkpoint is {ckpt} ({how})"
        else:
            keep = "no checkpoint from before the loss diverged had been written" + (
                f"; start again with a lower learning rate: {self.resume_hint}" if self.resume_hint else "")
        diverged = sorted(s for s in self._diverged if s <= first)[-3:]
        criterion = "non-finite" + (f", or a loss above {self._limit():.4g}" if self._first_loss is not None else "")
        why = (f"; the weights of step{'s' if len(diverged) > 1 else ''} {', '.join(map(str, diverged))} had diverged "
               f"({criterion})") if diverged else ""
        batch = f" (batch {where.batch_idx} of epoch {where.epoch})" if where is not None else ""
        stopped = "training stopped" if trainer.global_step == first else (
            f"training stopped at step {trainer.global_step} (the guard reads the loss every {self.every_n_steps} "
            "steps and before each validation and checkpoint)")
        raise NonFiniteLossError(
            f"{what}{batch}; {stopped} and no checkpoint was written with these weights{why}; {keep}."
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
        if self._stop_next:
            self.stop_now(trainer)

    def stop_now(self, trainer: L.Trainer) -> NoReturn:
        """Stop here as a stop request does (called between steps, on every rank: the data's own stop, a bad line
        under data.strict=true): save the checkpoint, say how to resume, raise `StopRequested`."""
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
