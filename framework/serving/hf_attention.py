"""RLKV's per-KV-head gates and its mixed KV cache on transformers models, through transformers' own attention
interface: no `forward` method is replaced.

`use_rlkv_attention(model)` registers one attention function, `framework_rlkv`, in transformers' `AttentionInterface`
(with sdpa's mask function in `AttentionMaskInterface`) and sets it on the model. It is sdpa, except:

* called with `rlkv_gates` (layers, kv_heads) and `rlkv_window=(sink, recent)` (keyword arguments of the model's
  forward, which transformers hands to every attention call), each KV head's output is
  `g · full + (1 − g) · streaming`, one gate per KV head shared by its query group (RLKV's and DuoAttention's
  training objective; the same blend as `framework.models.transformer`);
* with a `MixedKVCache` as the model's cache (`model(ids, cache=cache)`, `model.generate(ids, cache=cache)`;
  `past_key_values=` before transformers renamed it), each layer's full heads keep every position (a sliding layer's:
  the window's) and the others the sink and the recent window in a fixed ring
  (`framework.serving.kv_cache.LayerKVCache`; a prompt's compressed heads attend in chunks, so neither the work nor
  the mask grows with the prompt's square): the cache layer hands itself to the attention call through the keyword
  arguments transformers passes to both, and the attention stores and attends there.

A model whose attention does not go through the interface (`is_backend_compatible()` False) is refused by name.
Prompts of different lengths go in one batch left-padded (with their attention mask): each row keeps its own sink and
recent window, counted from its first token.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from framework.serving.attention import attention, causal_mask, check_window, stream_mask
from framework.serving.kv_cache import PREFILL_POLICIES, LayerKVCache

NAME = "framework_rlkv"


def _sdpa() -> Any:
    """transformers' own sdpa attention function, looked up where it is registered."""
    from transformers import AttentionInterface

    return AttentionInterface()["sdpa"]


#: what a family's attention call may add to softmax attention that `framework_rlkv` carries (transformers' keywords)
CARRIED = ("sliding_window", "softcap", "s_aux")
#: keywords of other attention features, which it does not carry: a model that passes one is refused by name
REFUSED = ("position_bias", "indices", "block_indices", "sinks")


def rlkv_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None, sliding_window: int | None = None,
                   softcap: float | None = None, s_aux: Tensor | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """The registered attention function: (batch, seq, heads, head_dim) outputs, as transformers' own return.
    A layer's sliding window, logit softcapping and sink logits (`CARRIED`) apply to the full, the streaming and
    the cached heads alike; a feature in `REFUSED` raises ValueError naming the model."""
    layer = kwargs.pop("mixed_kv_layer", None)
    gates, window = kwargs.pop("rlkv_gates", None), kwargs.pop("rlkv_window", None)
    refused = [k for k in REFUSED if kwargs.get(k) is not None]
    if refused:
        raise ValueError(f"{type(module).__name__} hands its attention {', '.join(refused)}, which RLKV's gates and "
                         f"mixed KV cache do not carry (they carry {', '.join(CARRIED)}); this family is refused")
    features = {"softcap": softcap, "sinks": s_aux}
    if layer is not None:
        if scaling is not None and not math.isclose(scaling, query.shape[-1] ** -0.5, rel_tol=1e-6):
            query = query * (scaling * math.sqrt(query.shape[-1]))  # the cache attends with SDPA's default scale
        pads = left_padding(attention_mask) if layer.length == 0 and query.shape[2] > 1 else None
        out = layer.attend(query, key, value, pads=pads, sliding=sliding_window, **features)
        return out.transpose(1, 2).contiguous(), None
    t, s = query.shape[2], key.shape[2]
    if attention_mask is None:  # transformers left the causal (and window) mask to the kernel
        allowed = causal_mask(t, s, s - t, sliding_window, device=query.device)
    else:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    if softcap is None and s_aux is None:  # exactly the model's sdpa
        full, _ = _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    else:
        full = attention(query, key, value, allowed, scale=scaling, dropout=dropout, **features).transpose(1, 2)
    if gates is None:
        return full, None
    sink, recent = check_window(window)
    mask = stream_mask(t, s, sink, recent, offset=s - t, device=query.device) & allowed
    if t == s and allowed.dim() == 4 and sink:  # left-padded rows: each row's sink is its own first tokens
        mask = mask | (allowed & _row_sinks(allowed, sink))
    streamed = attention(query, key, value, mask.expand(query.shape[0], 1, t, s), scale=scaling, dropout=dropout,
                         **features).transpose(1, 2)
    heads, kv_heads = query.shape[1], key.shape[1]
    alpha = gates[module.layer_idx].to(full.dtype).repeat_interleave(heads // kv_heads)[None, None, :, None]
    return alpha * full + (1 - alpha) * streamed, None


def _row_sinks(allowed: Tensor, sink: int) -> Tensor:
    """(batch, 1, 1, keys) bool: the first `sink` positions of each row from its first real token (the first that
    attends to itself), as the mixed cache counts them for a left-padded row (`kv_padding`)."""
    first = allowed[:, 0].diagonal(dim1=-2, dim2=-1).int().argmax(-1)  # (batch,): the row's left padding
    position = torch.arange(allowed.shape[-1], device=allowed.device)[None] - first[:, None]
    return ((position >= 0) & (position < sink))[:, None, None, :]


def left_padding(mask: Tensor | None) -> Tensor | None:
    """Each row's left padding, (batch,), read from the prompt's attention mask (transformers' 4-D sdpa mask of an
    empty cache: a position is padding where it may not attend to itself, so a sliding window does not count);
    None without a mask. ValueError for padding that is not a prefix of its row (right padding)."""
    if mask is None or mask.dim() != 4:
        return None
    own = mask[:, 0].diagonal(dim1=-2, dim2=-1)
    own = own if own.dtype == torch.bool else own == 0  # an additive float mask: 0 where attending is allowed
    pads = (~own).sum(-1)
    if not torch.equal(own, torch.arange(own.shape[-1], device=own.device) >= pads[:, None]):
        raise ValueError("the mixed KV cache takes left-padded prompts (padding before each row's tokens, as "
                         "tokenizer.padding_side='left' gives); this batch has padding after or inside a row")
    return pads


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface

    if NAME not in AttentionInterface():
        AttentionInterface.register(NAME, rlkv_attention)
        AttentionMaskInterface.register(NAME, AttentionMaskInterface()["sdpa"])


def attention_shape(model: nn.Module) -> tuple[int, int, int]:
    """(layers, kv_heads, query heads) of a transformers causal LM; ValueError for a model outside the attention
    interface. An MLA model (DeepSeek-V2/V3: `kv_lora_rank`) expands its latents to one key and value per query
    head before attending, so it has as many KV heads as query heads whatever `num_key_value_heads` says."""
    cls = type(model)
    if not cls.is_backend_compatible():
        raise ValueError(f"{cls.__name__} does not route its attention through transformers' AttentionInterface, so "
                         "RLKV's gates and mixed KV cache cannot reach it; models that do: Llama, Qwen2, Qwen3, "
                         "Mistral, Mixtral, OLMoE and most decoders of transformers 5 (docs/hf_models.md)")
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = int(config.num_attention_heads)
    kv_heads = heads if getattr(config, "kv_lora_rank", None) else int(getattr(config, "num_key_value_heads", None)
                                                                       or heads)
    return int(config.num_hidden_layers), kv_heads, heads


def use_rlkv_attention(model: nn.Module) -> None:
    """Register `framework_rlkv` (once) and make it `model`'s attention implementation (sdpa outside gates and the
    mixed cache, so the model's outputs do not change)."""
    attention_shape(model)
    _register()
    if model.config._attn_implementation != NAME:
        model.set_attn_implementation(NAME)


def _cache_layer_class() -> type:
    from transformers.cache_utils import CacheLayerMixin

    class MixedKVLayer(CacheLayerMixin):
        """One layer of `MixedKVCache`: a `LayerKVCache` handed to the attention call, which stores and attends."""

        is_sliding = False
        is_compileable = False
        is_croppable = False
        supports_early_init = False

        def __init__(self, full: Tensor, heads: int, sink: int, recent: int, capacity: int | None, prefill: str):
            super().__init__()
            self.args = (full, heads, sink, recent, capacity, prefill)
            self.kv = LayerKVCache(*self.args)

        def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
            self.device, self.is_initialized = key_states.device, True

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any, kwargs: dict | None = None,
                   **more: Any) -> tuple[Tensor, Tensor]:
            if kwargs is None:
                raise RuntimeError("this model calls its cache without the attention keyword arguments, which the "
                                   "mixed KV cache needs (transformers 5's `cache.update(..., kwargs=kwargs)`)")
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            kwargs["mixed_kv_layer"] = self.kv
            return key_states, value_states

        def get_seq_length(self) -> int:
            return self.kv.length

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.kv.length + query_length, 0

        def get_max_length(self) -> int:
            return -1

        def reset(self) -> None:
            self.kv, self.is_initialized = LayerKVCache(*self.args), False

        def reorder_cache(self, beam_idx: Tensor) -> None:
            raise NotImplementedError("the mixed KV cache does not reorder for beam search; decode greedily or sample")

    return MixedKVLayer


def mixed_kv_cache(model: nn.Module, full_heads: Tensor | None, window: tuple[int, int] = (1, 4),
                   capacity: int | None = None, prefill: str = "streaming") -> Any:
    """A transformers `Cache` for `model` whose KV heads marked True in `full_heads` (layers, kv_heads) keep every
    position and the others `window=(sink, recent)`; None keeps every head full. `capacity` preallocates the full
    heads' buffers for that many positions (prompt + new tokens), so decoding allocates no cache memory.
    Sets the model's attention to `framework_rlkv`. Pass it as `cache=` to the model or to `generate`
    (`past_key_values=` in transformers before the rename)."""
    from transformers.cache_utils import Cache

    layers, kv_heads, heads = attention_shape(model)
    sink, recent = check_window(window)
    if prefill not in PREFILL_POLICIES:
        raise ValueError(f"prefill={prefill!r}; valid: {', '.join(PREFILL_POLICIES)}")
    full_heads = torch.ones(layers, kv_heads, dtype=torch.bool) if full_heads is None else torch.as_tensor(full_heads)
    if tuple(full_heads.shape) != (layers, kv_heads):
        raise ValueError(f"full_heads of shape {tuple(full_heads.shape)} do not fit {type(model).__name__}: expected "
                         f"(layers, kv_heads) = ({layers}, {kv_heads})")
    use_rlkv_attention(model)
    layer_class = _cache_layer_class()
    return Cache(layers=[layer_class(full_heads[i].bool().cpu(), heads, sink, recent, capacity, prefill)
                         for i in range(layers)])


def cache_nbytes(cache: Any) -> int:
    """Bytes of the keys and values a `mixed_kv_cache` holds (not its buffers' spare capacity)."""
    return sum(layer.kv.nbytes() for layer in cache.layers)


__all__ = ["NAME", "attention_shape", "cache_nbytes", "left_padding", "mixed_kv_cache", "rlkv_attention",
           "use_rlkv_attention"]
