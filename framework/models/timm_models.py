"""timm image models by name (`model=timm model.name=resnet18`) or by Hub id (`model.name=hf-hub:org/name`).

The factory returns the timm model itself, so `Classifier` reads its penultimate feature through timm's own
`forward_features` / `forward_head` / `get_classifier`, and a push writes timm's format (`timm.create_model
("hf-hub:...")` opens it). The number of classes and the input channels come from the data (`num_classes`,
`input_shape`); a fixed-size model (a ViT) is built for the data's image size. `data_config_for` states the model's
data config (size, interpolation, mean, std, crop) without loading weights, for image data that resizes and normalises
the model's way. timm is imported only when one is built.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from framework.errors import InputError

HUB_PREFIX = "hf-hub:"


def timm_model(name: str = "resnet18", pretrained: bool = False, num_classes: int | None = None,
               input_shape: list[int] | None = None, **kwargs: Any) -> nn.Module:
    """`timm.create_model(name, pretrained, num_classes=..., in_chans=input_shape[0], **kwargs)`.

    Extra keyword arguments go to timm (`drop_rate`, `patch_size`, ...; on the command line `+model.drop_rate=0.1`).
    A fixed-size model without `img_size` is built for the data's image size. `init_config` records what rebuilds the
    architecture (`pretrained` false there: the run's weights are in its checkpoint).

    Args:
        name: a timm architecture (`resnet18`, `resnet18.a1_in1k`) or a timm model's Hub id (`hf-hub:org/name`).
        pretrained: load timm's pretrained weights (downloaded through HF_ENDPOINT); False: random init.
        num_classes: classes of the new classifier head; supplied from the data at build time.
        input_shape: (channels, height, width) of one image, giving `in_chans`; supplied from the data at build time.
    """
    import timm

    check_name(name)
    args = _model_args(name, num_classes, input_shape, kwargs)
    fetch = bool(pretrained) and not _building_on_meta()  # the preflight's meta build never downloads weights
    if pretrained and not fetch:
        check_weights(name)  # ... but it says, before the run writes anything, when they cannot be had
    try:
        model = timm.create_model(name, pretrained=fetch, **args)
    except TypeError as err:
        raise InputError(f"model.name={name}: timm could not build it with {_shown(args)}: {err}") from err
    _check_patches(name, model, input_shape)
    model.init_config = {"name": name, "pretrained": False, "num_classes": num_classes,
                         "input_shape": None if input_shape is None else [int(s) for s in input_shape], **kwargs}
    return model


def data_config_for(name: str = "resnet18", pretrained: bool = False, num_classes: int | None = None,
                    input_shape: list[int] | None = None, **kwargs: Any) -> dict[str, Any]:
    """The data config timm resolves for this model (`input_size` (C, H, W), `interpolation`, `mean`, `std`,
    `crop_pct`, `crop_mode`), from an architecture built on the meta device: no weights are loaded."""
    import timm
    from timm.data.model_config import resolve_input_data_config

    check_name(name)
    args = _model_args(name, num_classes or 2, input_shape, kwargs)
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **args)
    config = resolve_input_data_config(model)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


timm_model.data_config_for = data_config_for  # type: ignore[attr-defined]  (assembly.hand_data_config asks it)


def check_name(name: str) -> None:
    """InputError unless `name` is a timm model name (with "did you mean" among `timm.list_models()`) or a Hub id
    whose config.json is a timm model's (else naming what it is)."""
    import timm

    if not isinstance(name, str) or not name:
        raise InputError(f"model.name={name!r}: give a timm model name (e.g. resnet18) or a Hub id (hf-hub:org/name)")
    if name.startswith(HUB_PREFIX):
        _check_hub_model(name[len(HUB_PREFIX):])
        return
    if timm.is_model(name):
        return
    known = timm.list_models()
    close = difflib.get_close_matches(name.split(".")[0], known, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(m) for m in close)}?" if close else ""
    listing = f"python -c \"import timm; print(timm.list_models('{name[:3]}*'))\""
    raise InputError(f"model.name={name}: timm {timm.__version__} has no such model.{hint} (`{listing}` lists names; "
                     "a model on the Hub: model.name=hf-hub:org/name)")


def _check_hub_model(repo_id: str) -> None:
    """The Hub repo's config.json is a timm model's (an `architecture` timm knows); InputError naming what it is."""
    import timm
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    where = f"model.name={HUB_PREFIX}{repo_id}"
    try:
        config = json.loads(Path(hf_hub_download(repo_id, "config.json")).read_text(encoding="utf-8"))
    except (RepositoryNotFoundError, HFValidationError) as err:
        raise InputError(f"{where}: no such Hub repo ({type(err).__name__}); give a timm model's Hub id "
                         "(hf-hub:org/name) or a timm model name") from None
    except LocalEntryNotFoundError:
        raise InputError(f"{where}: the Hub at {constants.ENDPOINT} could not be reached and its config.json is not in "
                         "the local cache (set HF_ENDPOINT for a local Hub)") from None
    except EntryNotFoundError:
        raise InputError(f"{where}: the repo has no config.json, so it is not a timm model") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{where}: its config.json is not JSON ({err}), so it is not a timm model") from None
    what = _not_timm(config)
    if what:
        raise InputError(f"{where} is {what}, not a timm model (model=timm opens repos whose config.json names a timm "
                         "'architecture', as timm's push_to_hf_hub writes)")
    if not timm.is_model(config["architecture"]):
        raise InputError(f"{where}: its architecture {config['architecture']!r} is no model timm {timm.__version__} "
                         "knows")


def _not_timm(config: Any) -> str | None:
    """What a config.json that is not a timm model's holds (None for a timm model's)."""
    if not isinstance(config, dict):
        return "a config.json that is no JSON object"
    if "model_type" in config:
        arch = ", ".join(config.get("architectures") or []) or config["model_type"]
        return f"a transformers model ({arch}; model_type {config['model_type']!r}: model=hf_causal_lm or hf_masked_lm)"
    if isinstance(config.get("name"), str):
        return f"a framework model ({config['name']!r}: model={config['name']} with init_from=hf://...)"
    if not isinstance(config.get("architecture"), str):
        return f"a model whose config.json has no timm 'architecture' (keys: {', '.join(sorted(config)) or 'none'})"
    return None


def _model_args(name: str, num_classes: int | None, input_shape: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """timm's keyword arguments: `num_classes`, `in_chans` from the data's shape (C, H, W), `img_size` (H, W) for a
    fixed-size model that was given none, and the user's `kwargs` (which win)."""
    import timm

    args: dict[str, Any] = {} if num_classes is None else {"num_classes": int(num_classes)}
    if input_shape:
        shape = [int(s) for s in input_shape]
        if len(shape) != 3:
            raise InputError(f"model=timm takes images (channels, height, width); the data's input_shape is {shape}")
        args["in_chans"] = shape[0]
        if "img_size" not in kwargs and _fixed_size(timm, name):
            args["img_size"] = tuple(shape[1:])
    return {**args, **kwargs}


def _fixed_size(timm: Any, name: str) -> bool:
    """Whether the architecture takes one input size only (a ViT's position embeddings): from its default config."""
    if name.startswith(HUB_PREFIX):
        from timm.models import load_model_config_from_hf

        cfg, _, _ = load_model_config_from_hf(name[len(HUB_PREFIX):])
        return bool(cfg.get("fixed_input_size"))
    return bool(timm.models.get_pretrained_cfg_value(name, "fixed_input_size"))


def _check_patches(name: str, model: nn.Module, input_shape: Any) -> None:
    """InputError when the data's images do not tile into the model's patches (a ViT's 16x16 on 8x8 digits), which
    timm would only meet at the first forward."""
    embed = getattr(model, "patch_embed", None)
    patch = getattr(embed, "patch_size", None)
    if not input_shape or not patch or getattr(embed, "dynamic_img_pad", False):
        return
    size, patch = tuple(int(s) for s in input_shape[1:]), tuple(int(p) for p in patch)
    if any(s % p for s, p in zip(size, patch, strict=True)):
        sizes = "x".join(map(str, size))
        raise InputError(f"model.name={name}: the data's {sizes} images do not tile into its {patch[0]}x{patch[1]} "
                         f"patches; give a patch size that divides {sizes} (e.g. +model.patch_size=2) or larger images")


def check_weights(name: str) -> None:
    """InputError (before anything is written) when `model.pretrained=true` cannot get timm's weights for `name`:
    timm knows none for it, or the Hub repo that holds them is not there (naming the repo and the Hub asked) or,
    offline, not in the cache. Weights timm reads from a URL, or a Hub id's (`check_name` read its config), pass."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError
    from timm.models import get_pretrained_cfg

    if name.startswith(HUB_PREFIX):
        return
    try:
        cfg = get_pretrained_cfg(name)
    except RuntimeError as err:  # timm's "Invalid pretrained tag"
        raise InputError(f"model.name={name}: {err} (model.pretrained=true needs a tag timm has weights for)") from None
    if cfg is None or not (cfg.hf_hub_id or cfg.url or cfg.file):
        raise InputError(f"model.pretrained=true: timm has no pretrained weights for {name}; model.pretrained=false "
                         "trains it from scratch")
    if not cfg.hf_hub_id:
        return
    repo = cfg.hf_hub_id.split("@")[0]
    if any(isinstance(try_to_load_from_cache(repo, f), str) for f in ("model.safetensors", "pytorch_model.bin",
                                                                        cfg.hf_hub_filename) if f):
        return
    fix = "model.pretrained=false trains it from scratch, or model.name=hf-hub:<a repo of weights you hold>"
    if constants.HF_HUB_OFFLINE:
        raise InputError(f"model.pretrained=true: timm's weights for {name} (the Hub repo {repo}) are not in the "
                         f"cache and HF_HUB_OFFLINE=1; download them on a node with internet first, or {fix}")
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(repo)
    except RepositoryNotFoundError:
        raise InputError(f"model.pretrained=true: timm's weights for {name} are in the Hub repo {repo}, which the Hub "
                         f"at {constants.ENDPOINT} does not have; {fix}") from None
    except Exception as err:  # noqa: BLE001 - unreachable, refused: say which Hub and why, in one line
        raise InputError(f"model.pretrained=true: the Hub at {constants.ENDPOINT} cannot be asked for timm's weights "
                         f"for {name} (the repo {repo}: {type(err).__name__}: {str(err)[:200]}); {fix}") from None


def _building_on_meta() -> bool:
    """True inside `accelerate.init_empty_weights` (the preflight's build): a new parameter lands on meta."""
    return nn.Linear(1, 1).weight.device.type == "meta"


def _shown(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items()) or "no arguments"


__all__ = ["HUB_PREFIX", "check_name", "data_config_for", "timm_model"]
