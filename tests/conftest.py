"""Shared fixtures. The catalog is filled at import time: parametrize lists are built at collection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi
from support.local_hub import LocalHub, patch_client

from framework.app import register_app

register_app()
torch.set_num_threads(1)

from helpers import run_cli  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The `long` tests first (in their order), so neither xdist worker is left alone with one at the end."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory):
    """The packed-data cache of `data=text` / `chat` in a folder of this session (and of every CLI the tests start:
    they inherit os.environ), never the user's ~/.cache/framework/data. A test may still point it elsewhere."""
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("data-cache")
        mp.setenv("FRAMEWORK_DATA_CACHE", str(folder))
        yield folder


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A LocalHub for the test module, with the in-process client pointed at it: `.server`, `.url`, `.api`, `.root`."""
    root = tmp_path_factory.mktemp("hub")
    server = LocalHub(root / "repos").start()
    try:
        with patch_client(server.url, root / "cache", token="dummy"):
            yield SimpleNamespace(server=server, url=server.url, api=HfApi(endpoint=server.url), root=root)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _guide_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("guide-hub")
    server = LocalHub(root / "repos").start()
    try:
        yield server, root
    finally:
        server.stop()


@pytest.fixture
def guide_hub(_guide_server):
    """The Hub of the guides' reader: one LocalHub for the session (every guide test of it pushes and pulls there,
    as one reader does, and one warm CLI server serves their small runs), the in-process client pointed at it for
    the test (not the module: the module's other tests keep the environment the warm CLI server was started in);
    `.home` is the reader's HF_HOME. Otherwise as `hub`."""
    server, root = _guide_server
    with patch_client(server.url, root / "cache", token="dummy"):
        yield SimpleNamespace(server=server, url=server.url, api=HfApi(endpoint=server.url), root=root,
                              home=root / "hf_home")
