"""A trained model on disk: the run dir of `python -m framework.train` (or of `python -m framework.grow --out`).

The one place that knows the layout: `model_config.json` (the model's registry name and constructor values, a
masked diffusion model's [MASK] id and the adapters' values, `peft`), `results.json`, and `checkpoints/last.ckpt` (a
Lightning checkpoint holding the backbone as `model.*`, its EMA copy as `ema.*`, LoRA adapters as PEFT's layers
(`*.base_layer.*`, `*.lora_A.default.*`: `state()` folds them in) and the grown architecture under
`orthogonal_growth` when it grew). Checkpoints are read with `weights_only=True`: nothing is unpickled. Building a
model is the caller's: it passes `build(name, config)` (the catalog's at the entry points) or a class.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from torch import Tensor, nn

from framework import checkpointing
from framework.errors import CheckpointError, UnsafeWeightsError

SPEC_NAME, RESULTS_NAME = "model_config.json", "results.json"
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
#: where a checkpoint records the architecture OrthogonalGrowth grew (`framework.callbacks.growth` writes it)
GROWTH_KEY = "orthogonal_growth"
Build = Callable[[str, dict[str, Any]], nn.Module]


class Source(NamedTuple):
    """What a source string names: a run dir, a checkpoint file, or a Hub repo id."""

    kind: str  # "run_dir" | "checkpoint" | "repo"
    value: str

    @property
    def is_local(self) -> bool:
        return self.kind != "repo"


#: the sources the command lines take, as their error messages list them
SOURCES = "RUN_DIR, RUN_DIR/checkpoints/X.ckpt, REPO_ID ('namespace/name')"


def resolve_source(source: str | Path) -> Source:
    """The one place that decides whether `source` is a run dir, a checkpoint file or a Hub repo id. Something
    that exists on disk is local; what looks like a path but does not exist, or is no valid repo id, is refused
    (FileNotFoundError naming it and the valid sources). Whether the Hub has the repo is the Hub's to say."""
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        return Source("run_dir", text)
    if path.is_file():
        return Source("checkpoint", text)
    if path.suffix == ".ckpt":
        raise FileNotFoundError(f"no such checkpoint file: {text}")
    unknown = f"unknown source {text!r}: no such run dir or .ckpt file, and not a Hub repo id; valid sources: {SOURCES}"
    if path.is_absolute() or text.startswith((".", "~")) or text.count("/") != 1:
        raise FileNotFoundError(unknown)
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        raise FileNotFoundError(unknown) from None
    return Source("repo", text)


def backbone_state(raw: dict[str, Any], ckpt_path: str | Path, ema: bool = False) -> dict[str, Tensor]:
    """The backbone's state_dict (or its EMA copy) from a checkpoint already read, LoRA adapters folded in
    (`ckpt_path` names it in errors)."""
    state = raw.get("state_dict", raw)
    if not isinstance(state, dict):
        raise UnsafeWeightsError(f"{ckpt_path} holds no state_dict")
    if ema:
        state = {k.removeprefix("ema."): v for k, v in state.items() if k.startswith("ema.")}
        if not state:
            raise ValueError(f"{ckpt_path} has no EMA weights (trained with module.ema_decay=0); drop --ema")
    elif any(k.startswith("model.") for k in state):  # a LightningModule's keys: keep its backbone `.model`
        state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    if any(k.endswith(".lora_A") for k in state):  # the framework's own LoRA of earlier versions: fold it in
        from framework.models.lora import merge_lora_state

        state = merge_lora_state(state)
    return state


def read_checkpoint(ckpt_path: str | Path) -> dict[str, Any]:
    """A checkpoint's contents (`framework.checkpointing.read_checkpoint`: weights_only=True), refused as
    UnsafeWeightsError when that reader refuses it: here a checkpoint is a model's weights to load."""
    try:
        return checkpointing.read_checkpoint(ckpt_path)
    except CheckpointError as err:
        raise UnsafeWeightsError(str(err)) from err


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

    def state(self, ema: bool = False, merge: bool = True) -> dict[str, Tensor]:
        """The model's weights (`ema`: its EMA copy), LoRA adapters merged (`merge=False`: PEFT's layers as trained,
        for a model with the same adapters attached)."""
        state = backbone_state(self.raw_checkpoint(), self.checkpoint_file(), ema)
        from framework.models.peft_adapters import PEFT_KEY, is_peft_state, merged_state

        if not merge or not is_peft_state(state):
            return state
        record = self.spec().get(PEFT_KEY) if self.spec_path.is_file() else None
        if not record:
            raise UnsafeWeightsError(f"{self.checkpoint_file()} holds PEFT adapters, but {self.spec_path} does not say "
                                     "which (no 'peft' entry): it cannot be merged into plain weights")
        return merged_state(state, record)

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
    "Build", "GROWTH_KEY", "LAST_CHECKPOINT", "RESULTS_NAME", "RunDir", "SOURCES", "SPEC_NAME", "Source",
    "backbone_state", "load_state", "read_checkpoint", "resolve_source",
]
