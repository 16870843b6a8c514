"""Next-token language modelling: cross-entropy loss, bits per token on validation."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from framework.modules.base import TrainModule


class CausalLM(TrainModule):
    """Trains any tokens→logits model on next-token prediction; logs `val/bpb` (bits per byte for byte data)."""

    def __init__(self, model, optimizer=None, scheduler=None, vocab_size: int | None = None, prompt_length: int = 0):
        """`prompt_length > 0` scores only the tokens after each row's first `prompt_length` (prompt masking)."""
        super().__init__(model, optimizer, scheduler, **({"vocab_size": vocab_size} if vocab_size else {}))
        if prompt_length < 0:
            raise ValueError(f"prompt_length={prompt_length} must be >= 0 (0 scores every token)")
        self.prompt_length = int(prompt_length)
        self.val_nll = MeanMetric()

    def loss(self, batch: Tensor) -> Tensor:
        return self.per_sample_loss(batch).mean()

    def per_sample_loss(self, batch: Tensor) -> Tensor:
        """Each row's mean next-token CE (rows score the same number of tokens, so their mean is the batch's)."""
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = self.model(inputs)
        if self.prompt_length:
            start = self.prompt_length - 1
            logits, targets = logits[:, start:], targets[:, start:]
        tokens = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
        return tokens.view(targets.shape).mean(1)

    def training_step(self, batch: Tensor, batch_idx: int) -> dict[str, Tensor]:
        """Next-token CE (logged as `train/loss`) plus the model's auxiliary loss if any (`train/aux_loss`); the
        rows' own losses go out as `per_sample_loss`, what a data-selection policy (`sampler=`) reads and weighs."""
        losses = self.per_sample_loss(batch)
        loss = losses.mean()
        self.log("train/loss", loss, prog_bar=True)
        aux = self.pop_model_aux_loss()
        if aux is not None:
            self.log("train/aux_loss", aux.detach())
            loss = loss + aux
        return {"loss": loss, "per_sample_loss": losses}

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self.val_nll.update(self.loss(batch), weight=batch.shape[0])
        self.log("val/loss", self.val_nll, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        # bits per token; with byte-level data, tokens are bytes
        self.log("val/bpb", self.val_nll.compute() / math.log(2), prog_bar=True, sync_dist=True)

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)
