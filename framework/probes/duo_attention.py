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
from framework.probes.rlkv import answer_token_mask


class DuoAttentionProbe(HeadProbe):
    """Hidden-state distillation plus `reg_weight` · mean |alpha| (DuoAttention's defaults: lr 0.02, λ 0.05).

    The options every probe shares (`sink`, `recent`, `sparsity`, `pretrain_steps`, ...) are `HeadProbe`'s.

    Args:
        model: the causal LM to probe, frozen (or a factory of one); supplied by the framework at build time.
        optimizer: factory of the gates' optimizer, from `optimizer=`; None: AdamW at lr 1e-2, no weight decay.
        scheduler: factory `(optimizer, total_steps) -> LR scheduler`, from `scheduler=`; None: a constant lr.
        reg_weight: λ, the weight of the L1 pull mean |alpha| towards compressed heads, ≥ 0.
    """

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

    def teacher_forced(self, batch: Tensor | dict[str, Tensor]) -> tuple[Tensor, Tensor | None, Tensor]:
        """(inputs, their key padding mask or None, where the next token is an answer token) of a batch: a task's
        rows, or prompt batches (left-padded prompts; answer tokens through each completion's end token)."""
        if not isinstance(batch, dict):
            return batch[:, :-1], None, self.answer_positions(batch)
        prompt, answer, mask = self.split(batch)
        inputs = torch.cat([prompt, answer], 1)[:, :-1]
        padding = torch.cat([mask, torch.ones_like(answer, dtype=torch.bool)], 1)[:, :-1]
        where = torch.zeros_like(padding)
        where[:, prompt.shape[1] - 1 :] = answer_token_mask(answer, self.eos_id)
        return inputs, padding, where

    def training_step(self, batch: Tensor | dict[str, Tensor], batch_idx: int) -> Tensor:
        inputs, padding, where = self.teacher_forced(batch)
        padded = {} if padding is None else {"key_padding_mask": padding}
        with torch.no_grad():
            teacher = self.model.features(inputs, **padded)[where]
        student = self.model.features(inputs, gates=self.gates, window=self.window, **padded)[where]
        distill = F.mse_loss(student.float(), teacher.float())
        loss = distill + self.reg_weight * self.gates.abs().mean()
        self.log("train/distill", distill.detach(), prog_bar=True)
        self.log("train/gate_mean", self.gates.detach().mean())
        return loss
