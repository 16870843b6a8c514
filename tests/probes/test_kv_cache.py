"""The mixed per-head KV cache: same tokens as the masked forward, exact sizes."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_greedy_up_to_rounding

from framework.models.transformer import TransformerLM
from framework.serving.decoding import decode, decode_uncached
from framework.serving.kv_cache import MixedKVCache, kv_fraction, theoretical_speedup


def model_for_decoding(kv_heads: int | None = None, depth: int = 3, seed: int = 0) -> TransformerLM:
    """A random model with sharp logits (weights scaled up), so greedy choices are not near-ties."""
    torch.manual_seed(seed)
    model = TransformerLM(vocab_size=20, dim=32, depth=depth, heads=4, kv_heads=kv_heads, max_seq_len=96).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6)
    return model


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_mixed_cache_decodes_the_same_tokens_as_the_masked_forward_with_hard_gates(kv_heads):
    model = model_for_decoding(kv_heads)
    g = torch.Generator().manual_seed(1)
    full = torch.tensor([[True, False, True, False], [False, False, True, True], [True, False, False, False]])
    full = full[:, :kv_heads]
    prompt = torch.randint(0, 20, (200, 12), generator=g)  # 12 + 16 tokens: far beyond the 2 + 5 window
    cached = decode(model, prompt, 16, full_heads=full, window=(2, 5))
    reference = decode_uncached(model, prompt, 16, gates=full.float(), window=(2, 5))
    for tokens in (cached, reference):  # every one of 200 sequences, every token (up to rounding near-ties)
        assert_greedy_up_to_rounding(model, prompt, tokens, gates=full.float(), window=(2, 5))
    # the allocation matters: all-full decoding gives other tokens
    assert (decode(model, prompt, 16) != cached).any(dim=1).float().mean() > 0.5


def test_with_every_head_full_the_cache_reproduces_the_standard_model():
    model = model_for_decoding(2)
    prompt = torch.randint(0, 20, (200, 12), generator=torch.Generator().manual_seed(2))
    cached = decode(model, prompt, 16)
    for tokens in (cached, decode_uncached(model, prompt, 16)):
        assert_greedy_up_to_rounding(model, prompt, tokens)
    assert torch.equal(cached, decode(model, prompt, 16, full_heads=torch.ones(3, 2, dtype=torch.bool)))  # same cache


def test_prefill_full_differs_from_streaming_prefill_only_when_the_prompt_exceeds_the_window():
    model = model_for_decoding()
    full = torch.zeros(3, 4, dtype=torch.bool)
    short = torch.randint(0, 20, (64, 4), generator=torch.Generator().manual_seed(3))
    long = torch.randint(0, 20, (64, 30), generator=torch.Generator().manual_seed(3))
    for prefill in ("full", "streaming"):  # both give the streaming forward's greedy tokens
        same = decode(model, short, 6, full, (1, 4), prefill=prefill)
        assert_greedy_up_to_rounding(model, short, same, gates=full.float(), window=(1, 4))
    differ = decode(model, long, 6, full, (1, 4), prefill="full"), decode(model, long, 6, full, (1, 4))
    assert not torch.equal(*differ)


@pytest.mark.parametrize("length", [3, 5, 9, 40])
def test_after_decoding_to_length_l_compressed_heads_hold_min_l_window_and_full_heads_hold_l(length):
    model = model_for_decoding(2, depth=2)
    full = torch.tensor([[True, False], [False, False]])
    sink, recent = 1, 4
    cache = MixedKVCache(model, full, (sink, recent))
    prompt_len = 2
    decode(model, torch.randint(0, 20, (3, prompt_len)), length - prompt_len + 1, cache=cache)
    assert cache.length == length  # the last generated token is never fed back
    entries = cache.entries()
    window = sink + recent
    assert entries.tolist() == [[length, min(length, window)], [min(length, window), min(length, window)]]
    kv_heads = 2
    for layer in range(2):  # per layer: H_kv · L · KV_fraction(s, L)
        s = 1 - full[layer].float().mean().item()
        assert entries[layer].sum().item() == pytest.approx(kv_heads * length * kv_fraction(s, length, window))
    assert cache.nbytes() == entries.sum().item() * 2 * 3 * 8 * 4  # K and V, batch 3, head_dim 8, fp32


def test_compressed_ring_keeps_the_sink_and_exactly_the_last_recent_positions():
    model = model_for_decoding(2, depth=1)
    cache = MixedKVCache(model, torch.tensor([[False, True]]), window=(2, 3))
    decode(model, torch.randint(0, 20, (1, 6)), 8, cache=cache)  # holds positions 0..12
    held = sorted(cache.layers[0].slot_pos.tolist())
    assert held == [0, 1, 10, 11, 12]
    assert cache.layers[0].k_full.shape[2] >= 13 and cache.layers[0].k_stream.shape[2] == 5


def test_preloading_a_prompts_keys_matches_a_full_prefill_then_truncation():
    model = model_for_decoding(2)
    full = torch.tensor([[True, False], [False, False], [False, True]])
    prompt = torch.randint(0, 20, (8, 20), generator=torch.Generator().manual_seed(5))
    standard = MixedKVCache(model)
    model(prompt, cache=standard)  # keys/values of every layer for the whole prompt
    pairs = [(layer.k_full[:, :, :20], layer.v_full[:, :, :20]) for layer in standard.layers]
    preloaded = MixedKVCache(model, full, (1, 4))
    preloaded.preload(pairs)
    assert preloaded.length == 20 and preloaded.entries().tolist() == [[20, 5], [5, 5], [5, 20]]
    reference = MixedKVCache(model, full, (1, 4), prefill="full")
    model(prompt, cache=reference)
    token = prompt[:, -1:]
    assert torch.allclose(model(token, cache=preloaded), model(token, cache=reference), atol=1e-5)


def test_kv_fraction_and_theoretical_speedup_follow_the_rlkv_bookkeeping():
    assert kv_fraction(0.5, 3000, 80) == pytest.approx(0.5 + 0.5 * 80 / 3000)
    assert kv_fraction(0.5, 40, 80) == 1.0  # shorter than the window: nothing is saved
    assert theoretical_speedup(0.6, 3000, 80) == pytest.approx(2.40, abs=0.01)  # the RLKV README's 2.40x
    assert theoretical_speedup(0.2, 3000, 80) == pytest.approx(1.24, abs=0.01)


def test_eos_stops_decoding_and_pads_every_row_after_its_first_eos():
    model = model_for_decoding(2)
    prompt = torch.randint(0, 20, (50, 10), generator=torch.Generator().manual_seed(4))
    free = decode(model, prompt, 12)
    eos = int(free[0, 2])  # a token that row 0 emits at step 2
    out = decode(model, prompt, 12, eos_id=eos, pad_id=19)
    for row_free, row in zip(free, out, strict=True):
        hits = (row_free == eos).nonzero().flatten()
        stop = int(hits[0]) if len(hits) else 12
        assert torch.equal(row[: stop + 1], row_free[: stop + 1])
        assert (row[stop + 1 :] == 19).all()


def test_bad_allocations_are_refused_with_the_expected_shape():
    model = model_for_decoding(2)
    with pytest.raises(ValueError, match=r"expected \(depth, kv_heads\) = \(3, 2\)"):
        MixedKVCache(model, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="prefill='eager'"):
        MixedKVCache(model, None, prefill="eager")
