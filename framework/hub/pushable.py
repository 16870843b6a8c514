"""What a live module pushes: which model, in which config.json format, decided before anything is trained or
uploaded (`HubPush.setup` asks the same question, so an unpushable module stops the fit before step 1)."""

from __future__ import annotations

import shlex
import sys
from typing import Any, NamedTuple

from torch import nn

from framework import __version__
from framework.hub.common import NotPushableError
from framework.hub.formats import (
    FRAMEWORK,
    PLAIN,
    TIMM,
    TRANSFORMERS,
    saved_hparams,
    timm_architecture,
    timm_config,
)
from framework.hub.load import validate_config

HOW = ("give it a framework model (`.init_config`, or a `.model` with one), a timm model (timm.create_model, or"
       " a `.model` built by it), or call self.save_hyperparameters() in its __init__ so its constructor arguments"
       " are saved")


class Pushable(NamedTuple):
    """The model a push publishes, its config.json format and the config.json itself (validated)."""

    format: str
    model: nn.Module
    config: dict[str, Any]

    @property
    def name(self) -> str:
        """The model's registry name, timm architecture, or class name."""
        return str(self.config.get("architecture") or self.config.get("name"))


def pushable(module: nn.Module, info: dict[str, Any] | None = None) -> Pushable:
    """What pushing `module` would publish; NotPushableError (a ValueError) naming its class and what would
    make it pushable when it is none of: a framework model, a timm model, a module with saved hyperparameters."""
    info = info or {}
    extra = {"framework_version": __version__, "recipe": info.get("recipe"),
             "command": info.get("command") or " ".join(shlex.quote(a) for a in ["python", *sys.argv])}
    what = type(module).__name__
    if info.get("model_config") is not None:  # a sub-model whose constructor values the caller states
        return _stated(module, info, extra)
    try:
        fmt, model = _pick(module)
        if fmt in (FRAMEWORK, TRANSFORMERS):  # a transformers model's goes to framework.json
            config = {"name": _framework_name(model, info), "config": dict(model.init_config), **extra}
        elif fmt == TIMM:
            config = {**timm_config(model, info.get("label_names")), **extra}  # the data's class names
        else:
            config = {"format": PLAIN, "name": what, "config": saved_hparams(module), **extra}
        return Pushable(fmt, model, validate_config(config))
    except NotPushableError:
        raise
    except (ValueError, LookupError) as err:
        raise NotPushableError(f"{what} cannot be pushed to the Hub: {err}") from err


def _stated(module: nn.Module, info: dict[str, Any], extra: dict[str, Any]) -> Pushable:
    """`info["model_attr"]` of `module` (the module itself without it), pushed in the plain format with the
    constructor values `info["model_config"]` (a project whose LightningModule gets its net already built, as
    lightning-hydra-template's does, states the net's values: `info={"model_attr": "net", "model_config": {...}}`)."""
    attr = info.get("model_attr")
    model = getattr(module, str(attr), None) if attr else module
    if not isinstance(model, nn.Module):
        raise NotPushableError(f"{type(module).__name__} has no sub-model {attr!r} to push (info['model_attr'])")
    values = _plain(info["model_config"])
    if not isinstance(values, dict) or any(str(k).startswith("_") for k in values):
        raise NotPushableError(f"info['model_config'] must be the constructor values of {type(model).__name__} (plain"
                               f" keys, no _target_), got {values!r}")
    config = {"format": PLAIN, "name": type(model).__name__, "config": values, **extra}
    return Pushable(PLAIN, model, validate_config(config))


def _plain(value: Any) -> Any:
    """Mappings and sequences (an OmegaConf node from a Hydra config included) as plain dicts and lists."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _pick(module: nn.Module) -> tuple[str, nn.Module]:
    inner = getattr(module, "model", None)
    inner = inner if isinstance(inner, nn.Module) else None
    for candidate in (module, inner):  # timm first: `model=timm` records an init_config on the timm model too
        if candidate is not None and timm_architecture(candidate):
            return TIMM, candidate
    for candidate in (module, inner):
        if candidate is not None and hasattr(candidate, "init_config"):
            return (TRANSFORMERS if _is_hf(candidate) else FRAMEWORK), candidate
    if saved_hparams(module):
        return PLAIN, module
    raise NotPushableError(f"{type(module).__name__} cannot be pushed to the Hub: it is no framework model, no timm"
                           f" model and saved no hyperparameters; to make it pushable, {HOW}")


def _is_hf(model: nn.Module) -> bool:
    """A transformers model wrapped by `framework.models.hf` (checked without importing transformers)."""
    return any(c.__module__ == "framework.models.hf" for c in type(model).__mro__)


def _framework_name(model: nn.Module, info: dict[str, Any]) -> str:
    if info.get("model_name"):
        return str(info["model_name"])
    from framework.registry import MODELS, load_catalog

    load_catalog()
    try:
        return MODELS.name_of(type(model))
    except LookupError as err:
        raise NotPushableError(f"{type(model).__name__} is not registered in the model catalog, so config.json"
                               " cannot name it: register it, or pass info={'model_name': ...}") from err


__all__ = ["HOW", "Pushable", "pushable"]
