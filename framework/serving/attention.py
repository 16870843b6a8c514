"""The attention a head allocation is served with: the streaming (sink + recent) mask, a model's sliding window, and
one attention call that carries what a family's attention adds to plain softmax attention (logit softcapping as in
Gemma 2, per-head sink logits as in gpt-oss). The framework's own `TransformerLM`, the mixed KV cache and the
attention function registered with transformers all use it, so a gated or cached model attends as the model does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def stream_mask(
    t_q: int, t_k: int, sink: int, recent: int, offset: int = 0, device: torch.device | None = None
) -> Tensor:
    """Streaming (attention-sink + recent-window) causal mask (t_q, t_k): query i (at position offset + i) may
    see key j iff j <= i and (j < sink or i - j < recent)."""
    i = torch.arange(t_q, device=device)[:, None] + offset
    j = torch.arange(t_k, device=device)[None, :]
    return causal_mask(t_q, t_k, offset, device=device) & ((j < sink) | (i - j < recent))


def check_window(window: Any) -> tuple[int, int]:
    """`window` as (sink, recent) ints; ValueError unless sink >= 0 and recent >= 1 (every row sees its own token)."""
    try:
        sink, recent = (int(w) for w in window)
    except (TypeError, ValueError):
        raise ValueError(f"window={window!r} must be a pair (sink, recent) of ints") from None
    if sink < 0 or recent < 1:
        raise ValueError(f"window=(sink={sink}, recent={recent}) needs sink >= 0 and recent >= 1")
    return sink, recent


def causal_mask(t_q: int, t_k: int, offset: int = 0, sliding: int | None = None,
                device: torch.device | None = None) -> Tensor:
    """(t_q, t_k) bool: query i (at position offset + i) sees key j iff j <= offset + i and, with a sliding window
    `sliding` (transformers' convention), offset + i - j < sliding."""
    i = torch.arange(t_q, device=device)[:, None] + offset
    j = torch.arange(t_k, device=device)[None, :]
    mask = j <= i
    return mask & (i - j < sliding) if sliding else mask


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
              scale: float | None = None, softcap: float | None = None, sinks: Tensor | None = None,
              dropout: float = 0.0) -> Tensor:
    """Softmax attention (batch, heads, t, d) over keys/values (batch, kv_heads, s, d) with grouped heads.

    `mask` (broadcast to (batch, heads, t, s)) is True where a query may attend; `causal` aligns the causal mask to
    the last key (query i is at position s - t + i). Without `softcap` and `sinks` this is
    `F.scaled_dot_product_attention`; with them, the scores are `softcap · tanh(scores / softcap)` and each query
    head's sink logit `sinks[h]` joins the softmax's denominator (its value is zero)."""
    group = q.shape[1] // k.shape[1]
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                              dropout_p=dropout, scale=scale, enable_gqa=group > 1)
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if causal:
        t, s = q.shape[2], k.shape[2]
        allowed = causal_mask(t, s, s - t, device=q.device)
        mask = allowed if mask is None else mask & allowed
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if sinks is not None:
        sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
        scores = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    if sinks is not None:
        probs = probs[..., :-1]
    if dropout:
        probs = F.dropout(probs, p=dropout)
    return torch.matmul(probs, v)


__all__ = ["attention", "causal_mask", "check_window", "stream_mask"]
