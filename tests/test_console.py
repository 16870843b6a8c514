"""The console of `python -m framework.train` (framework.console): the HTTP client's line per Hub request is off by
default and a level the user set is kept (the CLI side: tests/hf/test_sft_cli.py's README run logs none)."""

from __future__ import annotations

import logging

from framework.console import HTTP_LOGGERS, quiet_console


def test_http_request_lines_are_off_by_default_and_a_level_the_user_set_is_kept():
    loggers = [logging.getLogger(name) for name in HTTP_LOGGERS]
    before = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
        quiet_console()
        assert all(logger.level == logging.WARNING for logger in loggers)
        assert not loggers[1].isEnabledFor(logging.INFO)  # "HTTP Request: ..." is an INFO line
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
        loggers[1].setLevel(logging.DEBUG)  # as `hydra.verbose=[httpx,httpx2]` sets it
        quiet_console()
        assert loggers[1].level == logging.DEBUG and loggers[0].level == logging.WARNING
    finally:
        for logger, level in zip(loggers, before, strict=True):
            logger.setLevel(level)
