"""Packed rows: several documents in one row, told apart by `position_ids` that restart at 0 at each document's first
token (the batch of user text, docs/data.md). The masks here keep attention inside each document, so a packed
document's logits are the ones it has alone."""

from __future__ import annotations

import torch
from torch import Tensor


def document_ids(position_ids: Tensor) -> Tensor:
    """Each token's document number within its row, (batch, seq): a document starts where `position_ids == 0` (and
    at the row's first token, whatever its position)."""
    starts = position_ids == 0
    starts[:, 0] = True
    return starts.long().cumsum(1)


def document_mask(position_ids: Tensor, causal: bool, key_padding_mask: Tensor | None = None) -> Tensor:
    """The (batch, 1, seq, seq) boolean attention mask of packed rows, True = may attend: a query sees the keys of its
    own document (only the earlier ones when `causal`), and of those only the real ones (`key_padding_mask`, True =
    real), always itself, so a padding query's row is never empty (an all-False row is NaN in sdpa)."""
    doc = document_ids(position_ids)
    mask = doc[:, :, None] == doc[:, None, :]
    t = doc.shape[1]
    if causal:
        mask = mask & torch.ones(t, t, dtype=torch.bool, device=doc.device).tril()
    if key_padding_mask is not None:
        itself = torch.eye(t, dtype=torch.bool, device=doc.device)
        mask = mask & (key_padding_mask.bool()[:, None, :] | itself)
    return mask[:, None]


def shift_within_documents(logits: Tensor, position_ids: Tensor | None) -> Tensor:
    """Logits moved one place right (position t gets t−1's: Dream's convention for a causal family run
    bidirectionally), each document's first position keeping its own, as it would alone (whole rows without
    `position_ids`)."""
    shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    if position_ids is None:
        return shifted
    return torch.where((position_ids == 0).unsqueeze(-1), logits, shifted)


def mask_for(mask: Tensor, attn_implementation: str | None, dtype: torch.dtype) -> Tensor:
    """A 4-D boolean mask (True = attend) as a transformers attention implementation takes a 4-D mask as given:
    eager adds it to the scores, so 0 / the dtype's minimum (what transformers' own `eager_mask` builds); sdpa and
    the rest take booleans. Flash attention takes no 4-D mask: refused by name."""
    if attn_implementation == "eager":
        return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    if attn_implementation and "flash" in attn_implementation:
        raise ValueError(f"attn_implementation={attn_implementation!r} takes no 4-D attention mask, which padded "
                         "bidirectional rows and packed bidirectional documents need: use sdpa or eager")
    return mask


__all__ = ["document_ids", "document_mask", "mask_for", "shift_within_documents"]
