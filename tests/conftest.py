"""Shared fixtures. The catalog is filled at import time: parametrize lists are built at collection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from framework.train import register_app

register_app()
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, module: str = "framework.train", timeout: int = 600, env: dict | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m MODULE ARGS` the way a user would; returns the finished process (text output)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
        env=full_env, cwd=cwd or REPO,
    )


@pytest.fixture
def cli():
    return run_cli
