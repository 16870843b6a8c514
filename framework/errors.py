"""The error types every part raises, and the one function that turns them into exit codes at the program's edge.

Parts below the command lines raise and never exit. Each `main` (`framework.train`, `.generate`, `.hub`,
`.metrics`, `.grow`, `.ls`) runs its work through `run_cli` (or `report_and_exit` inside Hydra), which prints one
`error:` line and returns the code from `exit_code`:

| code | meaning |
|---|---|
| 0 | done |
| 1 | the run failed (non-finite loss, a checkpoint that cannot be written, the Hub unreachable) |
| 2 | refused input: a bad name, value, file or checkpoint, found before anything was written |
| 3 | training finished and everything is on disk, but the push to the Hub failed |
| 130, 143, 138 | stopped by SIGINT (Ctrl-C), SIGTERM or SIGUSR1 (128 + the signal's number): a checkpoint was saved,
|     | `results.json` says `"status": "interrupted"` and the step, and the resume command was printed |
"""

from __future__ import annotations

import difflib
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_PUSH, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class InputError(ValueError):
    """Refused input (a setting, a file, a name): the message names the bad value and what would be valid."""


class PreflightError(InputError):
    """A run that would fail, found before anything is written; the message names the setting and what is valid."""


class BadSettingError(InputError):
    """A `key=value` override naming a setting that does not exist, or giving it a value of the wrong type."""


class UnknownNameError(LookupError):
    """An unknown registry name: says the kind, the bad name, the closest matches and every valid name."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        self.matches = difflib.get_close_matches(name, self.known, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(m) for m in self.matches)}?" if self.matches else ""
        super().__init__(f"Unknown {kind} {name!r}.{hint} Valid {kind} names: {', '.join(self.known) or '(none)'}")

    def __str__(self) -> str:  # LookupError would otherwise print the args tuple
        return self.args[0]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or used; the message says which file and why."""


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; the message names the step and the checkpoint to resume from."""


class UnsafeConfigError(ValueError):
    """A `config.json` that could do more than name a registered model and give it plain values."""


class UnsafeWeightsError(ValueError):
    """Weights that are not a safetensors file matching the config (pickles are refused, never opened)."""


class HubPushError(RuntimeError):
    """The Hub was unreachable or refused a push; `retry_command` (when known) re-runs it from the run dir."""

    def __init__(self, message: str, retry_command: str | None = None):
        super().__init__(message + (f" Retry with: {retry_command}" if retry_command else ""))
        self.retry_command = retry_command


class PushAfterTrainingError(RuntimeError):
    """Training finished and everything is on disk, but the push to the Hub failed (the message says how to retry)."""


class RunInterrupted(Exception):  # noqa: N818 - it is a stop, not a fault
    """A run stopped on request (signal `signum`: Ctrl-C, SIGTERM, SIGUSR1) after saving `checkpoint`; the resume
    command has been printed. Its exit code is the shell's for that signal, 128 + signum (130, 143, 138)."""

    def __init__(self, checkpoint: str, step: int, signum: int = signal.SIGINT):
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}; checkpoint {checkpoint}")
        self.checkpoint, self.step, self.signum = checkpoint, step, int(signum)


#: the mapping, first match wins; a type not listed is not ours to report (a bug: its traceback is shown)
EXIT_CODES: tuple[tuple[tuple[type[BaseException], ...], int], ...] = (
    ((RunInterrupted, KeyboardInterrupt), EXIT_INTERRUPTED),
    ((PushAfterTrainingError,), EXIT_PUSH),
    ((NonFiniteLossError, CheckpointError, HubPushError), EXIT_FAILED),
    ((InputError, UnknownNameError, UnsafeConfigError, UnsafeWeightsError, FileNotFoundError), EXIT_INPUT),
)
#: for the small command lines (generate, hub, grow, metrics, ls): what a library call raises on bad input, and
#: what the environment (the Hub, the disk) raises when it fails
PLAIN_CODES: tuple[tuple[tuple[type[BaseException], ...], int], ...] = (
    ((ValueError, TypeError, LookupError), EXIT_INPUT),
    ((OSError,), EXIT_FAILED),
)


def exit_code(err: BaseException, plain: bool = False) -> int | None:
    """The exit code for `err`, or None if it is not an error the edge reports (let it raise). `plain` also maps
    builtin ValueError/TypeError/LookupError (2) and OSError (1), as the small command lines do."""
    if isinstance(err, RunInterrupted):
        return 128 + err.signum
    for types, code in EXIT_CODES + (PLAIN_CODES if plain else ()):
        if isinstance(err, types):
            return code
    return None


def error_line(err: BaseException, code: int) -> str:
    """`error: ...` on one line, tokens redacted; a failure of the environment names its type."""
    message = " ".join(redact(str(err)).split())
    ours = isinstance(err, tuple(t for types, _ in EXIT_CODES for t in types))
    return f"error: {message}" if code == EXIT_INPUT or ours else f"error: {type(err).__name__}: {message}"


def redact(text: str) -> str:
    """`text` without the Hugging Face token, if one is set (it may appear in a URL or header in an error)."""
    try:
        from huggingface_hub import get_token

        token = get_token()
    except ImportError:
        token = None
    return text.replace(token, "***") if token else text


def report(err: BaseException, code: int) -> None:
    """Print the error line once (rank 0 of a multi-process run; the others stop with the same code)."""
    if isinstance(err, (RunInterrupted, KeyboardInterrupt)):
        return  # the interrupt handler printed where the checkpoint is and how to resume
    if _rank() == 0:
        print(error_line(err, code), file=sys.stderr, flush=True)


def _rank() -> int:
    """This process's global rank: Lightning's (set when its strategy starts), else the launcher's environment."""
    import os

    lightning_rank = sys.modules.get("lightning_utilities.core.rank_zero")
    rank = getattr(getattr(lightning_rank, "rank_zero_only", None), "rank", None)
    return int(rank) if rank is not None else int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0)


def run_cli(work: Callable[[], Any], plain: bool = True) -> int:
    """Run a command line's work: 0 when it returns, the mapped code (after one `error:` line) when it raises."""
    try:
        work()
    except BaseException as err:
        code = exit_code(err, plain)
        if code is None:
            raise
        report(err, code)
        return code
    return EXIT_OK


def report_and_exit(work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`work(...)`; an error the edge maps becomes one `error:` line and `SystemExit(code)` (Hydra's job runner
    passes SystemExit through, where it would print any other exception as a traceback and exit 1)."""
    try:
        return work(*args, **kwargs)
    except BaseException as err:
        code = exit_code(err)
        if code is None or isinstance(err, SystemExit):
            raise
        report(err, code)
        raise SystemExit(code) from None


__all__ = [
    "BadSettingError", "CheckpointError", "EXIT_CODES", "EXIT_FAILED", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_OK",
    "EXIT_PUSH", "HubPushError", "InputError", "NonFiniteLossError", "PreflightError", "PushAfterTrainingError",
    "RunInterrupted", "UnknownNameError", "UnsafeConfigError", "UnsafeWeightsError", "error_line", "exit_code",
    "redact", "report", "report_and_exit", "run_cli",
]
