"""`OrthogonalGrowth`: grow a model's depth and MoE width during training (arXiv 2510.08008; docs/growth.md).

At a step (or epoch) boundary it grows the LightningModule's model in place (framework.grow), rebuilds the
optimizer through the module's own `configure_optimizers` (any optimizer, OLion included) with its state reset
or duplicated onto the copies, continues the LR schedule from the global step, and records the grown
architecture in every later checkpoint, so resuming from one rebuilds the grown model before the weights load.
Works in any Lightning project whose module has `.model` (`model_attr`) with a layer `nn.ModuleList`
(`layers_attr`) and duck-typed MoE layers (`router`, `experts`, `num_experts`, `top_k`), or whose model is a
transformers MoE (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE: `framework.grow.hf`), alone or in `hf_causal_lm`.
Copies of the model the module keeps (its EMA: `copy_attrs`) are grown by the same event, so they keep matching.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.utilities import rank_zero_only
from torch import nn

from framework.callbacks.growth_events import (
    apply_event,
    check_arity,
    check_copies,
    continue_schedule,
    expand_schedule,
    model_copies,
    replay_on_copy,
)
from framework.grow.hf import block_counts, check_moe, moe_blocks, transformers_model
from framework.grow.ops import (
    DEFAULT_ZERO_PATTERNS,
    Growth,
    count_params,
    find_moe_layers,
    layer_list,
    norm_profile,
    transfer_optimizer_state,
)
from framework.rundir import GROWTH_KEY

OPTIMIZER_STATES = ("reset", "duplicate")
CHECKPOINT_KEY = GROWTH_KEY  # where a checkpoint records the grown architecture (the run dir layout)
_APPLIED = "_orthogonal_growth_applied"  # set on the LightningModule: how many growth events its model has had

# replay_on_copy lived here first: importing it from here still works
__all__ = ["CHECKPOINT_KEY", "OPTIMIZER_STATES", "OrthogonalGrowth", "replay_on_copy"]


class OrthogonalGrowth(L.Callback):
    """Grow once at `at_step` optimizer steps (before step at_step+1) or at the start of epoch `at_epoch`.

    The training batch's loss is measured before and after growing; a per-layer norm profile PNG and `growth.json`
    go to the trainer's root dir. Another copy of the model the module holds, or a callback that keeps an averaged
    copy (Lightning's `WeightAveraging`), is refused before training: growth could not keep it matching.

    Args:
        at_step: grow after this many optimizer steps (before step at_step+1); None: not by step.
        at_epoch: grow at the start of this epoch; None: not by epoch.
        depth_factor: multiply the number of layers by this integer; 1 leaves depth alone.
        depth_method: where layer copies go: "interposition" (each copied in place) or "stack" (sections stacked).
        ignore_first: first layers that are never copied in depth growth.
        ignore_last: last layers that are never copied in depth growth.
        zero_init_copies: zero each copied layer's output projections (`zero_patterns`), so growth keeps the function.
        width_factor: multiply every MoE layer's experts (and top_k) by this integer; 1 leaves width alone.
        noise_alpha: std of the noise added to copied experts and router rows, relative to each tensor's std; 0: exact.
        optimizer_state: "reset" (a fresh optimizer, the paper's) or "duplicate" (copies get their source's state).
        seed: seed of the width-growth noise, the same on every rank and on replay.
        schedule: several growth events, each dict overriding the values above (e.g. depth at 100, width at 200).
        model_attr: attribute of the LightningModule holding the model; "" grows the module itself.
        layers_attr: attribute of the model holding its `nn.ModuleList` of layers (ignored for transformers MoEs).
        zero_patterns: glob patterns of the module names (in a layer) whose parameters `zero_init_copies` zeroes.
        measure_batches: validation batches on which the loss is also measured before and after growing; 0: none.
        norm_part: matrices of the norm profile: "experts", "attn" or "all".
        plot: write the before/after norm-profile PNG.
        loss_fn: `(module, batch) -> loss`, or the name of a module method taking a batch (absent: nothing measured).
        copy_attrs: module attributes holding copies of the model (its EMA) that each event grows alike.
    """

    def __init__(
        self,
        at_step: int | None = None,
        at_epoch: int | None = None,
        depth_factor: int = 1,
        depth_method: str = "interposition",
        ignore_first: int = 0,
        ignore_last: int = 0,
        zero_init_copies: bool = False,
        width_factor: int = 1,
        noise_alpha: float = 0.01,
        optimizer_state: str = "reset",
        seed: int = 0,
        schedule: Sequence[dict[str, Any]] | None = None,
        model_attr: str = "model",
        layers_attr: str = "blocks",
        zero_patterns: Sequence[str] = DEFAULT_ZERO_PATTERNS,
        measure_batches: int = 0,
        norm_part: str = "experts",
        plot: bool = True,
        loss_fn: Callable[[L.LightningModule, Any], torch.Tensor] | str = "loss",
        copy_attrs: Sequence[str] = ("ema",),
    ):
        super().__init__()
        if optimizer_state not in OPTIMIZER_STATES:
            raise ValueError(f"optimizer_state={optimizer_state!r} is invalid; valid: {', '.join(OPTIMIZER_STATES)}")
        base = dict(at_step=at_step, at_epoch=at_epoch, depth_factor=depth_factor, depth_method=depth_method,
                    ignore_first=ignore_first, ignore_last=ignore_last, zero_init_copies=zero_init_copies,
                    width_factor=width_factor, noise_alpha=noise_alpha, seed=seed)
        self.events = expand_schedule(base, schedule)
        self.optimizer_state, self.model_attr, self.layers_attr = optimizer_state, model_attr, layers_attr
        self.zero_patterns, self.measure_batches = tuple(zero_patterns), int(measure_batches)
        self.norm_part, self.plot = norm_part, bool(plot)
        if not (isinstance(loss_fn, str) and loss_fn) and not callable(loss_fn):
            raise TypeError(f"loss_fn={loss_fn!r} must be a function (module, batch) -> loss or the name of a"
                            " module method taking a batch (default 'loss')")
        self.loss_fn = loss_fn
        if isinstance(copy_attrs, str):
            raise TypeError(f"copy_attrs={copy_attrs!r} must be a list of attribute names, e.g. [{copy_attrs!r}]")
        self.copy_attrs = tuple(str(a) for a in copy_attrs)
        self.done: list[dict[str, Any]] = []  # one record per growth applied to the current model

    # -- the model ---------------------------------------------------------------------------------------------
    def model_of(self, pl_module: L.LightningModule) -> nn.Module:
        """The grown module: `pl_module.<model_attr>` (or the LightningModule itself when model_attr is '')."""
        model = getattr(pl_module, self.model_attr) if self.model_attr else pl_module
        hf = transformers_model(model)
        if hf is not None:  # a transformers MoE: its decoder layers, whatever layers_attr says
            check_moe(hf)
            return model
        layers = getattr(model, self.layers_attr, None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(f"OrthogonalGrowth needs {self.model_attr or 'the module'}.{self.layers_attr} to be an"
                             f" nn.ModuleList of layers, got {type(layers).__name__}; set model_attr/layers_attr")
        return model

    def measure_fn(self, pl_module: L.LightningModule) -> Callable[[Any], torch.Tensor] | None:
        """`batch -> loss` from `loss_fn`; None when the default method name is absent (nothing is measured).

        Refused up front: a named attribute that cannot take one batch, e.g. `self.loss = nn.CrossEntropyLoss()`
        (it wants `(input, target)`), which would otherwise fail only at the growth step.
        """
        if not isinstance(self.loss_fn, str):
            check_arity(self.loss_fn, 2, "loss_fn", "a function (module, batch) -> loss")
            return lambda batch: self.loss_fn(pl_module, batch)
        fn = getattr(pl_module, self.loss_fn, None)
        if fn is None and self.loss_fn == "loss":
            return None
        what = f"{type(pl_module).__name__}.{self.loss_fn}"
        if not callable(fn):
            raise TypeError(f"OrthogonalGrowth(loss_fn={self.loss_fn!r}): {what} is {type(fn).__name__}, not a"
                            " method taking a batch; name one, or pass loss_fn=lambda module, batch: ...")
        check_arity(fn, 1, f"{what} ({type(fn).__name__})", "a method taking one batch; pass"
                     " loss_fn=lambda module, batch: ... (or the name of such a method)")
        return fn

    def copies_of(self, pl_module: L.LightningModule) -> dict[str, nn.Module]:
        """The copies of the model that `pl_module` keeps (its `copy_attrs` that hold a module, e.g. the EMA)."""
        return model_copies(pl_module, self.model_attr, self.copy_attrs)

    def check_run(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Before training (and in `framework.train`'s preflight): the module has layers and a loss `loss_fn` can
        call, the strategy keeps the model whole, and every copy of the model in the run is one this grows."""
        model = self.model_of(pl_module)
        self.measure_fn(pl_module)
        self.check_strategy(trainer.strategy)
        check_copies(trainer, pl_module, model, self.model_attr, self.copy_attrs)

    def _apply(self, model: nn.Module, event: dict[str, Any], structure_only: bool = False, copies_of: Any = None
               ) -> Growth:
        """Grow `model` by `event`, then every copy of it that `copies_of` (the LightningModule) keeps, alike."""
        twins = self.copies_of(copies_of).values() if copies_of is not None else ()
        return apply_event(model, event, self.layers_attr, self.zero_patterns, structure_only, copies=twins)

    @staticmethod
    def check_strategy(strategy: Any) -> None:
        """NotImplementedError under a strategy that shards the model (FSDP, FSDP2, DeepSpeed)."""
        name = type(strategy).__name__
        if "FSDP" in name or "DeepSpeed" in name or "ModelParallel" in name:
            raise NotImplementedError(f"OrthogonalGrowth grows unsharded models (single device or DDP), not under"
                                      f" {name}; grow offline with `python -m framework.grow` and resume from it")

    # -- Lightning hooks ---------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.check_run(trainer, pl_module)  # fail before training, not at the growth step
        if not hasattr(pl_module, _APPLIED):  # a model this callback has not grown yet: nothing is done to it
            object.__setattr__(pl_module, _APPLIED, 0)
            self.done = []
        if getattr(pl_module, "_orthogonal_growth_replay", None) is not self:
            original = pl_module.on_load_checkpoint

            def on_load_checkpoint(checkpoint: dict[str, Any]) -> None:
                self.replay(pl_module, checkpoint)
                original(checkpoint)

            # Lightning looks hooks up by name on the instance: this runs before the weights are loaded
            object.__setattr__(pl_module, "on_load_checkpoint", on_load_checkpoint)
            object.__setattr__(pl_module, "_orthogonal_growth_replay", self)

    def replay(self, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Apply (structurally) the growth a checkpoint records but the current model lacks."""
        recorded = (checkpoint.get(CHECKPOINT_KEY) or {}).get("done", [])
        applied = getattr(pl_module, _APPLIED, 0)
        if len(recorded) < applied:
            raise RuntimeError(f"the checkpoint records {len(recorded)} growth event(s) but the model has already"
                               f" grown {applied} time(s); load it into a freshly built (ungrown) model")
        model = self.model_of(pl_module)
        for record in recorded[applied:]:
            self._apply(model, record, structure_only=True, copies_of=pl_module)
        object.__setattr__(pl_module, _APPLIED, len(recorded))
        self.done = copy.deepcopy(list(recorded))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if batch_idx % max(1, trainer.accumulate_grad_batches):  # never between accumulated micro-batches
            return
        for index, event in enumerate(self.events):
            if index < len(self.done):
                continue
            due = (event["at_step"] is not None and trainer.global_step >= event["at_step"]) or (
                event["at_epoch"] is not None and trainer.current_epoch >= event["at_epoch"])
            if not due:
                return
            self._grow(trainer, pl_module, event, batch)

    def state_dict(self) -> dict[str, Any]:
        return {"done": copy.deepcopy(self.done)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = copy.deepcopy(list(state_dict.get("done", [])))

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        model = self.model_of(pl_module)
        checkpoint[CHECKPOINT_KEY] = {"done": copy.deepcopy(self.done), "model_attr": self.model_attr,
                                      "layers_attr": self.layers_attr,
                                      "copy_attrs": list(self.copies_of(pl_module)),
                                      "config": dict(getattr(model, "init_config", {}) or {})}

    def results(self) -> dict[str, float]:
        """Numbers for results.json: the first growth as `growth/...`, later ones as `growth/<n>/...`."""
        out: dict[str, float] = {}
        for i, record in enumerate(self.done):
            prefix = "growth/" if i == 0 else f"growth/{i + 1}/"
            out.update({prefix + k: float(v) for k, v in record.get("measured", {}).items()})
        return out

    # -- growing -----------------------------------------------------------------------------------------------
    def _grow(self, trainer: L.Trainer, pl_module: L.LightningModule, event: dict[str, Any], batch: Any) -> None:
        model = self.model_of(pl_module)
        layers = lambda: layer_list(model, self.layers_attr)  # noqa: E731 (depth growth replaces the list)
        before = self._measure(trainer, pl_module, batch)
        profile_before = self._profile(layers())
        counts_before, layers_before = count_params(model), len(layers())
        growth = self._apply(model, event, copies_of=pl_module)  # and the EMA: same operation, same seed
        self._rebuild_optimizers(trainer, growth)
        after = self._measure(trainer, pl_module, batch)
        counts_after = count_params(model)
        measured = {"step": trainer.global_step, "layers_before": layers_before,
                    "layers_after": len(layers()), "params_before": counts_before["total"],
                    "params_after": counts_after["total"], "active_before": counts_before["active"],
                    "active_after": counts_after["active"]}
        measured.update({f"{k}_before": v for k, v in before.items()})
        measured.update({f"{k}_after": v for k, v in after.items()})
        moes, blocks = find_moe_layers(model), moe_blocks(model)
        if moes:
            measured.update(num_experts=moes[0].num_experts, top_k=moes[0].top_k)
        elif blocks:
            measured.update(zip(("num_experts", "top_k"), block_counts(blocks[0]), strict=True))
        record = {**event, "global_step": trainer.global_step, "epoch": trainer.current_epoch,
                  "measured": {k: v for k, v in measured.items() if v is not None},
                  "norm_profile_before": profile_before, "norm_profile_after": self._profile(layers())}
        self.done.append(record)
        object.__setattr__(pl_module, _APPLIED, getattr(pl_module, _APPLIED, 0) + 1)
        for logger in trainer.loggers:
            logger.log_metrics({f"growth/{k}": v for k, v in record["measured"].items() if k != "step"},
                               step=trainer.global_step)
        self._write(trainer)

    def _profile(self, layers: nn.ModuleList) -> list[float] | None:
        try:
            return norm_profile(layers, self.norm_part)
        except ValueError:  # e.g. a dense model has no expert matrices
            return None

    @torch.no_grad()
    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> dict[str, float]:
        """`loss_fn` on the current training batch (and on validation batches), without touching RNG."""
        loss_fn = self.measure_fn(pl_module)
        if loss_fn is None:
            return {}
        out: dict[str, float] = {}
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.random.fork_rng(devices=[]):
                out["loss"] = float(loss_fn(batch))
                datamodule = getattr(trainer, "datamodule", None)
                if self.measure_batches and datamodule is not None:
                    values = []
                    for i, val in enumerate(datamodule.val_dataloader()):
                        if i >= self.measure_batches:
                            break
                        values.append(float(loss_fn(trainer.strategy.batch_to_device(val))))
                    if values:
                        out["val_loss"] = sum(values) / len(values)
        finally:
            pl_module.train(was_training)
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def _rebuild_optimizers(self, trainer: L.Trainer, growth: Growth) -> None:
        """New optimizers over the grown parameters (module's own factory), state policy, schedule continued."""
        strategy = trainer.strategy
        if trainer.state.fn != "fit" or not strategy.optimizers:
            return
        old_optimizers, old_schedulers = list(strategy.optimizers), list(strategy.lr_scheduler_configs)
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(strategy.model, DistributedDataParallel):  # DDP registered the old parameters: wrap anew
            strategy.model = strategy.lightning_module
            strategy.configure_ddp()
        strategy.setup_optimizers(trainer)
        _optimizers_to_device(strategy.optimizers, strategy.root_device)
        if self.optimizer_state == "duplicate":
            for old, new in zip(old_optimizers, strategy.optimizers, strict=True):
                transfer_optimizer_state(old, new, growth.param_map)
        for old_cfg, new_cfg in zip(old_schedulers, strategy.lr_scheduler_configs, strict=True):
            continue_schedule(old_cfg.scheduler, new_cfg.scheduler)

    @rank_zero_only
    def _write(self, trainer: L.Trainer) -> None:
        root = Path(trainer.default_root_dir)
        root.mkdir(parents=True, exist_ok=True)
        (root / "growth.json").write_text(json.dumps(self.done, indent=2))
        record = self.done[-1]
        if self.plot and record["norm_profile_before"] and record["norm_profile_after"]:
            from framework.grow.report import plot_norm_profiles

            suffix = "" if len(self.done) == 1 else f"_{len(self.done)}"
            plot_norm_profiles({f"before (step {record['global_step']})": record["norm_profile_before"],
                                f"after {record['depth_method'] if record['depth_factor'] > 1 else 'width'} growth":
                                record["norm_profile_after"]}, root / f"growth_norm_profile{suffix}.png")

