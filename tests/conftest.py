"""Shared fixtures. The catalog is filled before collection (`pytest_sessionstart`): parametrize lists are built then.

Under xdist the process that hands tests to the workers runs none of them, so it imports none of what they need
(torch, Lightning, the catalog: about 8 s of one core, before any worker could start): only the processes that
collect tests do (the workers, or the one process without `-n`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def pytest_sessionstart(session):
    """The catalog and one thread, before collection; not in xdist's controller ("dsession"), which collects none."""
    if session.config.pluginmanager.hasplugin("dsession"):
        return
    import torch

    from framework.app import register_app

    register_app()
    torch.set_num_threads(1)


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
    from helpers import run_cli

    return run_cli


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A LocalHub for the test module, with the in-process client pointed at it: `.server`, `.url`, `.api`, `.root`."""
    from huggingface_hub import HfApi
    from support.local_hub import LocalHub, patch_client

    root = tmp_path_factory.mktemp("hub")
    server = LocalHub(root / "repos").start()
    try:
        with patch_client(server.url, root / "cache", token="dummy"):
            yield SimpleNamespace(server=server, url=server.url, api=HfApi(endpoint=server.url), root=root)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _guide_server(tmp_path_factory):
    from support.local_hub import LocalHub

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
    from huggingface_hub import HfApi
    from support.local_hub import patch_client

    server, root = _guide_server
    with patch_client(server.url, root / "cache", token="dummy"):
        yield SimpleNamespace(server=server, url=server.url, api=HfApi(endpoint=server.url), root=root,
                              home=root / "hf_home")
