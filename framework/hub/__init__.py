"""Publish trained models to the Hugging Face Hub and load them back by name (timm/torchtune style).

A push is ONE commit holding `model.safetensors`, `config.json` (a registry name plus plain constructor values,
a timm model in timm's own format, or a plain module's saved hyperparameters; never an import path), a
`README.md` model card (metadata, final metrics, the training-curve plot) and, from a run dir,
`train_config.yaml`. `from_pretrained` validates `config.json` before anything is built, rebuilds the
model by name (`build=`, the registered model by default, or `model_cls=`) and loads safetensors only: nothing from the
Hub is ever unpickled. Importing `framework.hub` imports neither the catalog nor Hydra.

    python -m framework.hub push RUN_DIR REPO_ID [--revision R] [--private]
    python -m framework.hub pull REPO_ID [--revision R]
"""

from framework.hub.cli import main
from framework.hub.common import HubPushError, NotPushableError, Pushed, UnsafeConfigError, UnsafeWeightsError
from framework.hub.load import (
    Loaded,
    build_model,
    download,
    from_pretrained,
    load_config,
    load_model,
    load_weights_into,
    registered_model,
    validate_config,
)
from framework.hub.push import check_repo_id, push_to_hub, record_push, redact, retry_command
from framework.hub.pushable import Pushable, pushable

__all__ = [
    "HubPushError", "Loaded", "NotPushableError", "Pushable", "Pushed", "UnsafeConfigError", "UnsafeWeightsError",
    "build_model", "check_repo_id", "download", "from_pretrained", "load_config", "load_model", "load_weights_into",
    "main", "push_to_hub", "pushable", "record_push", "redact", "registered_model", "retry_command", "validate_config",
]
