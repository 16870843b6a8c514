"""The loggers and callbacks of a `python -m framework.train` run: ours (the run dir's CSV and TensorBoard logs; the
checkpoint, guards and `RunRecord` callbacks) merged with the user's own, given as `trainer.logger` and
`trainer.callbacks` (a Lightning logger or callback as `{_target_: CLASS, ...}`, or a list of them).

`trainer.logger`: unset, null or true keeps the run dir's logs; false means no logger at all (`results.json` is still
written: `RunRecord` reads the trainer's metrics, not a logger); a logger or a list adds the user's to ours. Every
logger gets the same metrics at the same steps, and the user's also get the run's composed config, once, as
hyperparameters. `trainer.callbacks` adds the user's callbacks after ours; a progress bar of theirs replaces ours.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, DeviceStatsMonitor, LearningRateMonitor, ProgressBar
from lightning.pytorch.loggers import Logger

from framework.checkpointing import ResumableCSVLogger
from framework.errors import InputError

LOGGER_FORMS = ("trainer.logger=false (no logger), true or null (the run dir's CSV/TensorBoard logs), or Lightning"
                " loggers added to those: +trainer.logger._target_=lightning.pytorch.loggers.CSVLogger"
                " +trainer.logger.save_dir=DIR, or a list: 'trainer.logger=[{_target_:CLASS,KEY:VALUE},...]'")
CALLBACK_FORMS = ("Lightning callbacks added to the run's own: +trainer.callbacks._target_=CLASS, or a list:"
                  " 'trainer.callbacks=[{_target_:CLASS,KEY:VALUE},...]' (the catalog's: +callbacks=NAME)")
#: Lightning callbacks that stop a run without a logger when training starts (they log to one)
NEEDS_LOGGER = (LearningRateMonitor, DeviceStatsMonitor)


def user_loggers(setting: Any) -> list[Logger] | bool:
    """The loggers `trainer.logger` adds to the run dir's (a list, empty for unset/null/true), or False for none;
    InputError for anything that is not a Lightning logger."""
    if setting is None or setting is True:
        return []
    if setting is False:
        return False
    return _instances(setting, Logger, "trainer.logger", LOGGER_FORMS)


def user_callbacks(setting: Any) -> list[Callback]:
    """The callbacks `trainer.callbacks` adds to the run's own; InputError for anything that is not one."""
    return [] if setting is None else _instances(setting, Callback, "trainer.callbacks", CALLBACK_FORMS)


def _instances(setting: Any, kind: type, key: str, forms: str) -> list[Any]:
    single = isinstance(setting, (kind, str, bytes)) or hasattr(setting, "keys") or not isinstance(setting, Iterable)
    items = [setting] if single else list(setting)
    for item in items:
        if not isinstance(item, kind):
            mapping = hasattr(item, "keys")
            what = (repr(item) if item is None or isinstance(item, (str, int, float)) else
                    f"{item} (no _target_)" if mapping else f"a {type(item).__name__}")
            raise InputError(f"{key}: {what} is not a Lightning {kind.__name__}; give {forms}")
    return items


def run_loggers(setting: Any, run_dir: Path, resume_step: int | None) -> list[Logger] | bool:
    """The run's loggers: the run dir's CSV logs (and TensorBoard's where installed), then the user's; False with
    `trainer.logger=false`. A resumed run continues our logs from its step (hiding TensorBoard's abandoned events)."""
    theirs = user_loggers(setting)
    if theirs is False:
        return False
    ours: list[Logger] = [ResumableCSVLogger(save_dir=str(run_dir), name="csv", version="", resume_step=resume_step)]
    try:
        import tensorboard  # noqa: F401
        from lightning.pytorch.loggers import TensorBoardLogger
    except ImportError:
        return [*ours, *theirs]
    purge = {} if resume_step is None else {"purge_step": resume_step}
    return [*ours, TensorBoardLogger(save_dir=str(run_dir), name="tb", version="", **purge), *theirs]


def merge_callbacks(ours: list[Callback], theirs: list[Callback]) -> list[Callback]:
    """Ours, then the user's; a progress bar of the user's replaces ours (Lightning runs one)."""
    if any(isinstance(cb, ProgressBar) for cb in theirs):
        ours = [cb for cb in ours if not isinstance(cb, ProgressBar)]
    return [*ours, *theirs]


def show_progress_bar(setting: bool | None, theirs: list[Callback]) -> bool:
    """`trainer.enable_progress_bar`; None: on when the user gave a progress bar or output goes to a terminal."""
    if setting is None:
        return any(isinstance(cb, ProgressBar) for cb in theirs) or sys.stdout.isatty()
    return bool(setting)


def check_loggers_needed(logger: Any, callbacks: dict[str, Callback]) -> None:
    """InputError when `trainer.logger=false` leaves a callback that logs (`NEEDS_LOGGER`) without a logger."""
    if user_loggers(logger) is not False:
        return
    for name, callback in callbacks.items():
        if isinstance(callback, NEEDS_LOGGER):
            raise InputError(f"trainer.logger=false leaves no logger, but {name} ({type(callback).__name__}) logs to"
                             " one and would stop the run when training starts: drop it, or keep a logger")


def log_config(loggers: Iterable[Logger], run_dir: Path, choices: dict[str, Any] | None = None) -> None:
    """Give each of the user's loggers the run's composed config (`.hydra/config.yaml`, resolved where it can be) and
    its group `choices` (recipe, model, optimizer, ...), as hyperparameters."""
    loggers = list(loggers)
    path = run_dir / ".hydra" / "config.yaml"
    if not loggers or not path.is_file():
        return
    from omegaconf import OmegaConf

    config = OmegaConf.load(path)
    try:
        values = OmegaConf.to_container(config, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation only Hydra's app can resolve: log it as written
        values = OmegaConf.to_container(config, resolve=False)
    if choices:
        values = {**values, "choices": {k: v for k, v in choices.items() if not k.startswith("hydra")}}
    for logger in loggers:
        logger.log_hyperparams(values)


__all__ = ["CALLBACK_FORMS", "LOGGER_FORMS", "check_loggers_needed", "log_config", "merge_callbacks", "run_loggers",
           "show_progress_bar", "user_callbacks", "user_loggers"]


def with_auto_precision(trainer: Any) -> Any:
    """The Trainer factory with `precision="auto"` made concrete: bf16 on a GPU that has it, else fp32
    (`framework.devices.auto_precision`); any other value as given."""
    if trainer is None or trainer.keywords.get("precision") != "auto":
        return trainer
    from framework.devices import auto_precision

    return functools.partial(trainer, precision=auto_precision(trainer.keywords.get("accelerator", "auto")))
