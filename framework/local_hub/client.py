"""`patch_client`: point this process's `huggingface_hub` client at a `LocalHub` (for tests and notebooks)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def patch_client(url: str, cache_dir: str | Path, token: str = "local-token") -> Iterator[None]:
    """Point the in-process `huggingface_hub` client at `url` with its cache in `cache_dir`; restores on exit.

    Patches the constants read at call time, the module-level `HfApi` (whose endpoint froze at import),
    transformers' shared `HfApi` (its endpoint froze at its first Hub call: left stale, each tokenizer load retried
    a stopped server for 23 s, or read another hub), and `datasets`' endpoint if it is imported already (else it
    reads the `HF_ENDPOINT` set here when it is),
    sets `HF_TOKEN` to a dummy so a real token is never sent to the local server, and points `HF_XET_CACHE`
    (read when the process first opens a Xet session, e.g. by `upload_folder`) at `cache_dir/xet`.
    """
    from huggingface_hub import constants, hf_api

    url = url.rstrip("/")
    attrs = {(constants, "ENDPOINT"): url,
             (constants, "HUGGINGFACE_CO_URL_TEMPLATE"): url + "/{repo_id}/resolve/{revision}/{filename}",
             (constants, "HF_HUB_CACHE"): str(cache_dir), (constants, "HF_HUB_DISABLE_TELEMETRY"): True}
    if hasattr(hf_api, "api"):
        attrs[(hf_api.api, "endpoint")] = url
    shared = _transformers_client()
    if shared is not None:
        attrs[(shared, "endpoint")] = url
    datasets_config = sys.modules.get("datasets.config")  # `datasets` froze HF_ENDPOINT at import (if imported yet)
    if datasets_config is not None:
        attrs[(datasets_config, "HF_ENDPOINT")] = url
        attrs[(datasets_config, "HUB_DATASETS_URL")] = url + "/datasets/{repo_id}/resolve/{revision}/{path}"
    env = {"HF_ENDPOINT": url, "HF_TOKEN": token, "HF_HUB_CACHE": str(cache_dir),
           "HF_XET_CACHE": str(Path(cache_dir) / "xet"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    saved_attrs = {key: getattr(*key) for key in attrs}
    saved_env = {key: os.environ.get(key) for key in env}
    try:
        for (obj, name), value in attrs.items():
            setattr(obj, name, value)
        os.environ.update(env)
        yield
    finally:
        for (obj, name), value in saved_attrs.items():
            setattr(obj, name, value)
        made = _transformers_client()  # first made inside the block (transformers imported there): back too
        if made is not None and made is not shared:
            made.endpoint = constants.ENDPOINT
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _transformers_client() -> object | None:
    """transformers' shared `HfApi` (`transformers.utils.hub.hf_api()`), None where transformers is not imported."""
    hub = sys.modules.get("transformers.utils.hub")
    make = getattr(hub, "hf_api", None)
    return make() if callable(make) else None
