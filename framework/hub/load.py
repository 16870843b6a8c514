"""Loading from the Hub: validate `config.json`, rebuild through the registry, load safetensors only."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from framework import __version__
from framework.hub.common import (
    _IMPORT_PATH,
    CONFIG_NAME,
    FORBIDDEN_KEYS,
    WEIGHTS_NAME,
    UnsafeConfigError,
    UnsafeWeightsError,
)
from framework.registry import MODELS, UnknownNameError, load_catalog


# ---- config.json: what may be loaded -------------------------------------------------------------------
def validate_config(config: Any) -> dict[str, Any]:
    """Return `config` if it only names a registered model and plain values; raise UnsafeConfigError otherwise."""
    if not isinstance(config, dict):
        raise UnsafeConfigError(f"config.json must be a JSON object, got {type(config).__name__}")
    _check_plain(config, "config.json")
    name, values = config.get("name"), config.get("config", {})
    if not isinstance(name, str):
        raise UnsafeConfigError(f"config.json 'name' must be a registered model name (a string), got {name!r}")
    if not isinstance(values, dict):
        raise UnsafeConfigError(f"config.json 'config' must be an object of constructor values, got {values!r}")
    load_catalog()
    try:
        target = MODELS.get(name)
    except UnknownNameError as err:
        raise UnsafeConfigError(f"config.json names an unregistered model: {err}") from err
    params = inspect.signature(target).parameters
    unknown = sorted(set(values) - set(params))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise UnsafeConfigError(
            f"config.json sets {', '.join(unknown)}, which model {name!r} does not take; valid: {', '.join(params)}")
    return config


def _check_plain(node: Any, where: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in FORBIDDEN_KEYS or (isinstance(key, str) and len(key) > 2 and key[0] == key[-1] == "_"):
                raise UnsafeConfigError(
                    f"{where} has key {key!r}: instantiation keys ({', '.join(sorted(FORBIDDEN_KEYS))}) are refused;"
                    " config.json may only hold a registry 'name' and plain constructor values"
                )
            _check_plain(value, f"{where}[{key!r}]")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_plain(value, f"{where}[{i}]")
    elif isinstance(node, str) and _IMPORT_PATH.match(node):
        raise UnsafeConfigError(
            f"{where} = {node!r} looks like an import path; config.json may only hold a registry name and plain"
            " values, never a module, class or function path"
        )
    elif node is not None and not isinstance(node, (str, bool, int, float)):
        raise UnsafeConfigError(f"{where} = {node!r} is not a plain JSON value")


def _build(config: dict[str, Any]) -> nn.Module:
    """The model a validated `config.json` names, built through the registry (no import path involved)."""
    return MODELS.build(config["name"], **config.get("config", {}))


# ---- loading -----------------------------------------------------------------------------------------------
def _download(repo_id: str, filename: str, revision: str | None) -> str:
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id, filename, revision=revision, library_name="framework", library_version=__version__)


def _fetch_config(repo_id: str, revision: str | None) -> tuple[dict[str, Any], str | None]:
    path = Path(_download(repo_id, CONFIG_NAME, revision))
    commit = path.parent.name if re.fullmatch(r"[0-9a-f]{40}", path.parent.name) else None  # snapshots/<sha>/
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UnsafeConfigError(f"{CONFIG_NAME} of {repo_id}@{revision or 'main'} is not valid JSON: {err}") from err
    return validate_config(config), commit


def load_config(repo_id: str, revision: str | None = None) -> dict[str, Any]:
    """Download and validate `config.json` (UnsafeConfigError if it is anything but a name and plain values)."""
    return _fetch_config(repo_id, revision)[0]


def from_pretrained(repo_id: str, revision: str | None = None) -> nn.Module:
    """Rebuild the model named in `repo_id`'s config.json through the registry and load its safetensors weights.

    `revision` is a branch, tag or commit id. The model comes back in eval mode, with `.init_config`.
    """
    return _load(repo_id, revision)[0]


def _load(repo_id: str, revision: str | None) -> tuple[nn.Module, dict[str, Any], str | None, str]:
    from huggingface_hub.errors import EntryNotFoundError
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model

    config, commit = _fetch_config(repo_id, revision)  # validated before anything else is downloaded or built
    where = f"{repo_id}@{commit or revision or 'main'}"
    try:
        weights = _download(repo_id, WEIGHTS_NAME, commit or revision)  # same commit as config.json
    except EntryNotFoundError as err:
        raise UnsafeWeightsError(f"{where} has no {WEIGHTS_NAME}; framework loads safetensors only and never"
                                 " unpickles (pytorch_model.bin, *.pt, *.ckpt are refused)") from err
    try:
        with safe_open(weights, framework="pt") as f:
            list(f.keys())
    except (SafetensorError, OSError, ValueError) as err:
        raise UnsafeWeightsError(f"{WEIGHTS_NAME} of {where} is not a safetensors file ({err}); refusing it"
                                 " (pickles are never loaded)") from err
    model = _build(config)
    try:
        load_model(model, weights, strict=True)
    except (RuntimeError, SafetensorError) as err:
        raise UnsafeWeightsError(f"{WEIGHTS_NAME} of {where} does not fit model {config['name']!r}: {err}") from err
    return model.eval(), config, commit, weights



# ---- local checkpoints and init_from --------------------------------------------------------------------------
def state_from_checkpoint(ckpt_path: str | Path) -> dict[str, torch.Tensor]:
    """The backbone's state_dict from a Lightning checkpoint (`weights_only=True`: nothing is unpickled)."""
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UnsafeWeightsError(f"cannot load {ckpt_path} with weights_only=True: {err}") from err
    state = ckpt.get("state_dict", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        raise UnsafeWeightsError(f"{ckpt_path} holds no state_dict")
    if any(k.startswith("model.") for k in state):  # a LightningModule's keys: keep its backbone `.model`
        state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    if any("lora_" in k for k in state):  # a LoRA fine-tune: fold the adapters into plain weights
        from framework.models.lora import merge_lora_state

        state = merge_lora_state(state)
    return state


def load_weights_into(model: nn.Module, source: str | Path) -> nn.Module:
    """Load pretrained weights into `model` from a run dir, a `.ckpt` file or a Hub repo id (`init_from=...`).

    The shapes must match: a different architecture is refused with the mismatching keys, nothing is changed.
    """
    path = Path(source)
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
        if not path.is_file():
            raise FileNotFoundError(f"init_from={source!r}: the run dir has no checkpoints/last.ckpt")
    if path.suffix == ".ckpt" or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"init_from={source!r}: no such checkpoint file")
        state = state_from_checkpoint(path)
    else:
        state = _load(str(source), None)[0].state_dict()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"init_from={source!r} does not fit this model ({type(model).__name__}): {err}") from err
    return model
