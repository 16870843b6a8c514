"""A local Hugging Face Hub-compatible server for offline work and tests: `python -m framework.local_hub --root DIR`.

It speaks the part of the Hub API that `huggingface_hub` uses to create repos, commit, list and download files, so
`export HF_ENDPOINT=http://127.0.0.1:8765` points `python -m framework.hub push/pull`, `hub.repo_id=...` runs and
`from_pretrained` at it. It binds loopback addresses only, and needs only the standard library (PyYAML, when
installed, checks model-card metadata as the Hub does).
"""

from framework.local_hub.client import patch_client
from framework.local_hub.server import LocalHub, main

__all__ = ["LocalHub", "main", "patch_client"]
