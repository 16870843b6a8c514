"""A trained model on disk: the run dir of `python -m framework.train` (or of `python -m framework.grow --out`).

The one place that knows the layout: `model_config.json` (the model's registry name and constructor values, and a
masked diffusion model's [MASK] id), `results.json`, and `checkpoints/last.ckpt` (a Lightning checkpoint holding
the backbone as `model.*`, its EMA copy as `ema.*`, LoRA adapters as `*.lora_*`, and the grown architecture under
`orthogonal_growth` when it grew). Checkpoints are read with `weights_only=True`: nothing is unpickled. Building a
model is the caller's: it passes `build(name, config)` (the catalog's at the entry points) or a class.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

SPEC_NAME, RESULTS_NAME = "model_config.json", "results.json"
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
GROWTH_KEY = "orthogonal_growth"  # framework.callbacks.growth.CHECKPOINT_KEY
Build = Callable[[str, dict[str, Any]], nn.Module]


def is_local(source: str | Path) -> bool:
    """True if `source` names something on disk (a run dir or a checkpoint file) rather than a Hub repo id."""
    return Path(source).exists() or Path(source).suffix == ".ckpt"


def state_from_checkpoint(ckpt_path: str | Path, ema: bool = False) -> dict[str, Tensor]:
    """The backbone's state_dict (or its EMA copy) from a Lightning checkpoint, LoRA adapters folded in."""
    return backbone_state(read_checkpoint(ckpt_path), ckpt_path, ema)


def backbone_state(raw: dict[str, Any], ckpt_path: str | Path, ema: bool = False) -> dict[str, Tensor]:
    """`state_from_checkpoint` for a checkpoint already read (`ckpt_path` names it in errors)."""
    state = raw.get("state_dict", raw)
    if not isinstance(state, dict):
        from framework.hub.common import UnsafeWeightsError

        raise UnsafeWeightsError(f"{ckpt_path} holds no state_dict")
    if ema:
        state = {k.removeprefix("ema."): v for k, v in state.items() if k.startswith("ema.")}
        if not state:
            raise ValueError(f"{ckpt_path} has no EMA weights (trained with module.ema_decay=0); drop --ema")
    elif any(k.startswith("model.") for k in state):  # a LightningModule's keys: keep its backbone `.model`
        state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    if any("lora_" in k for k in state):  # a LoRA fine-tune: fold the adapters into plain weights
        from framework.models.lora import merge_lora_state

        state = merge_lora_state(state)
    return state


def read_checkpoint(ckpt_path: str | Path) -> dict[str, Any]:
    """A checkpoint's contents, loaded with `weights_only=True` (UnsafeWeightsError if that refuses it)."""
    from framework.hub.common import UnsafeWeightsError

    try:
        raw = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UnsafeWeightsError(f"cannot load {ckpt_path} with weights_only=True: {err}") from err
    if not isinstance(raw, dict):
        raise UnsafeWeightsError(f"{ckpt_path} holds no state_dict")
    return raw


class RunDir:
    """A run dir and the checkpoint in it to read (`checkpoints/last.ckpt` unless a `.ckpt` file was named)."""

    def __init__(self, source: str | Path):
        path = Path(source)
        if path.is_dir():
            self.root, self.checkpoint = path, path / LAST_CHECKPOINT
        else:  # RUN/checkpoints/X.ckpt, or a checkpoint with its model_config.json beside it
            near = [d for d in (path.parent, path.parent.parent) if (d / SPEC_NAME).is_file()]
            self.root, self.checkpoint = (near[0] if near else path.parent.parent), path
        self.source = str(source)
        self._raw: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RunDir({self.source!r})"

    @property
    def spec_path(self) -> Path:
        return self.root / SPEC_NAME

    def spec(self) -> dict[str, Any]:
        """`model_config.json`: {"name", "config"} and, for a masked diffusion model, "mask_id"."""
        if not self.spec_path.is_file():
            raise FileNotFoundError(f"found no {SPEC_NAME} for {self.source} (looked in {self.root}): pass the run"
                                    " dir of a `python -m framework.train` run (it names the model and its values)")
        return json.loads(self.spec_path.read_text())

    def results(self) -> dict[str, Any]:
        """`results.json` ({} if the run wrote none)."""
        path = self.root / RESULTS_NAME
        return json.loads(path.read_text()) if path.is_file() else {}

    def checkpoint_file(self) -> Path:
        """The checkpoint to read; for a run dir without `last.ckpt`, the one results.json names."""
        recorded = self.results().get("last_checkpoint") if self.checkpoint == self.root / LAST_CHECKPOINT else None
        for path in (self.checkpoint, Path(recorded) if recorded else None):
            if path is not None and path.is_file():
                return path
        if self.checkpoint == self.root / LAST_CHECKPOINT:
            raise FileNotFoundError(f"{self.source} has no {LAST_CHECKPOINT}: train with the `checkpoint` callback")
        raise FileNotFoundError(f"no such checkpoint file: {self.source}")

    def raw_checkpoint(self) -> dict[str, Any]:
        """The checkpoint's contents (read once, `weights_only=True`)."""
        if self._raw is None:
            self._raw = read_checkpoint(self.checkpoint_file())
        return self._raw

    def state(self, ema: bool = False) -> dict[str, Tensor]:
        """The model's weights (`ema`: its EMA copy), LoRA adapters merged."""
        return backbone_state(self.raw_checkpoint(), self.checkpoint_file(), ema)

    def model_config(self, grown: bool = True) -> dict[str, Any]:
        """{"name", "config"} of the model; `grown`: the architecture a growth callback recorded in the checkpoint."""
        spec = self.spec()
        config = spec.get("config", {})
        if grown:
            record = self.raw_checkpoint().get(GROWTH_KEY)
            config = (record or {}).get("config") or config
        return {"name": spec.get("name"), "config": config}

    def load(self, build: Build, ema: bool = False, grown: bool = True) -> nn.Module:
        """The model, built by `build(name, config)` with this run's weights (ValueError if they do not fit)."""
        config = self.model_config(grown)
        return load_state(build(config["name"], dict(config["config"])), self.state(ema), self.checkpoint_file())


def load_state(model: nn.Module, state: dict[str, Tensor], where: str | Path) -> nn.Module:
    """`model` with `state` loaded strictly; ValueError naming `where` and the mismatching keys otherwise."""
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{where} does not fit model {type(model).__name__}: {err}") from err
    return model


__all__ = [
    "Build", "GROWTH_KEY", "LAST_CHECKPOINT", "RESULTS_NAME", "RunDir", "SPEC_NAME", "backbone_state", "is_local",
    "load_state", "read_checkpoint", "state_from_checkpoint",
]
