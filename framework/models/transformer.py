"""A small transformer language model in one file: causal or bidirectional, GQA, rotary positions.

`LanguageModel` is the one shell (embedding, blocks, norm, head, GPT-2 init, per-KV-head attention gates and the
decoding cache) with a pluggable feed-forward: `TransformerLM` plugs in the dense `MLP`,
`framework.models.moe.MoETransformerLM` an `MoE`. Attention uses PyTorch's `scaled_dot_product_attention`;
reshapes are einops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from framework.models.base import RecordsConfig
from framework.models.documents import document_mask
from framework.models.lm_init import INITS, check_init, check_positive, init_weights  # noqa: F401 (re-exported)
from framework.serving.attention import check_window, stream_mask


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0, device=None) -> tuple[Tensor, Tensor]:
    """cos/sin tables of shape (seq_len, head_dim/2) for rotary position embeddings (RoFormer eq. 34)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of a (batch, heads, seq, head_dim) tensor."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


class Attention(nn.Module):
    """Multi-head self-attention with grouped key/value heads (GQA) and rotary positions.

    Optional per-KV-head gates `alpha` mix full and streaming attention, `alpha * full + (1 - alpha) * stream`
    (DuoAttention / RLKV); a `cache` (see `framework.serving.kv_cache`) serves incremental decoding.
    """

    def __init__(self, dim: int, heads: int, kv_heads: int, causal: bool, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        if heads % kv_heads:
            raise ValueError(f"heads={heads} must be divisible by kv_heads={kv_heads}")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} (dim/heads) must be even for rotary positions")
        self.causal, self.dropout = causal, dropout
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        key_padding_mask: Tensor | None = None,
        gates: Tensor | None = None,
        window: tuple[int, int] | None = None,
        cache: Any = None,
    ) -> Tensor:
        """`gates` (kv_heads,) in [0, 1] with `window=(sink, recent)`: 1 is full attention, 0 streaming.
        `cache`: an object whose `attend(q, k, v)` stores the new keys/values and returns the heads' outputs."""
        if cache is not None:  # incremental decoding: the cache holds past keys/values per KV head
            return self._cached(x, cos, sin, cache)
        q = rearrange(self.q(x), "b t (h d) -> b h t d", h=self.heads)
        k, v = rearrange(self.kv(x), "b t (two g d) -> two b g t d", two=2, g=self.kv_heads)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        group = self.heads // self.kv_heads
        k, v = (repeat(t, "b g t d -> b (g r) t d", r=group) for t in (k, v))
        mask = None
        if key_padding_mask is not None and key_padding_mask.dim() == 4:  # a whole mask (packed rows): used as given
            mask = key_padding_mask
        elif key_padding_mask is not None:  # True = a real token that may be attended to
            mask = rearrange(key_padding_mask.bool(), "b s -> b 1 1 s")
            if self.causal:
                t = x.shape[1]
                mask = mask & torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal and mask is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        if gates is not None:
            out = self._mix_streaming(out, q, k, v, gates, window, key_padding_mask)
        return self.proj(rearrange(out, "b h t d -> b t (h d)"))

    def _cached(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Any) -> Tensor:
        """The decoding path: the q, k, v of `forward` with fewer ops (a one-token step is mostly per-op cost): plain
        views instead of einops, one rotary call for queries and keys together."""
        b, t, _ = x.shape
        h, g, d = self.heads, self.kv_heads, self.head_dim
        kv = self.kv(x).view(b, t, 2 * g, d)  # keys' heads, then values'
        qk = apply_rotary(torch.cat([self.q(x).view(b, t, h, d), kv.narrow(2, 0, g)], dim=2).transpose(1, 2), cos, sin)
        out = cache.attend(qk.narrow(1, 0, h), qk.narrow(1, h, g), kv.narrow(2, g, g).transpose(1, 2))
        return self.proj(out.transpose(1, 2).reshape(b, t, h * d))

    def _mix_streaming(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, gates: Tensor, window: Any, key_padding_mask: Tensor | None
    ) -> Tensor:
        """alpha * full + (1 - alpha) * streaming attention, one alpha per KV head shared by its query group."""
        if not self.causal:
            raise ValueError("attention gates mix causal full and streaming attention; this model has causal=False")
        if gates.shape != (self.kv_heads,):
            raise ValueError(
                f"gates of shape {tuple(gates.shape)} do not fit: expected ({self.kv_heads},), one per KV head"
            )
        sink, recent = check_window(window)
        t = q.shape[2]
        mask = stream_mask(t, t, sink, recent, device=q.device)
        if key_padding_mask is not None:
            mask = mask & rearrange(key_padding_mask.bool(), "b s -> b 1 1 s")
        streamed = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        alpha = rearrange(gates.to(out.dtype).repeat_interleave(self.heads // self.kv_heads), "h -> 1 h 1 1")
        return alpha * out + (1 - alpha) * streamed


class MLP(nn.Module):
    """The dense feed-forward layer (GELU)."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(dim, hidden, bias=False)
        self.proj = nn.Linear(hidden, dim, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x)).

    `feed_forward()` builds the feed-forward layer (after the attention, so layers built with PyTorch's default
    init draw in a fixed order); it is stored under `ffn_name` (`ffn` for the dense MLP, `moe` for an `MoE`), which
    is also its state_dict key, so checkpoints of either model keep their keys.
    """

    def __init__(self, dim: int, heads: int, kv_heads: int, causal: bool, dropout: float,
                 feed_forward: Callable[[], nn.Module], ffn_name: str = "ffn"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, causal, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn_name = ffn_name
        self.add_module(ffn_name, feed_forward())

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        key_padding_mask: Tensor | None = None,
        gates: Tensor | None = None,
        window: tuple[int, int] | None = None,
        cache: Any = None,
    ) -> Tensor:
        if gates is None and cache is None:
            x = x + self.attn(self.norm1(x), cos, sin, key_padding_mask)
        else:
            x = x + self.attn(self.norm1(x), cos, sin, key_padding_mask, gates=gates, window=window, cache=cache)
        return x + getattr(self, self.ffn_name)(self.norm2(x))


class LanguageModel(nn.Module):
    """The shell every transformer LM here shares: embedding, `depth` pre-norm `Block`s, final norm, LM head and
    rotary tables, with a pluggable feed-forward: `feed_forward()` builds one block's (an `MLP` for
    `TransformerLM`, an `MoE` for `MoETransformerLM`), stored under `ffn_name`; `init` names the weight
    initialisation (`init_weights`). Not built by name: the concrete models record their own constructor values
    (`RecordsConfig`).
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        depth: int,
        heads: int,
        kv_heads: int | None,
        max_seq_len: int,
        causal: bool,
        dropout: float,
        tie_embeddings: bool,
        feed_forward: Callable[[], nn.Module],
        ffn_name: str = "ffn",
        init: str = "gpt2",
    ):
        super().__init__()
        check_init(init)
        check_positive(vocab_size=vocab_size, dim=dim, depth=depth, heads=heads, max_seq_len=max_seq_len)
        if kv_heads is not None and not (1 <= kv_heads <= heads and heads % kv_heads == 0):
            raise ValueError(f"kv_heads={kv_heads} must divide heads={heads} (1 <= kv_heads <= heads), or be null")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1)")
        self.max_seq_len, self.causal = max_seq_len, causal
        self.embed = nn.Embedding(vocab_size, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(dim, heads, kv_heads or heads, causal, dropout, feed_forward, ffn_name) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rotary_tables(max_seq_len, dim // heads)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        init_weights(self, init, depth)

    def features(
        self,
        idx: Tensor,
        key_padding_mask: Tensor | None = None,
        gates: Tensor | None = None,
        window: tuple[int, int] | None = None,
        cache: Any = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Final normalised hidden states (batch, seq, dim): the penultimate features.

        `gates` (depth, kv_heads) with `window=(sink, recent)` mix full and streaming attention per KV head;
        `cache` (`framework.serving.kv_cache.MixedKVCache`) continues from the `cache.length` tokens it holds.
        `position_ids` (batch, seq), packed rows: rotary positions from them, attention kept inside each document
        (one starts where a position is 0; causal within it when the model is).
        """
        t = idx.shape[1]
        start = 0 if cache is None else cache.length
        if start + t > self.max_seq_len:
            raise ValueError(f"sequence length {start + t} exceeds max_seq_len={self.max_seq_len}")
        cos, sin = self.rope_cos[start : start + t], self.rope_sin[start : start + t]
        if position_ids is not None:
            if gates is not None or cache is not None:
                raise ValueError("position_ids (packed rows) do not combine with attention gates or a KV cache: "
                                 "give one document per row there")
            cos, sin = self.rope_cos[position_ids].unsqueeze(1), self.rope_sin[position_ids].unsqueeze(1)
            key_padding_mask = document_mask(position_ids, self.causal, key_padding_mask)
        x = self.drop(self.embed(idx))
        if gates is None and cache is None:
            recompute = getattr(self, "gradient_checkpointing", False) and self.training and torch.is_grad_enabled()
            for block in self.blocks:  # checkpointed: each block's activations recomputed in the backward pass
                x = checkpoint(block, x, cos, sin, key_padding_mask, use_reentrant=False) if recompute else \
                    block(x, cos, sin, key_padding_mask)
            return self.norm(x)
        if gates is not None and gates.shape != (len(self.blocks), self.blocks[0].attn.kv_heads):
            raise ValueError(
                f"gates of shape {tuple(gates.shape)} do not fit: expected (depth, kv_heads) = "
                f"({len(self.blocks)}, {self.blocks[0].attn.kv_heads})"
            )
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, key_padding_mask, gates=None if gates is None else gates[i], window=window,
                      cache=None if cache is None else cache.layers[i])
        if cache is not None:
            cache.advance(t)
        return self.norm(x)

    def forward(
        self,
        idx: Tensor,
        key_padding_mask: Tensor | None = None,
        gates: Tensor | None = None,
        window: tuple[int, int] | None = None,
        cache: Any = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        if gates is None and cache is None:
            return self.head(self.features(idx, key_padding_mask, position_ids=position_ids))
        return self.head(self.features(idx, key_padding_mask, gates=gates, window=window, cache=cache))


class TransformerLM(LanguageModel, RecordsConfig):
    """Token ids (batch, seq) → logits (batch, seq, vocab). `causal=False` gives the diffusion backbone.

    Small models (the d = 64 needle MDLM) learn only with `init="torch"`; loading saved weights does not depend on it.

    Args:
        vocab_size: number of token ids (embedding rows and logits); supplied from the data at build time.
        dim: model width (embedding and residual stream size).
        depth: number of transformer blocks.
        heads: query heads per attention layer; must divide `dim` (head size dim/heads).
        kv_heads: key/value heads (grouped-query attention), dividing `heads`; None: one per query head.
        mlp_ratio: feed-forward hidden width as a multiple of `dim` (> 0).
        max_seq_len: longest sequence (prompt plus generated tokens) the rotary tables cover.
        causal: causal attention (a left-to-right LM); False attends both ways (the diffusion backbone).
        dropout: dropout probability on embeddings, attention and feed-forward outputs, in [0, 1).
        tie_embeddings: share one weight between the token embedding and the LM head.
        init: weight initialisation, "gpt2" (N(0, 0.02²)) or "torch" (PyTorch's width-scaled defaults); `init_weights`.
        gradient_checkpointing: recompute each block's activations in the backward pass while training, to save memory.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        kv_heads: int | None = None,
        mlp_ratio: float = 4.0,
        max_seq_len: int = 1024,
        causal: bool = True,
        dropout: float = 0.0,
        tie_embeddings: bool = False,
        init: str = "gpt2",
        gradient_checkpointing: bool = False,
    ):
        if not mlp_ratio > 0 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"mlp_ratio={mlp_ratio} must be > 0 and dropout={dropout} in [0, 1)")
        super().__init__(vocab_size, dim, depth, heads, kv_heads, max_seq_len, causal, dropout, tie_embeddings,
                         feed_forward=lambda: MLP(dim, int(mlp_ratio * dim), dropout), init=init)
        self.gradient_checkpointing = bool(gradient_checkpointing)
