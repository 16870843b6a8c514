"""Shared pieces of the Hub integration: file names, the refused keys and the error types."""

from __future__ import annotations

import re
from dataclasses import dataclass

CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"
PLOT_NAME, TRAIN_CONFIG_NAME = "training_curves.png", "train_config.yaml"
ARTIFACTS = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, PLOT_NAME, TRAIN_CONFIG_NAME)
#: Hydra/hydra-zen instantiation keys: a config carrying one could make a loader import and call anything.
FORBIDDEN_KEYS = frozenset({"_target_", "_partial_", "_args_", "_recursive_", "_convert_"})
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class UnsafeConfigError(ValueError):
    """A `config.json` that could do more than name a registered model and give it plain values."""


class UnsafeWeightsError(ValueError):
    """Weights that are not a safetensors file matching the config (pickles are refused, never opened)."""


class HubPushError(RuntimeError):
    """The Hub was unreachable or refused a push; `retry_command` (when known) re-runs it from the run dir."""

    def __init__(self, message: str, retry_command: str | None = None):
        super().__init__(message + (f" Retry with: {retry_command}" if retry_command else ""))
        self.retry_command = retry_command


@dataclass(frozen=True)
class Pushed:
    """Where one push landed: the commit id stays downloadable (`from_pretrained(repo_id, revision=commit)`)."""

    repo_id: str
    revision: str
    commit: str
    url: str

