"""DuoAttention's probe (Xiao et al., 2024): the same gates, trained by distillation instead of a reward.

The gated model's final hidden states (before the LM head) are pulled towards the full model's at the answer
positions of teacher-forced rows, with an L1 pull on the gates: L = mean ||h_full − h_gated||² + λ · mean |alpha|.
DuoAttention trains on a retrieval proxy (synthetic passkeys); with `pointer_chase` that is `data.train_task=lookup`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from framework.probes.base import HeadProbe


class DuoAttentionProbe(HeadProbe):
    """Hidden-state distillation plus `reg_weight` · mean |alpha| (DuoAttention's defaults: lr 0.02, λ 0.05)."""

    method = "duo_attention"

    def __init__(self, model: Any, optimizer: Any = None, scheduler: Any = None, reg_weight: float = 0.05,
                 **options: Any):
        super().__init__(model, optimizer, scheduler, **options)
        if reg_weight < 0:
            raise ValueError(f"reg_weight={reg_weight} must be >= 0")
        self.reg_weight = float(reg_weight)

    def answer_positions(self, batch: Tensor) -> Tensor:
        """(rows, len-1) bool: inputs whose next token is an answer token (EOS included, padding not)."""
        targets = batch[:, 1:]
        after_prompt = torch.arange(targets.shape[1], device=batch.device)[None] >= self.prompt_length - 1
        return after_prompt & (targets != self.pad_id)

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        inputs = batch[:, :-1]
        where = self.answer_positions(batch)
        with torch.no_grad():
            teacher = self.model.features(inputs)[where]
        student = self.model.features(inputs, gates=self.gates, window=self.window)[where]
        distill = F.mse_loss(student.float(), teacher.float())
        loss = distill + self.reg_weight * self.gates.abs().mean()
        self.log("train/distill", distill.detach(), prog_bar=True)
        self.log("train/gate_mean", self.gates.detach().mean())
        return loss
