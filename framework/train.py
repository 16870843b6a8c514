"""`python -m framework.train recipe=NAME [group=choice ...] [key=value ...]`

Composes the config from the catalog (hydra-zen), seeds everything, builds data, module, optimizer,
callbacks and trainer, runs fit (and test where asked), and writes everything under the Hydra run dir:
the composed config, CSV logs, checkpoints and `results.json`.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra_zen import builds, make_config, zen
from lightning.pytorch.utilities import rank_zero_only

from framework.callbacks.run_record import RunRecord, numbers
from framework.callbacks.safety import GracefulInterrupt, NonFiniteLossError, StopOnNonFinite
from framework.checkpointing import AtomicCheckpointIO, CheckpointError, ResumableCSVLogger, check_checkpoint
from framework.modules.data_spec import DataSpec
from framework.registry import LOSSES, METRICS, MODULES, ZEN_STORE, load_catalog
from framework.run_log import log_to_run_file, quiet_console
from framework.strategies import FSDP2Strategy  # noqa: F401 - importing it registers `trainer.strategy=fsdp2`

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
    {"recipe": None},  # a recipe overrides the choices above; None lets `recipe=NAME` go without '+'
    {"size": "cpu"},  # conf/size/: cpu (the recipe's own values), smoke, gpu; after the recipe, so it wins
    {"optional preset": "${recipe}/${size}"},  # conf/preset/RECIPE/SIZE.yaml: that recipe's values for the size
    {"override hydra/job_logging": "framework"},  # conf/hydra/job_logging/framework.yaml
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
    """Instantiate the run from the composed groups, fit it, record it. Returns the results (`results.json`)."""
    log_to_run_file()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    choices = dict(HydraConfig.get().runtime.choices)
    lm, callbacks = assemble(data, model, module, optimizer, scheduler, loss, metric, sampler, callbacks, seed, choices)
    if init_from:
        from framework.hub import load_weights_into
        from framework.hub.catalog import build

        load_weights_into(lm.model, init_from, build=build)
    resume_step, ckpt_path = _checked_resume(ckpt_path, lm)
    record = RunRecord(run_dir, command_line(), command_line(drop=("ckpt_path",)), choices, resumed_from=ckpt_path)
    interrupt = GracefulInterrupt(resume_hint=record.resume_command)
    show_bar = _show_progress_bar(trainer.keywords.get("enable_progress_bar"))
    run = trainer(
        callbacks=[*callbacks.values(), *_hub_callbacks(hub), *_guards(optimizer, interrupt, show_bar), record],
        logger=_loggers(run_dir, resume_step),
        enable_progress_bar=show_bar,
        plugins=trainer.keywords.get("plugins") or [AtomicCheckpointIO()],  # a kill never corrupts a checkpoint
    )

    initial = {}
    if validate_before_fit and ckpt_path is None:
        metrics = run.validate(lm, datamodule=data, verbose=False)  # [] when trainer.limit_val_batches=0
        initial = numbers(metrics[0], suffix="_init") if metrics else {}
    _or_exit(run.fit, lm, datamodule=data, ckpt_path=ckpt_path, code=1)
    if interrupt.saved_path:  # Ctrl-C: stop here, on every rank; the checkpoint and the resume command are printed
        record.interrupted(run, interrupt.saved_path)
        raise SystemExit(130)
    results = record.finish(run, lm, initial, _final_metrics(run, lm, data, test))
    if run.is_global_zero and hub.repo_id:
        results["hub"] = _push_run(run_dir, hub)
    return results


def command_line(extra: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> str:
    """This run's command, as typed (`sys.argv`), without the `drop` keys' overrides and with `extra` appended."""
    keep = [a for a in sys.argv[1:] if not any(a.lstrip("+").startswith(f"{key}=") for key in drop)]
    return "python -m framework.train " + " ".join(shlex.quote(a) for a in [*keep, *extra])


def _checked_resume(ckpt_path: str | None, lm: L.LightningModule) -> tuple[int | None, str | None]:
    """The step a resumed run continues from and the checkpoint's absolute path; (None, None) for a fresh run.
    A missing, damaged, non-finite or foreign checkpoint is refused (exit 2) before anything is written."""
    if not ckpt_path:
        return None, None
    step = int(_or_exit(check_checkpoint, ckpt_path, lm, code=2).get("global_step", 0))
    return step, str(Path(ckpt_path).resolve())


def _loggers(run_dir: Path, resume_step: int | None) -> list[Any]:
    """CSV logs (and TensorBoard's where installed); a resumed run continues them from its step, dropping later
    rows (and hiding TensorBoard's abandoned events)."""
    loggers = [ResumableCSVLogger(save_dir=str(run_dir), name="csv", version="", resume_step=resume_step)]
    try:
        import tensorboard  # noqa: F401
        from lightning.pytorch.loggers import TensorBoardLogger
    except ImportError:
        return loggers
    purge = {} if resume_step is None else {"purge_step": resume_step}
    return [*loggers, TensorBoardLogger(save_dir=str(run_dir), name="tb", version="", **purge)]


def _show_progress_bar(setting: bool | None) -> bool:
    """`trainer.enable_progress_bar`; None: a bar on a terminal, quiet when output goes to a file or pipe."""
    return sys.stdout.isatty() if setting is None else bool(setting)


def _guards(optimizer: Any, interrupt: GracefulInterrupt, show_bar: bool) -> list[L.Callback]:
    """Stop on a non-finite loss (suggesting a tenth of the lr), save on Ctrl-C, and rich's bar where installed."""
    guards: list[L.Callback] = [StopOnNonFinite(resume_hint=_lower_lr_command(optimizer)), interrupt]
    if show_bar and importlib.util.find_spec("rich") is not None:
        from lightning.pytorch.callbacks import RichProgressBar

        guards.append(RichProgressBar())
    return guards


def _final_metrics(run: L.Trainer, lm: L.LightningModule, data: Any, test: bool) -> dict[str, float]:
    """The logged metrics, what evaluating callbacks report (e.g. mask_sweep), the final weights' validation
    numbers (not the last scheduled check's) and, with `test=true`, the test set's (`test/...`)."""
    metrics = numbers(run.callback_metrics)
    for cb in run.callbacks:
        metrics.update(numbers(getattr(cb, "results", dict)()))
    if run.limit_val_batches:
        metrics.update(numbers(run.validate(lm, datamodule=data, verbose=False)[0]))
    if test:
        metrics.update(numbers(run.test(lm, datamodule=data, verbose=False)[0], prefix="test/"))
    return metrics


def _or_exit(fn: Any, *args: Any, code: int, **kw: Any) -> Any:
    """Run `fn`; the errors whose message says it all (bad checkpoint, NaN loss) become one `error:` line + exit."""
    try:
        return fn(*args, **kw)
    except (CheckpointError, NonFiniteLossError) as err:
        if rank_zero_only.rank == 0:  # every rank stops; one prints (the ranks' messages differ only in detail)
            print(f"error: {err}", file=sys.stderr)
        raise SystemExit(code) from None


#: group → the module's constructor argument it is handed to (the `loss` group is a module's extra loss term)
MODULE_ARGS = {"loss": "extra_loss", "metric": "metric"}


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
    choices: dict[str, Any] | None = None,
) -> tuple[L.LightningModule, dict[str, L.Callback]]:
    """Wire the built groups into the LightningModule and the callback set that `train` fits (the CLI's preflight
    runs the same on the meta device, so a group this ignores would show). A data module without a seed takes
    the run's. A `loss` or `metric` goes to a module whose constructor takes it (`MODULE_ARGS`); any other module
    refuses it (ValueError naming the modules that take one, and the group's choice from `choices` if given)."""
    if getattr(data, "seed", 0) is None:
        data.seed = seed
    spec = DataSpec.of(data)
    extra = {MODULE_ARGS[group]: _handed_to(module, group, part, (choices or {}).get(group))
             for group, part in (("loss", loss), ("metric", metric)) if part is not None}
    if "extra_loss" in extra:  # the loss is built (with the data's mask and pad ids) once the module takes it
        extra["extra_loss"] = spec.complete(loss)()
    lm = spec.complete(module)(model=model, optimizer=optimizer, scheduler=scheduler, **extra)
    callbacks = dict(callbacks or {})
    if sampler is not None:  # a selection policy: the DataSelection callback runs it (added if not listed)
        from framework.callbacks.selection import with_selection

        callbacks = with_selection(callbacks, sampler() if isinstance(sampler, functools.partial) else sampler, seed)
    return lm, callbacks


def _handed_to(module: Any, group: str, part: Any, choice: str | None = None) -> Any:
    """`part` (the built `group` choice), after checking that `module` takes it; ValueError in the user's words."""
    target, arg = getattr(module, "func", module), MODULE_ARGS[group]
    if arg in inspect.signature(target).parameters:
        return part
    registry = {"loss": LOSSES, "metric": METRICS}[group]
    kind = getattr(part, "func", type(part))
    names = [n for n in registry.names() if registry.get(n) is kind]
    choice = choice or (names[0] if len(names) == 1 else None)
    chosen = f"{group}={choice}" if choice else f"{group} {getattr(kind, '__name__', kind)}"
    takers = [n for n in MODULES.names() if arg in inspect.signature(MODULES.get(n)).parameters]
    what, verb = ("loss term", "add") if group == "loss" else ("metric", "evaluate")
    raise ValueError(f"{chosen}: module {_registered_name(MODULES, target)!r} takes no {what}, so it would be "
                     f"ignored; modules that {verb} one: {', '.join(takers) or '(none)'}")


def _registered_name(registry: Any, target: Any) -> str:
    try:
        return registry.name_of(target)
    except LookupError:
        return getattr(target, "__name__", repr(target))


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
            "command": command_line()}
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


def _lower_lr_command(optimizer: Any) -> str:
    """This run's command line with `optimizer.lr` at a tenth of this run's lr (what a NaN/inf stop suggests)."""
    lr = optimizer.keywords.get("lr") if isinstance(optimizer, functools.partial) else None
    lower = (f"optimizer.lr={lr / 10:.3g}",) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else ()
    return command_line(lower, drop=("ckpt_path", "optimizer.lr"))


def register_app(conf_folders: list[Path] | None = None) -> None:
    """Fill the catalog and hand every config (groups, recipes, the primary `train`, conf/'s YAML: Hydra settings,
    sizes, presets, YAML recipes; then that of `conf_folders`, the command line's `hydra.searchpath`) to Hydra."""
    from framework.recipe import CONF_DIR, load_conf

    load_catalog()
    ZEN_STORE(TrainConfig, name="train")
    load_conf(CONF_DIR)
    for folder in conf_folders or []:
        load_conf(folder, store=False)  # Hydra reads these itself; the catalog learns their recipe names
    ZEN_STORE.add_to_hydra_store(overwrite_ok=True)


task = zen(train, pre_call=zen(seed_everything))


def main() -> None:
    """`python -m framework.train`: the command line is checked (`framework.cli.check_command_line`: names, keys,
    types, then every value, by building the run on the meta device) before Hydra runs or writes anything."""
    from framework.cli import check_command_line
    from framework.recipe import searchpath_folders

    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    quiet_console()
    register_app(searchpath_folders(sys.argv[1:]))
    sys.argv[1:] = check_command_line(sys.argv[1:])
    task.hydra_main(config_name="train", config_path=None, version_base="1.3")


if __name__ == "__main__":
    main()
