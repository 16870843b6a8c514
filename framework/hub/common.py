"""Shared pieces of the Hub integration: file names, the refused keys, the model-argument check; the error types
(defined in `framework.errors`) are re-exported here."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

from framework.errors import HubPushError, UnsafeConfigError, UnsafeWeightsError

CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"
PLOT_NAME, TRAIN_CONFIG_NAME = "training_curves.png", "train_config.yaml"
#: what a push may leave in a repo; one of them that this push lacks is deleted (a plot, a transformers push's extras)
ARTIFACTS = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, PLOT_NAME, TRAIN_CONFIG_NAME, "framework.json",
             "generation_config.json")
#: Hydra/hydra-zen instantiation keys: a config carrying one could make a loader import and call anything.
FORBIDDEN_KEYS = frozenset({"_target_", "_partial_", "_args_", "_recursive_", "_convert_"})
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_model_args(name: str, target: Any, values: dict[str, Any]) -> None:
    """UnsafeConfigError if `values` sets an argument that `target` (model `name`) does not take."""
    params = inspect.signature(target).parameters
    unknown = sorted(set(values) - set(params))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise UnsafeConfigError(
            f"config.json sets {', '.join(unknown)}, which model {name!r} does not take; valid: {', '.join(params)}")


class NotPushableError(ValueError, TypeError):
    """A module that cannot be pushed: no framework model, no timm model, no saved hyperparameters (the message says
    which class and what would make it pushable)."""


@dataclass(frozen=True)
class Pushed:
    """Where one push landed: the commit id stays downloadable (`from_pretrained(repo_id, revision=commit)`)."""

    repo_id: str
    revision: str
    commit: str
    url: str


__all__ = [
    "ARTIFACTS", "CARD_NAME", "CONFIG_NAME", "FORBIDDEN_KEYS", "HubPushError", "IMPORT_PATH", "NotPushableError",
    "PLOT_NAME", "Pushed", "TRAIN_CONFIG_NAME", "UnsafeConfigError", "UnsafeWeightsError", "WEIGHTS_NAME",
    "check_model_args",
]
