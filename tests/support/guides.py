"""Run a task guide (docs/guides/NAME.md) the way its reader does: its blocks in order, in the reader's folder, with
the reader's environment pointed at a local Hub.

Two ways, one per suite. `small=False` (make test-slow): each line as printed in a fresh `python` process, with the
shell's own environment (no smoke size, torch's own thread count). `small=True` (make test): the same lines, their
training runs shortened by the test, each in a process forked from a warm one (`support.warm_cli`: a `framework.*`
command or a `python -c` snippet runs as `__main__` in a child of the train CLI's server, which has done the imports),
one thread each; every guide test of a session shares one Hub and one HF_HOME (`guide_hub`), so one warm server
serves them all, as one reader's machine runs every guide."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from helpers import guide

from support import warm_cli


def blocks(name: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the guide, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", guide(name), flags=re.M | re.S)


def command_lines(name: str, comments: bool = False) -> list[list[str]]:
    """Every command line of the guide's bash blocks, split as a shell would (`comments`: `#` comments dropped)."""
    return [shlex.split(line, comments=comments) for lang, code in blocks(name) if lang == "bash"
            for line in code.splitlines() if line.strip()]


def reader_env(hub, home: Path, small: bool, **extra: str) -> dict[str, str]:
    """The reader's shell environment: the local Hub as their Hub (`HF_ENDPOINT`, a token, `home` as HF_HOME), at
    the small size one thread and unbuffered output (the warm server's), as printed torch's own thread count."""
    hf = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(home)}
    base = {k: v for k, v in os.environ.items() if k not in ("FRAMEWORK_SMOKE", "OMP_NUM_THREADS")}
    if small:
        base.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return {**base, **hf, **extra}


def run_line(argv: list[str], cwd: Path, env: dict[str, str], small: bool, timeout: int = 1200
             ) -> subprocess.CompletedProcess:
    """`python -m MODULE ...` or `python -c CODE` as printed (a fresh process), or at the small size forked warm."""
    assert argv[0] == "python" and argv[1] in ("-m", "-c"), argv
    if not small:
        return subprocess.run([sys.executable, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    module = argv[2] if argv[1] == "-m" else "-c"
    args = argv[3:] if argv[1] == "-m" else argv[2:]
    return warm_cli.run(module, args, env, cwd, timeout=timeout, via="framework.train")


def run_python(code: str, cwd: Path, env: dict[str, str], small: bool, timeout: int = 600
               ) -> subprocess.CompletedProcess:
    """A guide's Python block, as a reader pastes it into a fresh `python` (small: forked warm)."""
    return run_line(["python", "-c", code], cwd, env, small, timeout)


def outputs(cwd: Path) -> set[Path]:
    """The results.json files under `cwd/outputs` now (a run dir per training line)."""
    return set((cwd / "outputs").rglob("results.json")) if (cwd / "outputs").exists() else set()


def new_results(cwd: Path, before: set[Path]) -> dict:
    """The results.json of the one run made since `before = outputs(cwd)`."""
    new = sorted(outputs(cwd) - before)
    assert len(new) == 1, new
    return json.loads(new[0].read_text())
