"""Classification with per-sample losses: the contract dynamic data selection needs.

Batches are dicts {"x", "y", "index"} (plus "weight" when a `DataSelection` callback is attached);
`training_step` returns the weighted mean loss together with the per-sample `losses`, `logits`, `targets` and
the penultimate `features`, so a selection policy can score every sample without a second forward pass.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from framework.callbacks.selection import stepping_batches
from framework.modules.base import TrainModule


def logits_and_features(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """Logits and the penultimate feature of a timm-style model (`forward_features`, `forward_head`,
    `get_classifier`); a plain `nn.Module` gives logits only."""
    if all(hasattr(model, a) for a in ("forward_features", "forward_head", "get_classifier")):
        features = model.forward_head(model.forward_features(x), pre_logits=True)
        return model.get_classifier()(features), features
    return model(x), None


class Classifier(TrainModule):
    """Cross-entropy classifier; logs train/loss, val/loss, val/acc.

    Args:
        model: the network to train, or a factory given the data's sizes; supplied by the framework at build time.
        optimizer: factory `(named_parameters) -> Optimizer`, from `optimizer=`; None: AdamW at lr 1e-3.
        scheduler: factory `(optimizer, total_steps) -> LR scheduler`, from `scheduler=`; None: a constant lr.
        num_classes: number of classes (≥ 2), handed to a model factory; supplied from the data at build time.
        input_shape: shape of one input example, handed to a model factory; supplied from the data at build time.
        label_smoothing: label smoothing ε of the training cross-entropy, in [0, 1); validation uses none.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        num_classes: int | None = None,
        input_shape: list[int] | None = None,
        label_smoothing: float = 0.0,
    ):
        if num_classes is None or num_classes < 2:
            raise ValueError(f"num_classes={num_classes} must be >= 2 (the data module reports it)")
        shape = {"input_shape": list(input_shape)} if input_shape else {}
        super().__init__(model, optimizer, scheduler, num_classes=num_classes, **shape)
        self.num_classes, self.label_smoothing = num_classes, float(label_smoothing)
        self.val_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor | None]:
        logits, features = logits_and_features(self.model, batch["x"])
        losses = F.cross_entropy(logits.float(), batch["y"], reduction="none", label_smoothing=self.label_smoothing)
        weight = batch.get("weight")
        loss = (losses * weight).mean() if weight is not None else losses.mean()
        self.log("train/loss", loss, prog_bar=True)
        return {"loss": loss, "losses": losses.detach(), "logits": logits.detach(), "targets": batch["y"],
                "features": None if features is None else features.detach(), "index": batch.get("index")}

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits, _ = logits_and_features(self.model, batch["x"])
        self.val_loss.update(F.cross_entropy(logits.float(), batch["y"]), weight=batch["y"].shape[0])
        self.val_acc.update(logits, batch["y"])
        self.log("val/loss", self.val_loss, prog_bar=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def total_training_steps(self) -> float:
        """The schedule's length comes from the selection plan when data are pruned."""
        return stepping_batches(self.trainer)
