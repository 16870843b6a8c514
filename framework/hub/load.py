"""Loading from the Hub: validate `config.json`, build the model it names, load safetensors only.

The Hub does not know the catalog: `build(name, config)` builds a named model, or `model_cls` is the class itself;
with neither, `registered_model` builds it from the model registry (`framework.registry.MODELS`, filled by
`load_catalog` on first use through the catalog's entry point).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from framework import __version__
from framework.hub.common import (
    CONFIG_NAME,
    FORBIDDEN_KEYS,
    IMPORT_PATH,
    WEIGHTS_NAME,
    UnsafeConfigError,
    UnsafeWeightsError,
    check_model_args,
)
from framework.hub.formats import (
    FRAMEWORK_CONFIG_NAME,
    PLAIN,
    TIMM,
    TIMM_INFO_KEY,
    TRANSFORMERS,
    check_timm_config,
    config_format,
    model_spec,
    timm_model,
    timm_pretrained_cfg,
)
from framework.rundir import Build, RunDir, load_state, resolve_source


# ---- config.json: what may be loaded -------------------------------------------------------------------
def validate_config(config: Any, model_cls: type[nn.Module] | None = None) -> dict[str, Any]:
    """Return `config` if it only holds a model name and plain values (that `model_cls`, if given, takes);
    raise UnsafeConfigError otherwise. Whether the name is known is for the `build` that builds it; a timm
    config's `architecture` must be a model timm knows."""
    if not isinstance(config, dict):
        raise UnsafeConfigError(f"config.json must be a JSON object, got {type(config).__name__}")
    fmt = config_format(config)
    if fmt == TRANSFORMERS:  # transformers' own config: plain values, no remote code (auto_map names modules)
        if config.get("auto_map"):
            raise UnsafeConfigError("config.json has 'auto_map': it asks for remote code, which framework never runs;"
                                    " register an adapter for the family instead (docs/hf_models.md)")
        _check_plain(config, "config.json")
    elif fmt == TIMM:  # pretrained_cfg names modules inside the model ("patch_embed.proj"): no import-path rule there
        _check_plain({k: v for k, v in config.items() if k != TIMM_INFO_KEY}, "config.json")
        _check_plain(config.get(TIMM_INFO_KEY, {}), f"config.json[{TIMM_INFO_KEY!r}]", paths=False)
        check_timm_config(config)
    else:
        _check_plain(config, "config.json")
        name, values = config.get("name"), config.get("config", {})
        if not isinstance(name, str):
            raise UnsafeConfigError(f"config.json 'name' must be a registered model name (a string), got {name!r}"
                                    " (or, for a timm model, 'architecture' a timm model name)")
        if not isinstance(values, dict):
            raise UnsafeConfigError(f"config.json 'config' must be an object of constructor values, got {values!r}")
    if model_cls is not None:
        spec = model_spec(config)
        check_model_args(spec.name, model_cls, spec.values)
    return config


def registered_model(name: str, config: dict[str, Any]) -> nn.Module:
    """The registered model `name` built with `config` (UnknownNameError, a LookupError, for an unknown name)."""
    from framework.registry import MODELS, load_catalog

    load_catalog()
    check_model_args(name, MODELS.get(name), config)
    return MODELS.build(name, **config)


def _check_plain(node: Any, where: str, paths: bool = True) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in FORBIDDEN_KEYS or (isinstance(key, str) and len(key) > 2 and key[0] == key[-1] == "_"):
                raise UnsafeConfigError(
                    f"{where} has key {key!r}: instantiation keys ({', '.join(sorted(FORBIDDEN_KEYS))}) are refused;"
                    " config.json may only hold a registry 'name' and plain constructor values"
                )
            _check_plain(value, f"{where}[{key!r}]", paths)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_plain(value, f"{where}[{i}]", paths)
    elif paths and isinstance(node, str) and IMPORT_PATH.match(node):
        raise UnsafeConfigError(
            f"{where} = {node!r} looks like an import path; config.json may only hold a registry name and plain"
            " values, never a module, class or function path"
        )
    elif node is not None and not isinstance(node, (str, bool, int, float)):
        raise UnsafeConfigError(f"{where} = {node!r} is not a plain JSON value")


def build_model(config: dict[str, Any], build: Build | None = None,
                model_cls: type[nn.Module] | None = None) -> nn.Module:
    """The model a `config.json` names: `model_cls(**values)`, or `build(name, values)` (default: the catalog's for
    a framework config, `timm.create_model` for a timm one; a plain module's config needs `model_cls` or `build`).

    A name `build` does not know (LookupError) is refused as UnsafeConfigError, like any other bad config."""
    validate_config(config, model_cls)
    spec = model_spec(config)
    if model_cls is not None:
        return model_cls(**spec.values)
    if build is None and spec.format == TIMM:
        return timm_model(spec.name, spec.values, timm_pretrained_cfg(config))  # as timm's hf-hub: reads it
    if build is None and spec.format == PLAIN:
        raise UnsafeConfigError(
            f"config.json holds the saved hyperparameters of a plain module {spec.name!r}, which is in no registry:"
            f" pass its class, from_pretrained(repo_id, model_cls={spec.name}), or a build(name, config)")
    try:
        return (build or registered_model)(spec.name, spec.values)
    except LookupError as err:
        raise UnsafeConfigError(f"config.json names an unregistered model: {err}") from err


# ---- loading -----------------------------------------------------------------------------------------------
def download(repo_id: str, filename: str, revision: str | None) -> str:
    """`filename` of `repo_id` at `revision`, from the local cache or the Hub (`HF_ENDPOINT`); its local path."""
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id, filename, revision=revision, library_name="framework", library_version=__version__)


def _fetch_config(repo_id: str, revision: str | None) -> tuple[dict[str, Any], str | None]:
    path = Path(download(repo_id, CONFIG_NAME, revision))
    commit = path.parent.name if re.fullmatch(r"[0-9a-f]{40}", path.parent.name) else None  # snapshots/<sha>/
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UnsafeConfigError(f"{CONFIG_NAME} of {repo_id}@{revision or 'main'} is not valid JSON: {err}") from err
    return validate_config(config), commit


def load_config(repo_id: str, revision: str | None = None) -> dict[str, Any]:
    """Download and validate `config.json` (UnsafeConfigError if it is anything but a name and plain values)."""
    return _fetch_config(repo_id, revision)[0]


class Loaded(NamedTuple):
    """A model loaded from the Hub, its validated config.json, the commit it came from and the weights' path."""

    model: nn.Module
    config: dict[str, Any]
    commit: str | None
    weights: str


def from_pretrained(repo_id: str, revision: str | None = None, *, build: Build | None = None,
                    model_cls: type[nn.Module] | None = None) -> nn.Module:
    """Rebuild the model named in `repo_id`'s config.json and load its safetensors weights.

    `revision` is a branch, tag or commit id; `build(name, config)` builds the named model (default: the
    framework catalog's; a timm config is built by `timm.create_model`) or `model_cls` is its class (needed for a
    plain module's config). The model comes back in eval mode.
    """
    return load_model(repo_id, revision, build=build, model_cls=model_cls).model


def load_model(repo_id: str, revision: str | None = None, *, build: Build | None = None,
               model_cls: type[nn.Module] | None = None) -> Loaded:
    """`from_pretrained`, also returning the config, the commit and where the weights are."""
    from huggingface_hub.errors import EntryNotFoundError
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model as load_safetensors

    config, commit = _fetch_config(repo_id, revision)  # validated before anything else is downloaded
    if config_format(config) == TRANSFORMERS and model_cls is None and build is None:
        return _load_transformers(repo_id, commit or revision, config, commit)
    model = build_model(config, build, model_cls)  # an unknown name is refused before the weights download
    where = f"{repo_id}@{commit or revision or 'main'}"
    try:
        weights = download(repo_id, WEIGHTS_NAME, commit or revision)  # same commit as config.json
    except EntryNotFoundError as err:
        raise UnsafeWeightsError(f"{where} has no {WEIGHTS_NAME}; framework loads safetensors only and never"
                                 " unpickles (pytorch_model.bin, *.pt, *.ckpt are refused)") from err
    try:
        with safe_open(weights, framework="pt") as f:
            list(f.keys())
    except (SafetensorError, OSError, ValueError) as err:
        raise UnsafeWeightsError(f"{WEIGHTS_NAME} of {where} is not a safetensors file ({err}); refusing it"
                                 " (pickles are never loaded)") from err
    try:
        load_safetensors(model, weights, strict=True)
    except (RuntimeError, SafetensorError) as err:
        raise UnsafeWeightsError(
            f"{WEIGHTS_NAME} of {where} does not fit model {model_spec(config).name!r}: {err}") from err
    return Loaded(model.eval(), config, commit, weights)


def _load_transformers(repo_id: str, revision: str | None, config: dict[str, Any], commit: str | None) -> Loaded:
    """A repo in transformers' layout, as the registered HF model `framework.json` names (else by its
    `architectures`): transformers reads the safetensors weights (never a pickle) and no remote code."""
    from huggingface_hub.errors import EntryNotFoundError

    spec = model_spec(config)
    name, values = spec.name, {}
    try:
        ours = json.loads(Path(download(repo_id, FRAMEWORK_CONFIG_NAME, revision)).read_text(encoding="utf-8"))
        validate_config(ours)
        name = str(ours.get("name") or name)
        values = {k: v for k, v in ours.get("config", {}).items() if k in ("dtype", "attn_implementation")}
    except EntryNotFoundError:
        pass  # pushed by transformers itself: the architecture says which head
    try:
        weights = download(repo_id, WEIGHTS_NAME, revision)
    except EntryNotFoundError as err:
        raise UnsafeWeightsError(f"{repo_id}@{revision or 'main'} has no {WEIGHTS_NAME}; framework loads safetensors"
                                 " only and never unpickles (pytorch_model.bin is refused)") from err
    model = registered_model(name, {"name_or_path": repo_id, "revision": revision, **values})
    return Loaded(model.eval(), config, commit, weights)


# ---- local checkpoints and init_from --------------------------------------------------------------------------
def load_weights_into(model: nn.Module, source: str | Path, build: Build | None = None) -> nn.Module:
    """Load pretrained weights into `model` from a run dir, a `.ckpt` file or a Hub repo id (`init_from=...`).

    The shapes must match: a different architecture is refused with the mismatching keys, nothing is changed.
    A Hub model is built by `build` (default: the catalog's) before its weights are copied over.
    """
    resolved = resolve_source(source)
    if resolved.is_local:
        state = RunDir(resolved.value).state()
    else:
        state = load_model(resolved.value, build=build).model.state_dict()
    return load_state(model, state, f"init_from={source!r}")
