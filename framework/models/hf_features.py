"""Features of a Hugging Face model for metrics: pooled hidden states (GICDM's `feature`, as a timm model's), of
token ids or of texts (`embed_texts`, with the model's own tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from framework.models.hf import HFLanguageModel
from framework.models.hf_loading import _transformers, load_hf_config, load_tokenizer


class HFFeatures(nn.Module):
    """Pooled hidden states of a transformers model: token ids (batch, seq) -> features (batch, hidden), e.g. as
    GICDM's `feature` (as a timm model with `num_classes=0` gives image features).

    `model`: a framework HF model (`HFCausalLM`, `HFMaskedLM`), a transformers model, or a Hub id / folder (loaded
    with `AutoModel`). `layer`: which hidden state (-1: the last); `pool`: "mean" over real tokens, "last" (the last
    real token: a causal LM's summary) or "first" (a masked LM's [CLS]). Real tokens are those where
    `attention_mask` is 1 (default: every token)."""

    POOLS = ("mean", "last", "first")

    def __init__(self, model: nn.Module | str, layer: int = -1, pool: str = "mean", tokenizer: Any = None):
        super().__init__()
        if pool not in self.POOLS:
            raise ValueError(f"pool={pool!r} is invalid; valid: {', '.join(self.POOLS)}")
        if isinstance(model, str):
            load_hf_config(model)  # a clear error for a bad id or folder
            tokenizer = tokenizer or load_tokenizer(model)
            model = _transformers().AutoModel.from_pretrained(model, use_safetensors=True, trust_remote_code=False)
        self.hf = model.hf if isinstance(model, HFLanguageModel) else model
        self.layer, self.pool, self.tokenizer = int(layer), pool, tokenizer

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

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str], batch_size: int = 32, max_length: int = 512) -> Tensor:
        """Features (len(texts), hidden) of texts, tokenized by the model's tokenizer as the model reads them (its
        own special tokens), right-padded, cut at `max_length` tokens (and at the model's positions)."""
        tok = self.tokenizer
        if tok is None:
            raise ValueError("embedding texts needs the model's tokenizer: load the model by name (a folder or Hub "
                             "id with tokenizer files) or pass tokenizer=")
        if tok.pad_token_id is None:  # padding is masked out: any id will do, the EOS is the usual one
            tok.pad_token = tok.eos_token or tok.unk_token
        tok.padding_side = "right"
        limit = min(int(max_length), int(getattr(self.hf.config, "max_position_embeddings", None) or max_length))
        self.hf.eval()
        device = next(self.hf.parameters()).device
        out = []
        for start in range(0, len(texts), batch_size):
            batch = tok(list(texts[start : start + batch_size]), padding=True, truncation=True, max_length=limit,
                        return_tensors="pt")
            out.append(self(batch["input_ids"].to(device), batch["attention_mask"].to(device)).cpu())
        return torch.cat(out) if out else torch.zeros(0, int(self.hf.config.hidden_size))
