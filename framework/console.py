"""A quiet console and a complete `train.log` for `python -m framework.train`.

The console drops known notices that say nothing about the run: Lightning's "litlogger" advertisement, torch's
`LeafSpec` deprecation warning raised inside Lightning, and the HTTP client's line per Hub request (`httpx`'s INFO
"HTTP Request: ...": `hydra.verbose=[httpx,httpx2]` shows them again). Hydra's job log file (`<run dir>/train.log`) gets
the run's own lines: Lightning's notices and the summary that `RunRecord` prints.
"""

from __future__ import annotations

import logging
import warnings

#: Lightning's loggers; they do not propagate to the root logger (where Hydra's file handler is) when they were
#: imported before logging was configured
LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")
RUN_LOGGER = "framework.run"
LEAFSPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
#: HTTP clients that log each request at INFO (huggingface_hub's requests through them)
HTTP_LOGGERS = ("httpx", "httpx2", "httpcore")


class _DropTips(logging.Filter):
    """Drops Lightning's advertisement lines ("💡 Tip: ... try installing [litlogger] ...")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_console() -> None:
    """Silence the litlogger tip, the LeafSpec deprecation warning and the per-request HTTP lines for this process
    (idempotent; a level the user set, e.g. by `hydra.verbose=[httpx,httpx2]` after this, is kept)."""
    warnings.filterwarnings("ignore", message=LEAFSPEC_WARNING, category=FutureWarning)
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTips) for f in logger.filters):
            logger.addFilter(_DropTips())


def log_to_run_file() -> None:
    """Send Lightning's lines and the run's own (`framework.run`) to the root logger's file handlers (Hydra's
    `train.log`) as well; the console shows them as before, once."""
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for name in (*LIGHTNING_LOGGERS, RUN_LOGGER):
        logger = logging.getLogger(name)
        if name == RUN_LOGGER:  # its lines are also printed: the file only
            logger.setLevel(logging.INFO)
            logger.propagate = False
        elif logger.propagate:
            continue  # already reaches the root's handlers
        for handler in [h for h in logger.handlers if isinstance(h, logging.FileHandler) and h not in files]:
            logger.removeHandler(handler)  # a previous job's file (a `-m` sweep runs its jobs in one process)
        for handler in files:
            if handler not in logger.handlers:
                logger.addHandler(handler)


__all__ = ["log_to_run_file", "quiet_console"]
