"""The three `config.json` formats the Hub integration reads and writes.

- framework: `{"name": <registry name>, "config": {...}}`, rebuilt through the model catalog (or `build=`);
- timm: `{"architecture": <timm model name>, "num_classes", "model_args", "pretrained_cfg", ...}` as
  `timm.models.push_to_hf_hub` writes it, rebuilt by `timm.create_model(architecture, pretrained=False, ...)`; a push
  describes the weights it publishes, so the facts of the checkpoint timm's default config names (ImageNet's tag, Hub
  id, licence, paper, label names, test-time sizes: `TIMM_SOURCE_KEYS`) are left out and the data's class names go in
  `label_names`;
- plain: `{"format": "plain", "name": <the class's __name__, a label>, "config": <saved hyperparameters>}`, rebuilt
  by the user's own class (`model_cls=`), as the model card's snippet shows;
- transformers: the config `save_pretrained` writes (`model_type`, `architectures`, ...), beside the weights and
  tokenizer in transformers' own layout, so `AutoModelForCausalLM.from_pretrained` opens the repo unchanged; the
  framework's own {"name", "config"} rides along in `framework.json` (`framework.models.hf`).

None of them holds an import path; timm is imported only when a config or a model is timm's.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from framework.hub.common import UnsafeConfigError

FRAMEWORK, TIMM, PLAIN, TRANSFORMERS = "framework", "timm", "plain", "transformers"
#: a transformers push's framework config ({"name", "config", ...}): config.json is transformers' own there
FRAMEWORK_CONFIG_NAME = "framework.json"
#: pretrained_cfg keys that name a module *inside* the model (`patch_embed.proj`): attribute paths, never imported
TIMM_INFO_KEY = "pretrained_cfg"
#: pretrained_cfg keys that describe the checkpoint a timm architecture's default config names (where its weights
#: live, their tag, licence, paper, the classes and test-time sizes they were evaluated with), not the weights a push
#: publishes; kept: what rebuilds and preprocesses the model (input size, interpolation, mean, std, crop, num_classes)
TIMM_SOURCE_KEYS = ("url", "file", "hf_hub_id", "hf_hub_filename", "source", "tag", "license", "description",
                    "origin_url", "paper_name", "paper_ids", "notes", "label_names", "label_descriptions",
                    "label_offset", "test_input_size", "test_crop_pct", "test_pool_size")


class ModelSpec(NamedTuple):
    """What a validated config.json builds: its format, the model's name and its constructor values."""

    format: str
    name: str  # registry name, timm architecture, or (plain) the class's __name__
    values: dict[str, Any]


def config_format(config: dict[str, Any]) -> str:
    """`plain`, `timm` (an `architecture` and no `name`) or `framework`."""
    if config.get("format") == PLAIN:
        return PLAIN
    if "model_type" in config and "name" not in config:
        return TRANSFORMERS
    if "architecture" in config and "name" not in config:
        return TIMM
    return FRAMEWORK


def model_spec(config: dict[str, Any]) -> ModelSpec:
    """The name and constructor values of a validated config.json, whatever its format."""
    fmt = config_format(config)
    if fmt == TRANSFORMERS:
        kind = "hf_masked_lm" if any(str(a).endswith("ForMaskedLM") for a in config.get("architectures") or []) \
            else "hf_causal_lm"
        return ModelSpec(fmt, kind, {})
    if fmt == TIMM:
        values = {"num_classes": config["num_classes"]} if "num_classes" in config else {}
        return ModelSpec(fmt, config["architecture"], {**values, **config.get("model_args", {})})
    return ModelSpec(fmt, config["name"], dict(config.get("config", {})))


def check_timm_config(config: dict[str, Any]) -> None:
    """UnsafeConfigError unless `architecture` is a model name timm knows and the build values are plain."""
    arch = config.get("architecture")
    if not isinstance(arch, str) or not arch:
        raise UnsafeConfigError(f"config.json 'architecture' must be a timm model name (a string), got {arch!r}")
    import timm

    if not timm.is_model(arch) or arch != timm.models.get_arch_name(arch):
        raise UnsafeConfigError(f"config.json 'architecture' = {arch!r} is not a model timm {timm.__version__} knows"
                                " (timm.is_model); only timm's own model names are built, never an import path")
    num_classes = config.get("num_classes")
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)):
        raise UnsafeConfigError(f"config.json 'num_classes' must be an integer, got {num_classes!r}")
    for key in ("model_args", TIMM_INFO_KEY):
        if not isinstance(config.get(key, {}), dict):
            raise UnsafeConfigError(f"config.json {key!r} must be an object, got {config[key]!r}")


def timm_pretrained_cfg(config: dict[str, Any]) -> dict[str, Any]:
    """A timm config.json's `pretrained_cfg` with its top-level `num_classes`, `label_names` and `label_descriptions`
    in it, as `timm.create_model("hf-hub:...")` reads them."""
    cfg = dict(config.get(TIMM_INFO_KEY) or {})
    cfg.update({k: config[k] for k in ("num_classes", "label_names", "label_descriptions") if k in config})
    return cfg


def timm_model(name: str, values: dict[str, Any], pretrained_cfg: dict[str, Any] | None = None) -> nn.Module:
    """`timm.create_model(name, pretrained=False, **values)` with the repo's pretrained_cfg (input size, mean, std)."""
    import timm

    try:
        return timm.create_model(name, pretrained=False, pretrained_cfg=dict(pretrained_cfg or {}) or None, **values)
    except TypeError as err:
        raise UnsafeConfigError(f"config.json's model_args do not fit timm model {name!r}: {err}") from err


def timm_architecture(model: nn.Module) -> str | None:
    """The timm model name `model` was built as (`model.pretrained_cfg['architecture']`), None for other models."""
    cfg = getattr(model, "pretrained_cfg", None)
    arch = cfg.get("architecture") if isinstance(cfg, dict) else None
    if not isinstance(arch, str) or not hasattr(model, "num_classes"):
        return None
    import timm

    return arch if timm.is_model(arch) else None


def timm_config(model: nn.Module, label_names: Any = None) -> dict[str, Any]:
    """The config.json timm's own `save_for_hf` / `push_to_hf_hub` writes for `model`, describing `model`'s weights:
    a `model=timm` model's `pretrained_cfg` states the input size it was trained at (its `init_config`'s
    `input_shape`, from the data); the source checkpoint's facts (`TIMM_SOURCE_KEYS`) are left out, and
    `label_names` (the data's class names, one per output) go in when they fit `num_classes`."""
    from timm.models._hub import save_config_for_hf

    shape = (getattr(model, "init_config", None) or {}).get("input_shape")
    data_config = {"input_size": tuple(shape)} if shape else None
    labels = fitting_labels(label_names, getattr(model, "num_classes", None))
    with tempfile.TemporaryDirectory(prefix="framework-timm-") as tmp:
        path = Path(tmp) / "config.json"
        save_config_for_hf(model, str(path), model_config={"label_names": labels} if labels else None,
                           data_config=data_config)
        config = json.loads(path.read_text())
    config[TIMM_INFO_KEY] = {k: v for k, v in config.get(TIMM_INFO_KEY, {}).items() if k not in TIMM_SOURCE_KEYS}
    return config


def fitting_labels(names: Any, num_classes: Any) -> list[str] | None:
    """`names` as a list when it names each of `num_classes` outputs with a string (None otherwise: a truncated or
    missing list says nothing about the classifier)."""
    if not isinstance(names, (list, tuple)) or not names or len(names) != num_classes:
        return None
    return list(names) if all(isinstance(n, str) for n in names) else None


def saved_hparams(module: nn.Module) -> dict[str, Any] | None:
    """The constructor arguments Lightning saved (`save_hyperparameters()`), as JSON values; None if none were."""
    hparams = getattr(module, "hparams", None)
    if not hparams or not hasattr(hparams, "items"):
        return None
    values = dict(hparams.items())
    for key, value in values.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise ValueError(f"{type(module).__name__}'s saved hyperparameter {key!r} = {value!r} is not a plain JSON"
                             " value; pass only plain values to its constructor (or exclude it with"
                             f" save_hyperparameters(ignore=[{key!r}]))") from None
    return json.loads(json.dumps(values))  # tuples become lists, as config.json stores them


__all__ = [
    "FRAMEWORK", "FRAMEWORK_CONFIG_NAME", "ModelSpec", "PLAIN", "TIMM", "TRANSFORMERS", "TIMM_INFO_KEY",
    "TIMM_SOURCE_KEYS", "check_timm_config", "config_format", "fitting_labels", "model_spec", "saved_hparams",
    "timm_architecture", "timm_config", "timm_model", "timm_pretrained_cfg",
]
