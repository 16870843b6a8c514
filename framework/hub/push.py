"""Pushing to the Hub: one commit with weights, config.json, the model card and the training curves."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from framework import __version__
from framework.errors import redact
from framework.hub.adapters import ADAPTER, live_push_model, pushes_adapter, stage_adapter, with_adapters
from framework.hub.card import model_card
from framework.hub.common import (
    ARTIFACTS,
    CARD_NAME,
    CONFIG_NAME,
    PLOT_NAME,
    TRAIN_CONFIG_NAME,
    WEIGHTS_NAME,
    HubPushError,
    Pushed,
    UnsafeWeightsError,
)
from framework.hub.formats import FRAMEWORK, FRAMEWORK_CONFIG_NAME, TIMM, TRANSFORMERS, timm_architecture, timm_config
from framework.hub.load import build_model, validate_config
from framework.hub.pushable import _is_hf, pushable
from framework.models.peft_adapters import PEFT_KEY, peft_spec
from framework.rundir import Build, RunDir, load_state


# ---- pushing ------------------------------------------------------------------------------------------------
@dataclass
class _Bundle:
    """Everything one push publishes, gathered from a run dir or a live module before anything is uploaded."""

    model: nn.Module
    config: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    task: str | None = None
    global_step: int | None = None
    metrics_csv: Path | None = None
    train_config: Path | None = None
    format: str = FRAMEWORK  # config.json's format: framework, timm or plain (`framework.hub.formats`)
    extras: list[tuple[str, Path]] = field(default_factory=list)  # method artefacts: (path in the repo, file)
    data: dict[str, Any] | None = None  # the data's record (`record()` of the user's data: source, tokens, ...)

    @property
    def name(self) -> str:
        """The model's registry name, timm architecture, or class name."""
        return str(self.config.get("architecture") or self.config["name"])


def check_repo_id(repo_id: str) -> str:
    """`repo_id` if it is a valid 'namespace/name' Hub id; ValueError naming the bad id otherwise."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"invalid Hub repo id {repo_id!r}: {err}") from err
    if repo_id.count("/") != 1:
        raise ValueError(f"invalid Hub repo id {repo_id!r}: use 'namespace/name', e.g. 'local-user/char-lm'")
    return repo_id


def retry_command(run_dir: str | Path, repo_id: str, revision: str | None = None, private: bool = False) -> str:
    """The exact shell command that pushes `run_dir` again."""
    cmd = f"python -m framework.hub push {shlex.quote(str(Path(run_dir).resolve()))} {shlex.quote(repo_id)}"
    return cmd + (f" --revision {shlex.quote(revision)}" if revision else "") + (" --private" if private else "")


def push_to_hub(run_dir_or_module: str | Path | nn.Module, repo_id: str, revision: str | None = None,
                private: bool = False, *, commit_message: str | None = None, info: dict[str, Any] | None = None,
                build: Build | None = None) -> Pushed:
    """Publish a `framework.train` run dir (its last checkpoint) or a live model/TrainModule as ONE commit.

    A module pushes its framework model (`info["model_name"]` or the catalog names it), its timm model (in timm's
    own format: `timm.create_model("hf-hub:...")` loads it) or, with saved hyperparameters, itself (a plain config
    the card's snippet rebuilds); anything else is refused (NotPushableError). `info` adds card details: `recipe`,
    `command`, `datasets`, `task`, and a timm model's `label_names` (default: the fit's data's `classes`; a run dir's:
    the `class_names` its results.json records). A run dir's model is rebuilt by `build(name, config)` (default: the
    catalog's).
    Everything is staged in a temporary folder first; Hub failures raise HubPushError (with the retry command for
    run dirs).
    """
    check_repo_id(repo_id)
    source = run_dir_or_module
    if isinstance(source, (str, os.PathLike)):
        bundle, what = _bundle_from_run_dir(RunDir(source), build), str(source)
        retry = retry_command(source, repo_id, revision, private)
    elif isinstance(source, nn.Module):
        bundle, what, retry = _bundle_from_module(source, info or {}), type(source).__name__, None
    else:
        raise TypeError(f"push_to_hub takes a run dir or an nn.Module, got {type(source).__name__}")
    with tempfile.TemporaryDirectory(prefix="framework-hub-") as tmp:
        folder = Path(tmp)
        _stage(bundle, folder, repo_id, revision)
        message = commit_message or f"framework {__version__}: {bundle.name}" + (
            f" at step {bundle.global_step}" if bundle.global_step is not None else "")
        try:
            return _commit(folder, repo_id, revision, private, message)
        except Exception as err:
            from huggingface_hub import constants

            raise HubPushError(
                f"Pushing {what} to the Hub repo {repo_id!r} (revision {revision or 'main'}) at {constants.ENDPOINT}"
                f" failed: {type(err).__name__}: {' '.join(redact(str(err)).split())}. No partial commit was made"
                + (f" and {what} is intact." if retry else "."),
                retry,
            ) from err


def _bundle_from_run_dir(run: RunDir, build: Build | None) -> _Bundle:
    if not run.spec_path.is_file():
        raise FileNotFoundError(f"{run.root} has no {run.spec_path.name}: pass the Hydra run dir of a finished"
                                " `python -m framework.train` run (it holds results.json and checkpoints/)")
    spec, results = run.spec(), run.results()
    config = validate_config({"name": spec.get("name"), "config": spec.get("config", {}),
                              "framework_version": __version__, "recipe": results.get("recipe"),
                              "command": results.get("command"),
                              **({"mask_id": spec["mask_id"]} if spec.get("mask_id") is not None else {})})
    ckpt = run.checkpoint_file()
    model = build_model(config, build)
    record = spec.get(PEFT_KEY)  # trained adapters: PEFT's format for a transformers model, else merged
    adapter = pushes_adapter(model, record)
    if adapter:
        with_adapters(model, record)
    try:
        load_state(model, run.state(merge=not adapter), ckpt)
    except ValueError as err:
        raise UnsafeWeightsError(f"{ckpt} does not fit model {config['name']!r}: {err.__cause__}") from err
    choices = results.get("choices") or {}
    fmt = ADAPTER if adapter else FRAMEWORK
    if record:
        config = {**config, PEFT_KEY: record}
    if timm_architecture(model):  # `model=timm`: timm's own format, so timm.create_model("hf-hub:...") opens it
        labels = (results.get("data") or {}).get("class_names")  # data=images: in full up to 20 classes
        fmt, config = TIMM, validate_config({**timm_config(model, labels),
                                             **{k: config[k] for k in _RUN_KEYS if k in config}})
    return _Bundle(
        model, config, {k: float(v) for k, v in (results.get("metrics") or {}).items()},
        [choices["data"]] if choices.get("data") else [], choices.get("module"), results.get("global_step"),
        _file_or_none(run.root / "csv" / "metrics.csv"), _file_or_none(run.root / ".hydra" / "config.yaml"),
        format=fmt, extras=method_artefacts(run.root), data=results.get("data"),
    )


#: what a run dir's config.json records of the run beside the model, in every format
_RUN_KEYS = ("framework_version", "recipe", "command")


#: files a method writes into its run dir that travel with the model, in the same repo (`METHOD_ARTEFACTS`:
#: RLKV / DuoAttention head allocations with their pattern folder, growth records)
METHOD_ARTEFACTS = ("head_allocation.json", "gates.tsv", "attn_pattern/full_attention_heads.tsv",
                    "attn_pattern/adapter_weights.tsv", "attn_pattern/config.json", "growth.json")


def method_artefacts(root: Path) -> list[tuple[str, Path]]:
    """(path in the repo, file) of each `METHOD_ARTEFACTS` file in the run dir `root`."""
    return [(name, root / name) for name in METHOD_ARTEFACTS if (root / name).is_file()]


def _bundle_from_module(module: nn.Module, info: dict[str, Any]) -> _Bundle:
    trainer = getattr(module, "_trainer", None)
    classes = getattr(getattr(trainer, "datamodule", None), "classes", None)  # data=images: the user's class names
    if isinstance(classes, (list, tuple)) and "label_names" not in info:
        info = {**info, "label_names": list(classes)}
    what = pushable(module, info)  # NotPushableError (a ValueError) names the class and what would make it pushable
    model, adapter = live_push_model(what.model)  # adapters: alone (PEFT's format), or merged into a copy
    config = {**what.config, PEFT_KEY: peft_spec(what.model).record()} if peft_spec(what.model) else what.config
    bundle = _Bundle(model, config, datasets=list(info.get("datasets") or []), task=info.get("task"),
                     format=ADAPTER if adapter else what.format)
    if trainer is not None:
        from lightning.pytorch.loggers import CSVLogger

        bundle.metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1}
        bundle.global_step = trainer.global_step
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                logger.save()
                bundle.metrics_csv = _file_or_none(Path(logger.experiment.metrics_file_path))
        bundle.train_config = _file_or_none(Path(trainer.default_root_dir) / ".hydra" / "config.yaml")
        record = getattr(trainer.datamodule, "record", None)
        bundle.data = record() if callable(record) else None
    return bundle


def _file_or_none(path: Path) -> Path | None:
    return path if path.is_file() else None


def _stage(bundle: _Bundle, folder: Path, repo_id: str, revision: str | None) -> None:
    from safetensors.torch import save_model

    from framework.plots import plot_training_curves

    if bundle.format == ADAPTER:  # PEFT's layout (adapter_config.json naming the base, the adapter's safetensors)
        stage_adapter(bundle.model, folder)
        (folder / FRAMEWORK_CONFIG_NAME).write_text(json.dumps(bundle.config, indent=2) + "\n")
    elif _is_hf(bundle.model):  # transformers' own layout (config.json, safetensors, tokenizer); ours in framework.json
        bundle.format = TRANSFORMERS
        bundle.model.save_pretrained(folder)
        (folder / FRAMEWORK_CONFIG_NAME).write_text(json.dumps(bundle.config, indent=2) + "\n")
    else:
        save_model(bundle.model, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})  # dedups tied weights
        (folder / CONFIG_NAME).write_text(json.dumps(bundle.config, indent=2) + "\n")
    if bundle.train_config is not None:
        shutil.copyfile(bundle.train_config, folder / TRAIN_CONFIG_NAME)
    for name, path in bundle.extras:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, folder / name)
    has_plot = False
    with contextlib.suppress(ValueError):  # nothing logged yet: a card without a plot
        has_plot = bundle.metrics_csv is not None and plot_training_curves(bundle.metrics_csv, folder / PLOT_NAME)
    (folder / CARD_NAME).write_text(model_card(bundle, repo_id, revision, has_plot))


def _commit(folder: Path, repo_id: str, revision: str | None, private: bool, message: str) -> Pushed:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    api = HfApi(library_name="framework", library_version=__version__)  # endpoint: HF_ENDPOINT
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    staged = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    stale = set(ARTIFACTS) & set(api.list_repo_files(repo_id, revision=revision)) - set(staged)
    ops = [CommitOperationAdd(path_in_repo=n, path_or_fileobj=str(folder / n)) for n in staged]
    ops += [CommitOperationDelete(path_in_repo=n) for n in sorted(stale)]  # e.g. a plot this push lacks
    info = api.create_commit(repo_id, ops, commit_message=message, revision=revision)
    return Pushed(repo_id, revision or "main", info.oid, info.commit_url)


def record_push(run_dir: str | Path, pushed: Pushed) -> dict[str, str]:
    """Record `pushed` as `"hub"` in run_dir/results.json (atomically); returns what was recorded."""
    path = Path(run_dir) / "results.json"
    if path.is_file():
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({**json.loads(path.read_text()), "hub": asdict(pushed)}, indent=2))
        os.replace(tmp, path)
    return asdict(pushed)

