"""Publish trained models to the Hugging Face Hub and load them back by name (timm/torchtune style).

A push is ONE commit holding `model.safetensors`, `config.json` (a registry name plus plain constructor values,
never an import path), a `README.md` model card (metadata, final metrics, the training-curve plot) and, from a
run dir, `train_config.yaml`. `from_pretrained` validates `config.json` before anything is built, rebuilds the
model through the registry and loads safetensors only: nothing from the Hub is ever unpickled.

    python -m framework.hub push RUN_DIR REPO_ID [--revision R] [--private]
    python -m framework.hub pull REPO_ID [--revision R]
"""

from framework.hub.cli import main
from framework.hub.common import HubPushError, Pushed, UnsafeConfigError, UnsafeWeightsError
from framework.hub.load import from_pretrained, load_config, load_weights_into, state_from_checkpoint, validate_config
from framework.hub.push import check_repo_id, push_to_hub, record_push, retry_command

__all__ = [
    "HubPushError", "Pushed", "UnsafeConfigError", "UnsafeWeightsError", "check_repo_id", "from_pretrained",
    "load_config", "load_weights_into", "main", "push_to_hub", "record_push", "retry_command", "state_from_checkpoint",
    "validate_config",
]
