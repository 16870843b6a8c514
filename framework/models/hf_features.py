"""Features of a Hugging Face model for metrics: pooled hidden states (GICDM's `feature`, as a timm model's)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from framework.models.hf import HFLanguageModel
from framework.models.hf_loading import _transformers, load_hf_config


class HFFeatures(nn.Module):
    """Pooled hidden states of a transformers model: token ids (batch, seq) -> features (batch, hidden), e.g. as
    GICDM's `feature` (as a timm model with `num_classes=0` gives image features).

    `model`: a framework HF model (`HFCausalLM`, `HFMaskedLM`), a transformers model, or a Hub id / folder (loaded
    with `AutoModel`). `layer`: which hidden state (-1: the last); `pool`: "mean" over real tokens, "last" (the last
    real token: a causal LM's summary) or "first" (a masked LM's [CLS]). Real tokens are those where
    `attention_mask` is 1 (default: every token)."""

    POOLS = ("mean", "last", "first")

    def __init__(self, model: nn.Module | str, layer: int = -1, pool: str = "mean"):
        super().__init__()
        if pool not in self.POOLS:
            raise ValueError(f"pool={pool!r} is invalid; valid: {', '.join(self.POOLS)}")
        if isinstance(model, str):
            load_hf_config(model)  # a clear error for a bad id or folder
            model = _transformers().AutoModel.from_pretrained(model, use_safetensors=True, trust_remote_code=False)
        self.hf = model.hf if isinstance(model, HFLanguageModel) else model
        self.layer, self.pool = int(layer), pool

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.long()
        out = self.hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        hidden = out.hidden_states[self.layer].float()
        if self.pool == "first":
            return hidden[:, 0]
        if self.pool == "last":
            last = mask.sum(1).clamp(min=1) - 1
            return hidden[torch.arange(ids.shape[0], device=ids.device), last]
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
