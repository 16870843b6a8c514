"""The Hydra application of `python -m framework.train`: the Trainer and Hub settings, the defaults list, the primary
`train` config, and `register_app`, which hands the catalog and conf/'s YAML to Hydra's store."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra_zen import builds, make_config

from framework.callbacks.safety import StopOnNonFinite
from framework.registry import ZEN_STORE, load_catalog

RUN_DIR = "${hydra:runtime.output_dir}"

TrainerConf = builds(
    L.Trainer,
    populate_full_signature=True,
    zen_partial=True,
    accelerator="auto",  # a GPU where there is one (size=gpu insists on it), the CPU otherwise
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
HubConf.__doc__ = """The `hub.*` run keys: where `python -m framework.train` publishes the finished run (rank 0 only).

    Args:
        repo_id: Hub model repository "namespace/name" to push the run to at the end; None: no push.
        revision: branch to push to (created if missing); None: main.
        private: create the repository as private (an existing one keeps its visibility).
        every_n_validations: also push after every N-th validation during fit; 0: only at the end.
    """

#: the NaN/inf guard (`guard.every_n_steps=1` reads every step's loss at once; `guard=null` turns it off)
GuardConf = builds(StopOnNonFinite, every_n_steps=50, check_state=True, divergence=10.0)

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
    {"peft": None},  # adapters (`peft=lora`: PEFT's LoRA); None trains every parameter
    {"recipe": None},  # a recipe overrides the choices above; None lets `recipe=NAME` go without '+'
    {"size": "cpu"},  # conf/size/: cpu (the recipe's own values), smoke, gpu; after the recipe, so it wins
    {"optional preset": "${recipe}/${size}"},  # conf/preset/RECIPE/SIZE.yaml: that recipe's values for the size
    {"optional lr": "${recipe}__${optimizer}__${peft}"},  # the recipe's lr for this optimizer and peft (None: none)
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
    peft=None,
    recipe=None,
    trainer=TrainerConf,
    hub=HubConf,
    guard=GuardConf,
    seed=0,
    threads=None,
    ckpt_path=None,
    init_from=None,
    validate_before_fit=True,
    test=False,
)
TrainConfig.__doc__ = """The run keys of `python -m framework.train`: the component groups, the Trainer, and how to run.

    Args:
        data: the data module (`data=NAME` picks a registered one; `data.KEY=...` sets its arguments).
        model: the network (`model=NAME`); its sizes that the data knows are filled in at build time.
        module: the LightningModule that trains the model (`module=NAME`).
        optimizer: the optimizer (`optimizer=NAME`), built over the module's parameters.
        scheduler: the learning-rate schedule (`scheduler=NAME`); null: a constant lr.
        callbacks: the Lightning callbacks, by name (`callbacks=[checkpoint,lr_monitor]`).
        loss: an extra loss for modules that take one (`loss=NAME`); null: none.
        sampler: a data-selection policy (`sampler=NAME`); null: every sample, every epoch.
        metric: a registered metric for modules that take one (`metric=gicdm`); null: none.
        peft: parameter-efficient adapters (`peft=lora`); null: every parameter trains.
        recipe: a registered recipe that sets the choices and values above (`recipe=NAME`); null: none.
        trainer: `lightning.Trainer` arguments (`trainer.max_steps=...`); callbacks and loggers are added to them.
        hub: where the finished run is pushed (`hub.repo_id=...`); see `HubConf`.
        guard: the NaN/inf guard (`StopOnNonFinite`), stopping before a bad checkpoint is written; null turns it off.
        seed: seed of Python, NumPy and torch before anything is built, and of data modules that take none.
        threads: torch CPU threads (`torch.set_num_threads`); null: torch's default.
        ckpt_path: checkpoint to resume from, checked first; "auto": the run dir's newest good one; null: a fresh run.
        init_from: start from these weights (a run dir, `.ckpt` file or Hub model repo) without resuming its training.
            A source holding a PEFT adapter is attached as the adapters and trained on.
        validate_before_fit: validate once before training (metrics `*_init`); skipped when resuming.
        test: also evaluate on the data's test split after fit (metrics `test/...`).
    """


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python, NumPy and torch before anything is built; optionally fix the torch thread count."""
    L.seed_everything(seed, workers=True, verbose=False)
    if threads:
        torch.set_num_threads(int(threads))


_TRAIN_STORED = False


def register_app(conf_folders: list[Path] | None = None) -> None:
    """Fill the catalog and hand every config (groups, recipes, the primary `train`, conf/'s YAML: Hydra settings,
    sizes, presets, YAML recipes; then that of `conf_folders`, the command line's `hydra.searchpath`) to Hydra."""
    from framework.recipe import CONF_DIR, load_conf

    global _TRAIN_STORED
    load_catalog()
    if not _TRAIN_STORED:  # once per process: a second call only adds its conf folders
        ZEN_STORE(TrainConfig, name="train")
        _TRAIN_STORED = True
    load_conf(CONF_DIR)
    for folder in conf_folders or []:
        load_conf(folder, store=False)  # Hydra reads these itself; the catalog learns their recipe names
    ZEN_STORE.add_to_hydra_store(overwrite_ok=True)
    share_config_store()


def share_config_store() -> None:
    """Let Hydra's copies of its config repository share the config store rather than copy it. Hydra deep-copies the
    repository each time it composes a config or lists a group's options (`--help`: once per group, about 190 times
    here), and the repository's structured source holds the whole store, every recipe's, group's and lr's node. The
    store is only read while composing and each node it hands out is a copy already (`ConfigStore.load`), so sharing
    it changes no config: it only drops the copying. Set on the sources' base class (Hydra's plugin discovery loads
    the structured source's module a second time); a source's other attributes are still copied. Idempotent."""
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.config_source import ConfigSource

    if "__deepcopy__" in vars(ConfigSource):
        return

    def share(self: Any, memo: dict[int, Any]) -> Any:
        memo[id(self)] = new = copy.copy(self)
        for key, value in vars(self).items():
            if not isinstance(value, ConfigStore):
                setattr(new, key, copy.deepcopy(value, memo))
        return new

    ConfigSource.__deepcopy__ = share
