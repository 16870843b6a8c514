"""Publish trained models to the Hugging Face Hub and load them back by name (timm/torchtune style).

A push is ONE commit holding `model.safetensors`, `config.json` (a registry name plus plain constructor values,
never an import path), a `README.md` model card (metadata, final metrics, the training-curve plot) and, from a
run dir, `train_config.yaml`. `from_pretrained` validates `config.json` before anything is built, rebuilds the
model through the registry and loads safetensors only: nothing from the Hub is ever unpickled.

    python -m framework.hub push RUN_DIR REPO_ID [--revision R] [--private]
    python -m framework.hub pull REPO_ID [--revision R]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from framework import __version__
from framework.registry import MODELS, UnknownNameError, load_catalog

__all__ = ["HubPushError", "Pushed", "UnsafeConfigError", "UnsafeWeightsError", "check_repo_id", "from_pretrained",
           "load_config", "main", "push_to_hub", "record_push", "retry_command", "validate_config"]

CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"
PLOT_NAME, TRAIN_CONFIG_NAME = "training_curves.png", "train_config.yaml"
ARTIFACTS = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, PLOT_NAME, TRAIN_CONFIG_NAME)
#: Hydra/hydra-zen instantiation keys: a config carrying one could make a loader import and call anything.
FORBIDDEN_KEYS = frozenset({"_target_", "_partial_", "_args_", "_recursive_", "_convert_"})
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class UnsafeConfigError(ValueError):
    """A `config.json` that could do more than name a registered model and give it plain values."""


class UnsafeWeightsError(ValueError):
    """Weights that are not a safetensors file matching the config (pickles are refused, never opened)."""


class HubPushError(RuntimeError):
    """The Hub was unreachable or refused a push; `retry_command` (when known) re-runs it from the run dir."""

    def __init__(self, message: str, retry_command: str | None = None):
        super().__init__(message + (f" Retry with: {retry_command}" if retry_command else ""))
        self.retry_command = retry_command


@dataclass(frozen=True)
class Pushed:
    """Where one push landed: the commit id stays downloadable (`from_pretrained(repo_id, revision=commit)`)."""

    repo_id: str
    revision: str
    commit: str
    url: str


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
                private: bool = False, *, commit_message: str | None = None, info: dict[str, Any] | None = None
                ) -> Pushed:
    """Publish a `framework.train` run dir (its last checkpoint) or a live model/TrainModule as ONE commit.

    `info` adds card details for module pushes: `recipe`, `command`, `datasets`, `model_name`. Everything is
    staged in a temporary folder first; Hub failures raise HubPushError (with the retry command for run dirs).
    """
    check_repo_id(repo_id)
    source = run_dir_or_module
    if isinstance(source, (str, os.PathLike)):
        bundle, what = _bundle_from_run_dir(Path(source)), str(source)
        retry = retry_command(source, repo_id, revision, private)
    elif isinstance(source, nn.Module):
        bundle, what, retry = _bundle_from_module(source, info or {}), type(source).__name__, None
    else:
        raise TypeError(f"push_to_hub takes a run dir or an nn.Module, got {type(source).__name__}")
    with tempfile.TemporaryDirectory(prefix="framework-hub-") as tmp:
        folder = Path(tmp)
        _stage(bundle, folder, repo_id)
        message = commit_message or f"framework {__version__}: {bundle.config['name']}" + (
            f" at step {bundle.global_step}" if bundle.global_step is not None else "")
        try:
            return _commit(folder, repo_id, revision, private, message)
        except Exception as err:
            from huggingface_hub import constants

            raise HubPushError(
                f"Pushing {what} to the Hub repo {repo_id!r} (revision {revision or 'main'}) at {constants.ENDPOINT}"
                f" failed: {type(err).__name__}: {' '.join(_redact(str(err)).split())}. No partial commit was made"
                + (f" and {what} is intact." if retry else "."),
                retry,
            ) from err


def _bundle_from_run_dir(run_dir: Path) -> _Bundle:
    spec_path = run_dir / "model_config.json"
    if not spec_path.is_file():
        raise FileNotFoundError(f"{run_dir} has no model_config.json: pass the Hydra run dir of a finished"
                                " `python -m framework.train` run (it holds results.json and checkpoints/)")
    spec = json.loads(spec_path.read_text())
    results_path = run_dir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    ckpt_path = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt_path.is_file() and results.get("last_checkpoint"):
        ckpt_path = Path(results["last_checkpoint"])
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"{run_dir} has no checkpoints/last.ckpt: train with the `checkpoint` callback")
    config = validate_config({"name": spec.get("name"), "config": spec.get("config", {}),
                              "framework_version": __version__, "recipe": results.get("recipe"),
                              "command": results.get("command")})
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)  # never unpickles arbitrary objects
    except Exception as err:
        raise UnsafeWeightsError(f"cannot load {ckpt_path} with weights_only=True: {err}") from err
    state = ckpt.get("state_dict", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        raise UnsafeWeightsError(f"{ckpt_path} holds no state_dict")
    if any(k.startswith("model.") for k in state):  # a LightningModule's keys: keep its backbone `.model`
        state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    model = _build(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise UnsafeWeightsError(f"{ckpt_path} does not fit model {config['name']!r}: {err}") from err
    choices = results.get("choices") or {}
    return _Bundle(
        model, config, {k: float(v) for k, v in (results.get("metrics") or {}).items()},
        [choices["data"]] if choices.get("data") else [], choices.get("module"), ckpt.get("global_step"),
        _file_or_none(run_dir / "csv" / "metrics.csv"), _file_or_none(run_dir / ".hydra" / "config.yaml"),
    )


def _bundle_from_module(module: nn.Module, info: dict[str, Any]) -> _Bundle:
    model = module if hasattr(module, "init_config") else getattr(module, "model", None)
    if not isinstance(model, nn.Module) or not hasattr(model, "init_config"):
        raise TypeError(f"{type(module).__name__} has no .init_config (and no .model with one): only models"
                        " built on framework.models.base.RecordsConfig can be rebuilt by from_pretrained")
    load_catalog()
    name = info.get("model_name") or MODELS.name_of(type(model))
    command = info.get("command") or " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    config = validate_config({"name": name, "config": dict(model.init_config), "framework_version": __version__,
                              "recipe": info.get("recipe"), "command": command})
    bundle = _Bundle(model, config, datasets=list(info.get("datasets") or []), task=info.get("task"))
    trainer = getattr(module, "_trainer", None)
    if trainer is not None:
        from lightning.pytorch.loggers import CSVLogger

        bundle.metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1}
        bundle.global_step = trainer.global_step
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                logger.save()
                bundle.metrics_csv = _file_or_none(Path(logger.experiment.metrics_file_path))
        bundle.train_config = _file_or_none(Path(trainer.default_root_dir) / ".hydra" / "config.yaml")
    return bundle


def _file_or_none(path: Path) -> Path | None:
    return path if path.is_file() else None


def _stage(bundle: _Bundle, folder: Path, repo_id: str) -> None:
    from safetensors.torch import save_model

    from framework.plots import plot_training_curves

    save_model(bundle.model, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})  # dedups tied weights
    (folder / CONFIG_NAME).write_text(json.dumps(bundle.config, indent=2) + "\n")
    if bundle.train_config is not None:
        shutil.copyfile(bundle.train_config, folder / TRAIN_CONFIG_NAME)
    has_plot = False
    with contextlib.suppress(ValueError):  # nothing logged yet: a card without a plot
        has_plot = bundle.metrics_csv is not None and plot_training_curves(bundle.metrics_csv, folder / PLOT_NAME)
    (folder / CARD_NAME).write_text(_model_card(bundle, repo_id, has_plot))


def _model_card(bundle: _Bundle, repo_id: str, has_plot: bool) -> str:
    from huggingface_hub import EvalResult, ModelCardData

    cfg, name = bundle.config, bundle.config["name"]
    finite = {k: v for k, v in sorted(bundle.metrics.items()) if math.isfinite(v)}
    dataset = bundle.datasets[0] if bundle.datasets else "unknown"
    evals = [EvalResult(task_type=bundle.task or "other", dataset_type=dataset, dataset_name=dataset,
                        metric_type=k, metric_name=k, metric_value=v) for k, v in finite.items()]
    tags = [t for t in ("framework", "pytorch-lightning", "safetensors", name, cfg.get("recipe")) if t]
    data = ModelCardData(library_name="framework", tags=tags, datasets=bundle.datasets or None,
                         metrics=list(finite) or None, model_name=repo_id, eval_results=evals or None)
    params = sum(p.numel() for p in bundle.model.parameters())
    rows = "\n".join(f"| {k} | {v:.6g} |" for k, v in sorted(bundle.metrics.items())) or "| (none logged) | |"
    step = f" after step {bundle.global_step}" if bundle.global_step is not None else ""
    recipe = f" with recipe `{cfg['recipe']}`" if cfg.get("recipe") else ""
    card = [
        f"---\n{data.to_yaml()}\n---\n\n# {repo_id}\n\nA `{name}` model ({params:,} parameters) trained by framework"
        f" {cfg['framework_version']}{recipe}.\n\n## Usage\n\n```python\nfrom framework.hub import from_pretrained\n\n"
        f"model = from_pretrained({repo_id!r})  # eval mode: rebuilt by registry name, safetensors weights\n```\n\n"
        f"or `python -m framework.hub pull {repo_id}`.\n\n## Metrics\n\nFinal values{step}.\n\n"
        f"| metric | value |\n|---|---|\n{rows}\n",
    ]
    if has_plot:
        card.append(f"\n## Training curves\n\n![training curves]({PLOT_NAME})\n")
    if cfg.get("command"):
        card.append(f"\n## Training command\n\n```bash\n{cfg['command']}\n```\n")
    card.append(f"\n## Model config\n\n```json\n{json.dumps(cfg['config'], indent=2)}\n```\n")
    return "".join(card)


def _commit(folder: Path, repo_id: str, revision: str | None, private: bool, message: str) -> Pushed:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    api = HfApi(library_name="framework", library_version=__version__)  # endpoint: HF_ENDPOINT
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    staged = sorted(p.name for p in folder.iterdir())
    stale = set(ARTIFACTS) & set(api.list_repo_files(repo_id, revision=revision)) - set(staged)
    ops = [CommitOperationAdd(path_in_repo=n, path_or_fileobj=str(folder / n)) for n in staged]
    ops += [CommitOperationDelete(path_in_repo=n) for n in sorted(stale)]  # e.g. a plot this push lacks
    info = api.create_commit(repo_id, ops, commit_message=message, revision=revision)
    return Pushed(repo_id, revision or "main", info.oid, info.commit_url)


def _redact(text: str) -> str:
    """`text` with the Hub token, if any, replaced: errors may be printed and logged."""
    from huggingface_hub import get_token

    token = get_token()
    return text.replace(token, "***") if token else text


def record_push(run_dir: str | Path, pushed: Pushed) -> dict[str, str]:
    """Record `pushed` as `"hub"` in run_dir/results.json (atomically); returns what was recorded."""
    path = Path(run_dir) / "results.json"
    if path.is_file():
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({**json.loads(path.read_text()), "hub": asdict(pushed)}, indent=2))
        os.replace(tmp, path)
    return asdict(pushed)


# ---- CLI ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """`python -m framework.hub push RUN_DIR REPO_ID` / `pull REPO_ID`; exit 1 when the Hub fails, 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m framework.hub", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    push = sub.add_parser("push", help="publish a finished run dir as one commit")
    push.add_argument("run_dir", type=Path, help="Hydra run dir of `python -m framework.train`")
    push.add_argument("repo_id", help="'namespace/name'")
    push.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    push.add_argument("--private", action="store_true", help="create the repo as private")
    pull = sub.add_parser("pull", help="download a pushed model, check it loads, print where it is")
    pull.add_argument("repo_id")
    pull.add_argument("--revision", help="branch, tag or commit id (default main)")
    args = parser.parse_args(argv)
    from huggingface_hub.errors import EntryNotFoundError

    try:
        if args.command == "push":
            pushed = push_to_hub(args.run_dir, args.repo_id, args.revision, args.private)
            record_push(args.run_dir, pushed)
            print(f"pushed {args.run_dir} to {pushed.repo_id}@{pushed.revision}: commit {pushed.commit}")
            print(pushed.url)
        else:
            model, config, commit, weights = _load(args.repo_id, args.revision)
            with contextlib.suppress(EntryNotFoundError):  # the card is for people; the model does not need it
                _download(args.repo_id, CARD_NAME, commit or args.revision)
            params = sum(p.numel() for p in model.parameters())
            values = ", ".join(f"{k}={v}" for k, v in config["config"].items())
            print(f"downloaded {args.repo_id}@{commit or args.revision or 'main'} to {Path(weights).parent}")
            print(f"{config['name']} ({type(model).__name__}, {params:,} parameters): {values}")
    except Exception as err:  # one line, never a token: 2 = refused input, 1 = the Hub failed
        bad_input = isinstance(err, (ValueError, TypeError, LookupError, FileNotFoundError))
        message = " ".join(_redact(str(err)).split())
        print(f"error: {'' if bad_input else type(err).__name__ + ': '}{message}", file=sys.stderr)
        return 2 if bad_input else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
