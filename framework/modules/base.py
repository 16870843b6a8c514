"""What every framework LightningModule shares: building the model, the optimizer and the schedule."""

from __future__ import annotations

import math
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
            return optimizer
        total = self.total_training_steps() if self._trainer is not None else 1
        total = int(total) if math.isfinite(total) else 1
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer, total_steps=total), "interval": "step"},
        }

    def optimized_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) pairs the optimizer gets: the model's trainable ones."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    @staticmethod
    def default_optimizer(params: Any) -> torch.optim.Optimizer:
        """The optimizer when none is given."""
        return torch.optim.AdamW(params, lr=1e-3)

    def total_training_steps(self) -> float:
        """The optimizer steps the LR schedule is planned over (may be inf: then the schedule gets 1)."""
        return self.trainer.estimated_stepping_batches
