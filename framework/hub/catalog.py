"""The catalog's side of the Hub: models built and named by registry name (this imports the catalog and hydra-zen).

Entry points (`python -m framework.train`, `framework.hub`, `framework.generate`, `framework.grow`) pass these
to the Hub; `framework.hub` falls back to them only when a caller gives neither `build` nor `model_cls`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from framework.hub.load import check_values
from framework.registry import MODELS, load_catalog


def build(name: str, config: dict[str, Any]) -> nn.Module:
    """Registered model `name` built with `config` (UnknownNameError, a LookupError, for an unknown name)."""
    load_catalog()
    check_values(name, MODELS.get(name), config)
    return MODELS.build(name, **config)


def name_of(model: nn.Module) -> str:
    """The registry name of `model`'s class."""
    load_catalog()
    return MODELS.name_of(type(model))
