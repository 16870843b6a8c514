"""Fixtures the data tests share."""

import pytest


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh data cache folder for the test (FRAMEWORK_DATA_CACHE)."""
    monkeypatch.setenv("FRAMEWORK_DATA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
