"""The run pipeline of `python -m framework.train`: build the run from the composed groups, fit it, record it,
push it. It raises (`framework.errors`) and never exits; `framework.train.main` maps the errors to exit codes.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig

from framework.assembly import assemble, attach_adapters
from framework.callbacks.run_record import RunRecord, numbers
from framework.callbacks.safety import GracefulInterrupt, StopOnNonFinite, StopRequested
from framework.checkpointing import AtomicCheckpointIO, StepSeeds
from framework.console import log_to_run_file
from framework.errors import PushAfterTrainingError, RunInterrupted
from framework.resume import checked_resume
from framework.run_tools import (
    log_config,
    merge_callbacks,
    run_loggers,
    show_progress_bar,
    user_callbacks,
    user_loggers,
    with_auto_precision,
)


def train(
    data: L.LightningDataModule,
    model: Any,
    module: Any,
    optimizer: Any,
    trainer: Any,
    hub: Any,
    seed: int,
    scheduler: Any = None,
    callbacks: dict[str, L.Callback] | None = None,
    loss: Any = None,
    sampler: Any = None,
    metric: Any = None,
    ckpt_path: str | None = None,
    init_from: str | None = None,
    validate_before_fit: bool = True,
    test: bool = False,
    guard: StopOnNonFinite | None = None,
    peft: Any = None,
) -> dict[str, Any]:
    """Instantiate the run from the composed groups, fit it, record it. Returns the results (`results.json`)."""
    log_to_run_file()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    choices = dict(HydraConfig.get().runtime.choices)
    lm, callbacks = assemble(data, model, module, optimizer, scheduler, loss, metric, sampler, callbacks, seed, choices,
                             peft)
    start_from(lm, init_from, peft)
    resume_step, ckpt_path = checked_resume(ckpt_path, lm, run_dir)
    record = RunRecord(run_dir, command_line(), command_line(drop=("ckpt_path",)), choices, resumed_from=ckpt_path)
    interrupt = GracefulInterrupt(resume_hint=record.resume_command)
    trainer = with_auto_precision(trainer)
    theirs = user_callbacks(trainer.keywords.get("callbacks"))  # the user's own, as `trainer.callbacks`
    show_bar = show_progress_bar(trainer.keywords.get("enable_progress_bar"), theirs)
    ours = [*callbacks.values(), *_hub_callbacks(hub), *_guards(guard, optimizer, interrupt, show_bar), record,
            StepSeeds()]  # dropout without a generator of its own resumes exactly
    run = trainer(
        callbacks=merge_callbacks(ours, theirs),
        logger=run_loggers(trainer.keywords.get("logger"), run_dir, resume_step),  # ours and `trainer.logger`'s
        enable_progress_bar=show_bar,
        plugins=trainer.keywords.get("plugins") or [AtomicCheckpointIO()],  # a kill never corrupts a checkpoint
    )
    log_config(user_loggers(trainer.keywords.get("logger")) or [], run_dir, choices)  # the user's get the config

    initial = {}
    if validate_before_fit and ckpt_path is None:
        metrics = run.validate(lm, datamodule=data, verbose=False)  # [] when trainer.limit_val_batches=0
        initial = numbers(metrics[0], suffix="_init") if metrics else {}
    try:
        run.fit(lm, datamodule=data, ckpt_path=ckpt_path)
    except StopRequested:
        pass  # GracefulInterrupt saved the checkpoint (every rank stops alike)
    if interrupt.saved_path:  # a stop request: stop here, on every rank (the checkpoint and how to resume are printed)
        record.interrupted(run, interrupt.saved_path, interrupt.signum)
        raise RunInterrupted(interrupt.saved_path, run.global_step, interrupt.signum or signal.SIGINT)
    results = record.finish(run, lm, initial, _final_metrics(run, lm, data, test))
    if run.is_global_zero and hub.repo_id:
        results["hub"] = _push_run(run_dir, hub)
    return results


def start_from(lm: L.LightningModule, init_from: str | None, peft: Any) -> None:
    """Load `init_from=`'s weights into the model (a run dir, checkpoint or model repo), then attach the `peft`
    group's adapters; an `init_from=` that holds a PEFT adapter is attached as the adapters, trained on."""
    adapter_from = None
    if init_from:
        from framework.models.peft_adapters import is_adapter_source

        adapter_from = init_from if is_adapter_source(init_from) else None
    if init_from and adapter_from is None:
        from framework.hub import load_weights_into

        load_weights_into(lm.model, init_from)
    trainable = attach_adapters(lm, peft, adapter_from)
    if trainable:
        logging.getLogger(__name__).info("peft: %s", trainable)


def command_line(extra: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> str:
    """This run's command, as typed (`sys.argv`), without the `drop` keys' overrides and with `extra` appended."""
    keep = [a for a in sys.argv[1:] if not any(a.lstrip("+").startswith(f"{key}=") for key in drop)]
    return "python -m framework.train " + " ".join(shlex.quote(a) for a in [*keep, *extra])


def _guards(guard: StopOnNonFinite | None, optimizer: Any, interrupt: GracefulInterrupt, show_bar: bool
            ) -> list[L.Callback]:
    """Stop on a non-finite loss (`guard`, None: off; it suggests a tenth of the lr), save on Ctrl-C, and rich's bar
    where installed."""
    guards: list[L.Callback] = [interrupt]
    if guard is not None:
        guard.resume_hint = _lower_lr_command(optimizer)
        guards.insert(0, guard)
    if show_bar and importlib.util.find_spec("rich") is not None:
        from lightning.pytorch.callbacks import RichProgressBar

        guards.append(RichProgressBar())
    return guards


def _final_metrics(run: L.Trainer, lm: L.LightningModule, data: Any, test: bool) -> dict[str, float]:
    """The logged metrics, what evaluating callbacks report (e.g. mask_sweep), the final weights' validation
    numbers (not the last scheduled check's) and, with `test=true`, the test set's (`test/...`)."""
    metrics = numbers(run.callback_metrics)
    for cb in run.callbacks:
        metrics.update(numbers(getattr(cb, "results", dict)()))
    if run.limit_val_batches:
        metrics.update(numbers(run.validate(lm, datamodule=data, verbose=False)[0]))
    if test:
        metrics.update(numbers(run.test(lm, datamodule=data, verbose=False)[0], prefix="test/"))
    return metrics


def _hub_callbacks(hub: Any) -> list[L.Callback]:
    """Checks `hub.repo_id` before training; `hub.every_n_validations>0` adds intermediate pushes."""
    if not hub.repo_id:
        return []
    from framework.callbacks.hub_push import HubPush
    from framework.hub import check_repo_id

    check_repo_id(hub.repo_id)
    if not hub.every_n_validations:
        return []
    choices = HydraConfig.get().runtime.choices
    info = {"recipe": choices.get("recipe"), "model_name": choices.get("model"), "task": choices.get("module"),
            "datasets": [choices["data"]] if choices.get("data") else [],
            "command": command_line()}
    return [HubPush(hub.repo_id, hub.revision, hub.private, hub.every_n_validations, push_at_end=False, info=info)]


def _push_run(run_dir: Path, hub: Any) -> dict[str, str]:
    """Push the finished run dir as one commit and record it in results.json; PushAfterTrainingError (exit 3: all
    is on disk) if it fails."""
    from framework.hub import HubPushError, push_to_hub, record_push, retry_command

    args = (hub.repo_id, hub.revision, bool(hub.private))
    try:
        pushed = push_to_hub(run_dir, *args)
    except Exception as err:  # noqa: BLE001 - whatever failed, the run is on disk and the retry command says so
        retry = "" if isinstance(err, HubPushError) else f" Retry with: {retry_command(run_dir, *args)}"
        raise PushAfterTrainingError(f"training finished and everything is in {run_dir} (results.json, checkpoints,"
                                     f" logs), but the push to the Hub failed. {err}{retry}") from err
    print(f"pushed to the Hub: {pushed.url}")
    return record_push(run_dir, pushed)


def _lower_lr_command(optimizer: Any) -> str:
    """This run's command line with `optimizer.lr` at a tenth of this run's lr (what a NaN/inf stop suggests)."""
    lr = optimizer.keywords.get("lr") if isinstance(optimizer, functools.partial) else None
    lower = (f"optimizer.lr={lr / 10:.3g}",) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else ()
    return command_line(lower, drop=("ckpt_path", "optimizer.lr"))
