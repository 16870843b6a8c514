"""Decoding with a mixed KV cache (`decode`) and the reference decoder it is checked against (`decode_uncached`).

    tokens = decode(model, prompt, 16, full_heads=allocation.full_heads(0.5), window=(1, 4), eos_id=3)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from framework.rng import to_generator
from framework.serving.kv_cache import MixedKVCache


def _pick(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(to_generator(probs, generator), 1, generator=generator).squeeze(-1).to(probs.device)


def _finish(tokens: Tensor, eos_id: int | None, pad_id: int | None) -> Tensor:
    """Everything after a row's first EOS becomes `pad_id` (EOS itself when no pad id is given)."""
    if eos_id is None:
        return tokens
    after = (tokens == eos_id).long().cumsum(1) - (tokens == eos_id).long() > 0
    return tokens.masked_fill(after, eos_id if pad_id is None else pad_id)


@torch.no_grad()
def decode(model: nn.Module, prompt: Tensor, max_new_tokens: int, full_heads: Tensor | None = None,
           window: tuple[int, int] = (1, 4), eos_id: int | None = None, pad_id: int | None = None,
           temperature: float = 0.0, generator: torch.Generator | None = None, prefill: str = "streaming",
           cache: MixedKVCache | None = None, prompt_mask: Tensor | None = None) -> Tensor:
    """Generate (batch, max_new_tokens) tokens after `prompt`s with a mixed KV cache: of equal length, or
    left-padded with `prompt_mask` (batch, prompt) True at real tokens (a transformers model's cache takes them).

    Greedy when `temperature <= 0`. Stops early once every row has emitted `eos_id`; later tokens are `pad_id`.
    Pass your own `cache` to inspect it afterwards (its `full_heads`/window then apply).
    """
    make = getattr(model, "mixed_cache", None)
    if prompt_mask is not None and make is None and not bool(prompt_mask.all()):
        raise ValueError(f"{type(model).__name__}'s KV cache takes prompts of equal length; left-padded prompts "
                         "need a transformers model (hf_causal_lm), whose cache keeps each row's own window")
    if cache is None:  # a transformers model brings its own kind (`HFCausalLM.mixed_cache`: a transformers Cache)
        make = make or (lambda *a, **k: MixedKVCache(model, *a, **k))
        cache = make(full_heads, window, capacity=prompt.shape[1] + max_new_tokens, prefill=prefill)
    logits = model(prompt, cache=cache, **({} if prompt_mask is None else {"key_padding_mask": prompt_mask}))[:, -1]
    out, done = [], torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for step in range(max_new_tokens):
        token = _pick(logits, temperature, generator)
        out.append(token)
        if eos_id is not None:
            done |= token == eos_id
            if bool(done.all()):
                break
        if step + 1 < max_new_tokens:
            logits = model(token[:, None], cache=cache)[:, -1]
    tokens = torch.stack(out, dim=1)
    fill = eos_id if pad_id is None else pad_id
    if tokens.shape[1] < max_new_tokens:
        tokens = F.pad(tokens, (0, max_new_tokens - tokens.shape[1]), value=fill)
    return _finish(tokens, eos_id, pad_id)


@torch.no_grad()
def decode_uncached(model: nn.Module, prompt: Tensor, max_new_tokens: int, gates: Tensor | None = None,
                    window: tuple[int, int] | None = None, eos_id: int | None = None, pad_id: int | None = None,
                    temperature: float = 0.0, generator: torch.Generator | None = None,
                    prompt_mask: Tensor | None = None) -> Tensor:
    """The reference decoder: re-run the (gated, masked) forward over the whole sequence for every new token.

    With soft gates this is how a gated policy samples (no cache can hold a mix of full and streaming attention).
    `prompt_mask` (batch, prompt), True at real tokens: left-padded prompts.
    """
    seq, mask = prompt, prompt_mask
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for _ in range(max_new_tokens):
        masked = {} if mask is None else {"key_padding_mask": mask}
        logits = (model(seq, gates=gates, window=window, **masked) if gates is not None else model(seq, **masked))
        token = _pick(logits[:, -1], temperature, generator)
        seq = torch.cat([seq, token[:, None]], dim=1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if eos_id is not None:
            done |= token == eos_id
            if bool(done.all()):
                break
    tokens = seq[:, prompt.shape[1]:]
    fill = eos_id if pad_id is None else pad_id
    if tokens.shape[1] < max_new_tokens:
        tokens = F.pad(tokens, (0, max_new_tokens - tokens.shape[1]), value=fill)
    return _finish(tokens, eos_id, pad_id)
