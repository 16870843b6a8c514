"""`python -m framework.train recipe=NAME [group=choice ...] [key=value ...]`

Composes the config from the catalog (hydra-zen), seeds everything, builds data, module, optimizer,
callbacks and trainer, runs fit (and test where asked), and writes everything under the Hydra run dir:
the composed config, CSV logs, checkpoints and `results.json`.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.conf import HydraConf, JobConf, RunDir, SweepDir
from hydra.core.hydra_config import HydraConfig
from hydra_zen import builds, make_config, zen

from framework import __version__
from framework.callbacks.safety import GracefulInterrupt, NonFiniteLossError, StopOnNonFinite
from framework.checkpointing import AtomicCheckpointIO, CheckpointError, ResumableCSVLogger, check_checkpoint
from framework.registry import METRICS, MODULES, ZEN_STORE, load_catalog

RUN_DIR = "${hydra:runtime.output_dir}"

TrainerConf = builds(
    L.Trainer,
    populate_full_signature=True,
    zen_partial=True,
    accelerator="cpu",
    devices=1,
    max_steps=200,
    max_epochs=-1,
    val_check_interval=None,
    check_val_every_n_epoch=1,
    log_every_n_steps=10,
    num_sanity_val_steps=0,
    inference_mode=False,  # no_grad for evaluation: metric states stay ordinary tensors across validate/fit
    use_distributed_sampler=False,  # framework data modules shard themselves, deterministically
    enable_model_summary=False,
    enable_progress_bar=None,  # None: a bar on a terminal, quiet when output goes to a file or pipe
    default_root_dir=RUN_DIR,
)

HubConf = make_config(repo_id=None, revision=None, private=False, every_n_validations=0)

DEFAULTS = [
    "_self_",
    {"data": "byte_corpus"},
    {"model": "transformer_lm"},
    {"module": "causal_lm"},
    {"optimizer": "adamw"},
    {"scheduler": "warmup_cosine"},
    {"callbacks": ["checkpoint"]},
    {"loss": None},
    {"metric": None},  # a registered metric (e.g. `metric=gicdm`), for modules that take one
    {"sampler": None},  # dynamic data selection (`sampler=data_agent`); None trains on every sample as before
    {"recipe": None},  # last: a recipe overrides the choices above; None lets `recipe=NAME` go without '+'
]

TrainConfig = make_config(
    hydra_defaults=DEFAULTS,
    data=None,
    model=None,
    module=None,
    optimizer=None,
    scheduler=None,
    callbacks=None,
    loss=None,
    sampler=None,
    metric=None,
    recipe=None,
    trainer=TrainerConf,
    hub=HubConf,
    seed=0,
    threads=None,
    ckpt_path=None,
    init_from=None,
    validate_before_fit=True,
    test=False,
)


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python, NumPy and torch before anything is built; optionally fix the torch thread count."""
    L.seed_everything(seed, workers=True, verbose=False)
    if threads:
        torch.set_num_threads(int(threads))


def train(
    data: L.LightningDataModule,
    model: Any,
    module: Any,
    optimizer: Any,
    trainer: Any,
    hub: Any,
    seed: int,
    scheduler: Any = None,
    callbacks: dict[str, L.Callback] | None = None,
    loss: Any = None,
    sampler: Any = None,
    metric: Any = None,
    ckpt_path: str | None = None,
    init_from: str | None = None,
    validate_before_fit: bool = True,
    test: bool = False,
) -> dict[str, Any]:
    """The one place where registered parts are wired together. Returns the final metrics."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if getattr(data, "seed", 0) is None:
        data.seed = seed
    lm, callbacks = assemble(data, model, module, optimizer, scheduler, loss, metric, sampler, callbacks, seed)
    if init_from:
        from framework.hub import load_weights_into

        load_weights_into(lm.model, init_from)
    resume_step = None  # in-place resume: logs continue from the checkpoint's step (rows after it are dropped)
    if ckpt_path:  # a missing, damaged, non-finite or foreign checkpoint is refused before anything is written
        resume_step = int(_or_exit(check_checkpoint, ckpt_path, lm, code=2).get("global_step", 0))
        ckpt_path = str(Path(ckpt_path).resolve())
    loggers = [ResumableCSVLogger(save_dir=str(run_dir), name="csv", version="", resume_step=resume_step)]
    try:
        import tensorboard  # noqa: F401
        from lightning.pytorch.loggers import TensorBoardLogger

        purge = {} if resume_step is None else {"purge_step": resume_step}  # hides the abandoned steps' events
        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="tb", version="", **purge))
    except ImportError:
        pass
    bar = trainer.keywords.get("enable_progress_bar")
    command = "python -m framework.train " + " ".join(shlex.quote(a) for a in sys.argv[1:] if "ckpt_path=" not in a)
    interrupt = GracefulInterrupt(resume_hint=command)
    guards = [StopOnNonFinite(resume_hint=_lower_lr_command(optimizer)), interrupt]
    show_bar = sys.stdout.isatty() if bar is None else bool(bar)
    if show_bar and importlib.util.find_spec("rich") is not None:  # rich's bar where `rich` is installed
        from lightning.pytorch.callbacks import RichProgressBar

        guards.append(RichProgressBar())
    run = trainer(
        callbacks=list((callbacks or {}).values()) + _hub_callbacks(hub) + guards,
        logger=loggers,
        enable_progress_bar=show_bar,
        plugins=trainer.keywords.get("plugins") or [AtomicCheckpointIO()],  # a kill never corrupts a checkpoint
    )

    start = time.time()
    initial: dict[str, float] = {}
    if validate_before_fit and ckpt_path is None:
        initial = {
            f"{k}_init": _num(v) for k, v in run.validate(lm, datamodule=data, verbose=False)[0].items()
        }
    _or_exit(run.fit, lm, datamodule=data, ckpt_path=ckpt_path, code=1)
    metrics = {k: _num(v) for k, v in run.callback_metrics.items()}
    if interrupt.saved_path:  # Ctrl-C: stop here, on every rank; the checkpoint and the resume command are printed
        if run.is_global_zero:
            (run_dir / "results.json").write_text(json.dumps(
                {"interrupted": True, "global_step": run.global_step, "metrics": metrics,
                 "checkpoint": interrupt.saved_path, "resume": f"{command} ckpt_path={interrupt.saved_path}",
                 "resumed_from": ckpt_path},
                indent=2))
        raise SystemExit(130)
    for cb in run.callbacks:  # callbacks that evaluate something (e.g. mask_sweep) report here
        metrics.update({k: _num(v) for k, v in getattr(cb, "results", dict)().items()})
    if run.limit_val_batches:  # the final weights' validation numbers, not the last scheduled check's
        metrics.update({k: _num(v) for k, v in run.validate(lm, datamodule=data, verbose=False)[0].items()})
    if test:
        metrics.update(
            {f"test/{k}": _num(v) for k, v in run.test(lm, datamodule=data, verbose=False)[0].items()}
        )

    choices = HydraConfig.get().runtime.choices
    results = {
        "recipe": choices.get("recipe"),
        "choices": {k: v for k, v in choices.items() if not k.startswith("hydra")},
        "metrics": metrics,
        "initial_metrics": initial,
        "global_step": run.global_step,
        "seconds": round(time.time() - start, 2),
        "run_dir": str(run_dir),
        "last_checkpoint": _last_checkpoint(run),
        "resumed_from": ckpt_path,  # the checkpoint this run continued (absolute path), None for a fresh run
        "command": "python -m framework.train " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "framework_version": __version__,
    }
    if run.is_global_zero:
        spec = model_spec(lm.model, choices.get("model"), getattr(lm, "mask_id", None))
        (run_dir / "model_config.json").write_text(json.dumps(spec, indent=2))
        (run_dir / "results.json").write_text(json.dumps(results, indent=2))
        print(summary(results))
        if hub.repo_id:
            results["hub"] = _push_run(run_dir, hub)
    elif run.world_size > 1:  # each rank's own view, to check that ranks agree
        (run_dir / f"results.rank{run.global_rank}.json").write_text(json.dumps(results, indent=2))
    return results


def _or_exit(fn: Any, *args: Any, code: int, **kw: Any) -> Any:
    """Run `fn`; the errors whose message says it all (bad checkpoint, NaN loss) become one `error:` line + exit."""
    try:
        return fn(*args, **kw)
    except (CheckpointError, NonFiniteLossError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(code) from None


def assemble(
    data: Any,
    model: Any,
    module: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    loss: Any = None,
    metric: Any = None,
    sampler: Any = None,
    callbacks: dict[str, L.Callback] | None = None,
    seed: int | None = 0,
) -> tuple[L.LightningModule, dict[str, L.Callback]]:
    """Wire the built groups into the LightningModule and the callback set that `train` fits (the CLI's preflight
    runs the same on the meta device, so a group this ignores would show). A `metric` goes to a module whose
    constructor takes `metric`; any other module refuses it (ValueError naming the modules that take one)."""
    extra: dict[str, Any] = {"extra_loss": complete_from(loss, data)()} if loss is not None else {}
    if metric is not None:
        target = getattr(module, "func", module)
        if "metric" not in inspect.signature(target).parameters:
            takers = [n for n in MODULES.names() if "metric" in inspect.signature(MODULES.get(n)).parameters]
            raise ValueError(f"metric={_registered_name(METRICS, type(metric))}: module "
                             f"{_registered_name(MODULES, target)!r} takes no metric, so it would be ignored; "
                             f"modules that evaluate one: {', '.join(takers) or '(none)'}")
        extra["metric"] = metric
    lm = complete_from(module, data)(model=model, optimizer=optimizer, scheduler=scheduler, **extra)
    callbacks = dict(callbacks or {})
    if sampler is not None:  # a selection policy: the DataSelection callback runs it (added if not listed)
        from framework.callbacks.data_agent import with_selection

        callbacks = with_selection(callbacks, sampler() if isinstance(sampler, functools.partial) else sampler, seed)
    return lm, callbacks


def _registered_name(registry: Any, target: Any) -> str:
    try:
        return registry.name_of(target)
    except LookupError:
        return getattr(target, "__name__", repr(target))


def complete_from(factory: Any, data: Any) -> Any:
    """Fill a partial's arguments that the recipe left unset (None) from the data of the same name.

    This is how a model or loss learns the vocabulary size or the [MASK] id without the recipe repeating them.
    """
    if not isinstance(factory, functools.partial):
        return factory
    names = inspect.signature(factory.func).parameters
    fill = {
        name: getattr(data, name)
        for name in ("vocab_size", "mask_id", "pad_id", "num_classes", "input_shape")
        if name in names and factory.keywords.get(name) is None and getattr(data, name, None) is not None
    }
    return functools.partial(factory, **fill) if fill else factory


def summary(results: dict[str, Any]) -> str:
    """A one-screen account of a finished run: final metrics (with the untrained values) and where things are."""
    init = results["initial_metrics"]
    lines = [f"== {results['recipe'] or 'run'} finished: {results['global_step']} steps in {results['seconds']} s =="]
    for key, value in sorted(results["metrics"].items()):
        before = init.get(f"{key}_init")
        lines.append(f"  {key:24s} {value:10.4f}" + (f"   (untrained: {before:.4f})" if before is not None else ""))
    lines += [
        f"  run dir          {results['run_dir']}",
        f"  results          {results['run_dir']}/results.json",
        f"  last checkpoint  {results['last_checkpoint']}",
    ]
    return "\n".join(lines)


def model_spec(model: Any, name: str | None, mask_id: int | None = None) -> dict[str, Any]:
    """The registry name and plain constructor values that rebuild `model` (what the Hub's config.json holds),
    plus the [MASK] id of a masked diffusion model (what `python -m framework.generate` appends)."""
    spec = {"name": name, "config": dict(getattr(model, "init_config", {}))}
    return spec if mask_id is None else {**spec, "mask_id": int(mask_id)}


def _hub_callbacks(hub: Any) -> list[L.Callback]:
    """Checks `hub.repo_id` before training; `hub.every_n_validations>0` adds intermediate pushes."""
    if not hub.repo_id:
        return []
    from framework.callbacks.hub_push import HubPush
    from framework.hub import check_repo_id

    check_repo_id(hub.repo_id)
    if not hub.every_n_validations:
        return []
    choices = HydraConfig.get().runtime.choices
    info = {"recipe": choices.get("recipe"), "model_name": choices.get("model"), "task": choices.get("module"),
            "datasets": [choices["data"]] if choices.get("data") else [],
            "command": "python -m framework.train " + " ".join(shlex.quote(a) for a in sys.argv[1:])}
    return [HubPush(hub.repo_id, hub.revision, hub.private, hub.every_n_validations, push_at_end=False, info=info)]


def _push_run(run_dir: Path, hub: Any) -> dict[str, str]:
    """Push the finished run dir as one commit and record it in results.json; exit 3 (all on disk) if it fails."""
    from framework.hub import HubPushError, push_to_hub, record_push, retry_command

    args = (hub.repo_id, hub.revision, bool(hub.private))
    try:
        pushed = push_to_hub(run_dir, *args)
    except Exception as err:
        retry = "" if isinstance(err, HubPushError) else f" Retry with: {retry_command(run_dir, *args)}"
        print(f"error: training finished and everything is in {run_dir} (results.json, checkpoints, logs), but the"
              f" push to the Hub failed. {err}{retry}", file=sys.stderr)
        raise SystemExit(3) from None
    print(f"pushed to the Hub: {pushed.url}")
    return record_push(run_dir, pushed)


def _num(v: Any) -> float:
    value = float(v.item() if hasattr(v, "item") else v)
    return value if math.isfinite(value) else float("nan")


def _lower_lr_command(optimizer: Any) -> str:
    """This run's command line with `optimizer.lr` at a tenth of this run's lr (what a NaN/inf stop suggests)."""
    args = [a for a in sys.argv[1:] if "ckpt_path=" not in a and not a.lstrip("+").startswith("optimizer.lr=")]
    lr = optimizer.keywords.get("lr") if isinstance(optimizer, functools.partial) else None
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        args.append(f"optimizer.lr={lr / 10:.3g}")
    return "python -m framework.train " + " ".join(shlex.quote(a) for a in args)


def _last_checkpoint(run: L.Trainer) -> str | None:
    cb = run.checkpoint_callback
    if cb is None:
        return None
    return getattr(cb, "last_model_path", None) or getattr(cb, "best_model_path", None) or None


def register_app() -> None:
    """Fill the catalog and hand every config (groups, recipes, the primary `train`) to Hydra."""
    load_catalog()
    ZEN_STORE(TrainConfig, name="train")
    ZEN_STORE(
        HydraConf(
            job=JobConf(name="train", chdir=False),
            run=RunDir("outputs/${hydra.job.name}/${now:%Y-%m-%d_%H-%M-%S}"),
            sweep=SweepDir("multirun/${hydra.job.name}/${now:%Y-%m-%d_%H-%M-%S}", subdir="${hydra.job.num}"),
        ),
        name="config",
        group="hydra",
    )
    ZEN_STORE.add_to_hydra_store(overwrite_ok=True)


task = zen(train, pre_call=zen(seed_everything))


def main() -> None:
    """`python -m framework.train`: the command line is checked (`framework.cli.check_command_line`: names, keys,
    types, then every value, by building the run on the meta device) before Hydra runs or writes anything."""
    from framework.cli import check_command_line

    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    register_app()
    sys.argv[1:] = check_command_line(sys.argv[1:])
    task.hydra_main(config_name="train", config_path=None, version_base="1.3")


if __name__ == "__main__":
    main()
