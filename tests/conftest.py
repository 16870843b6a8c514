"""Shared fixtures. The catalog is filled at import time: parametrize lists are built at collection."""

from __future__ import annotations

import pytest
import torch

from framework.train import register_app

register_app()
torch.set_num_threads(1)

from helpers import run_cli  # noqa: E402


@pytest.fixture
def cli():
    return run_cli
