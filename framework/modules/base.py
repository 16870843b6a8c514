"""What every framework LightningModule shares: building the model, the optimizer and the schedule."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import nn


class TrainModule(L.LightningModule):
    """Holds a model plus optimizer/scheduler factories; subclasses write the steps.

    `model` is an `nn.Module`, or a factory called with `model_kwargs` (how a recipe's partial config is
    completed with what only the data knows, e.g. the vocabulary size). `optimizer(named_parameters)` and
    `scheduler(optimizer, total_steps)` are factories, so any registered optimizer or schedule plugs in.
    """

    def __init__(
        self,
        model: nn.Module | Callable[..., nn.Module],
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        scheduler: Callable[..., Any] | None = None,
        **model_kwargs: Any,
    ):
        super().__init__()
        self.model = model if isinstance(model, nn.Module) else model(**model_kwargs)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler

    def configure_optimizers(self) -> Any:
        factory = self.optimizer_factory or self.default_optimizer
        optimizer = factory(self.optimized_parameters())
        if self.scheduler_factory is None:
            self._configured_lrs = base_lrs(optimizer)
            return optimizer
        total = self.total_training_steps() if self._trainer is not None else 1
        total = int(total) if math.isfinite(total) else 1
        scheduler = self.scheduler_factory(optimizer, total_steps=total)
        self._configured_lrs = base_lrs(optimizer)  # after the schedule set each group's `initial_lr`
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_start(self) -> None:
        """After a resume, apply this run's lr where it differs from the checkpoint's (see `rebase_lr`); a schedule
        restored from a checkpoint of OLion's old group layout is cut to the user's groups first."""
        from framework.optim.olion_groups import remap_old_layout_scheduler

        for config in self.trainer.lr_scheduler_configs:
            remap_old_layout_scheduler(config.scheduler)
        configured = getattr(self, "_configured_lrs", None)
        if configured is None or len(self.trainer.optimizers) != 1:
            return
        schedulers = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        changed = rebase_lr(self.trainer.optimizers[0], schedulers, configured)
        if changed and self.trainer.is_global_zero:
            old, new = changed[0]
            print(f"resuming with lr {new:g} instead of the checkpoint's {old:g} ({len(changed)} parameter group(s)):"
                  f" the learning-rate schedule continues from its step, scaled by {new / old:g}",
                  file=sys.stderr, flush=True)

    def configure_model(self) -> None:
        """Under `trainer.strategy=fsdp2` (the strategy set a device mesh): shard each of `sharded_modules()` with
        FSDP2, block by block (`framework.strategies.shard`). Other strategies set no mesh: nothing happens."""
        if self.device_mesh is None:
            return
        from framework.strategies import shard, unshardable

        reason = unshardable(self)
        if reason:
            raise ValueError(f"trainer.strategy=fsdp2: {reason}")
        for module in self.sharded_modules():
            shard(module, self.device_mesh["data_parallel"])

    def sharded_modules(self) -> list[nn.Module]:
        """The modules `configure_model` shards: the model (a subclass adds copies that update with it, e.g. EMA)."""
        return [self.model]

    def optimized_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) pairs the optimizer gets: the model's trainable ones."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def pop_model_aux_loss(self) -> torch.Tensor | None:
        """The model's auxiliary loss from this step's training forwards (e.g. an MoE's coef · balance loss), to add
        to the loss `training_step` returns, so accumulation and loss multipliers scale it like the main loss.
        None when the model has none (`pop_aux_loss` missing or nothing queued)."""
        pop = getattr(self.model, "pop_aux_loss", None)
        return pop() if callable(pop) else None

    @staticmethod
    def default_optimizer(params: Any) -> torch.optim.Optimizer:
        """The optimizer when none is given."""
        return torch.optim.AdamW(params, lr=1e-3)

    def total_training_steps(self) -> float:
        """The optimizer steps the LR schedule is planned over (may be inf: then the schedule gets 1)."""
        return self.trainer.estimated_stepping_batches


def base_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each parameter group's base lr: `initial_lr` (set by an LR schedule), else `lr`."""
    return [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]


def rebase_lr(optimizer: torch.optim.Optimizer, schedulers: list[Any], configured: list[float]) -> list[tuple]:
    """Re-base each group whose base lr (restored from a checkpoint) differs from `configured` (this run's).

    The group's `initial_lr`/`lr` and the schedules' `base_lrs` are scaled by configured/restored, so the schedule
    continues from its step at the new scale (a `LambdaLR` gives configured·factor(step)). Groups whose lr is
    unchanged are left untouched, bit for bit. Returns the (restored, configured) pairs that changed.
    """
    if len(configured) != len(optimizer.param_groups):
        raise ValueError(f"{len(configured)} configured lrs for {len(optimizer.param_groups)} parameter groups")
    changed = []
    for i, (group, want) in enumerate(zip(optimizer.param_groups, configured, strict=True)):
        key = "initial_lr" if "initial_lr" in group else "lr"
        have = float(group[key])
        if have == want:
            continue
        ratio = want / have if have else None
        group[key] = want
        if key == "initial_lr" and ratio is not None:
            group["lr"] = group["lr"] * ratio
        if ratio is not None and group.get("adamw_lr_base"):  # OLion: its fixed AdamW-branch lr stays where it was
            group["adamw_lr_base"] = group["adamw_lr_base"] * ratio
        for sched in schedulers:
            if getattr(sched, "optimizer", None) is not optimizer or not hasattr(sched, "base_lrs"):
                continue
            if ratio is None or sched.base_lrs[i] == have:
                sched.base_lrs[i] = want
            else:
                sched.base_lrs[i] = sched.base_lrs[i] * ratio
            if getattr(sched, "_last_lr", None) is not None:
                sched._last_lr[i] = group["lr"]
        changed.append((have, want))
    return changed
