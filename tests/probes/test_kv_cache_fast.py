"""The static-buffer mixed KV cache against the decode path it replaced (kept here as `ReferenceCache`).

The reference gathers each head group by index, concatenates and masks per step; the cache under test reorders the
heads once, writes into preallocated buffers in place and makes one attention call per group. Greedy tokens must
agree far past the window (the recent ring wraps many times), and so must the buffers and logits, bit for bit (same
kernels on the same values; the reference's growing full buffer is laid out as the new one). Decoding must not
reallocate the cache.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_greedy_up_to_rounding

from framework.models.transformer import TransformerLM
from framework.serving.decoding import decode, decode_uncached
from framework.serving.kv_cache import MixedKVCache


class ReferenceLayer:
    """One layer of the previous mixed decode path: index gathers, a position-tracking ring, per-step masks."""

    def __init__(self, full: torch.Tensor, heads: int, sink: int, recent: int, prefill: str, capacity: int | None):
        self.group, self.sink, self.recent, self.prefill = heads // full.numel(), sink, recent, prefill
        self.capacity = capacity
        self.full_idx, self.stream_idx = full.nonzero().flatten(), (~full).nonzero().flatten()
        offsets = torch.arange(self.group)
        self.q_full = (self.full_idx[:, None] * self.group + offsets).flatten()
        self.q_stream = (self.stream_idx[:, None] * self.group + offsets).flatten()
        self.length, self.k_full, self.v_full, self.k_stream, self.v_stream = 0, None, None, None, None
        self.slot_pos = torch.full((sink + recent,), -1, dtype=torch.long)

    def attend(self, q, k, v):
        out = q.new_empty(q.shape)
        if self.full_idx.numel():
            out[:, self.q_full] = self._full(q[:, self.q_full], k[:, self.full_idx], v[:, self.full_idx])
        if self.stream_idx.numel():
            out[:, self.q_stream] = self._stream(q[:, self.q_stream], k[:, self.stream_idx], v[:, self.stream_idx])
        self.length += q.shape[2]
        return out

    def _full(self, q, k, v):
        start, t = self.length, q.shape[2]
        end = start + t
        if self.k_full is None or end > self.k_full.shape[2]:
            size = max(end, self.capacity or 0, 2 * (0 if self.k_full is None else self.k_full.shape[2]))
            k_new, v_new = (k.new_zeros(k.shape[0], k.shape[1], size, k.shape[3]) for _ in range(2))
            if self.k_full is not None:
                k_new[:, :, :start], v_new[:, :, :start] = self.k_full[:, :, :start], self.v_full[:, :, :start]
            self.k_full, self.v_full = k_new, v_new
        self.k_full[:, :, start:end], self.v_full[:, :, start:end] = k, v
        mask = None if t == 1 else torch.ones(t, end, dtype=torch.bool).tril(diagonal=start)
        return F.scaled_dot_product_attention(
            q, self.k_full[:, :, :end], self.v_full[:, :, :end], attn_mask=mask, enable_gqa=self.group > 1)

    def _slots(self, positions):
        return torch.where(positions < self.sink, positions, self.sink + (positions - self.sink) % self.recent)

    def _stream(self, q, k, v):
        start, t, size = self.length, q.shape[2], self.sink + self.recent
        if self.k_stream is None:
            self.k_stream, self.v_stream = (k.new_zeros(k.shape[0], k.shape[1], size, k.shape[3]) for _ in range(2))
        if t == 1:  # a decode step: write into the ring, then attend over what it holds
            slot = start if start < self.sink else self.sink + (start - self.sink) % self.recent
            self.k_stream[:, :, slot], self.v_stream[:, :, slot] = k[:, :, 0], v[:, :, 0]
            self.slot_pos[slot] = start
            held = min(start + 1, size)
            return F.scaled_dot_product_attention(
                q, self.k_stream[:, :, :held], self.v_stream[:, :, :held], enable_gqa=self.group > 1)
        positions = torch.arange(start, start + t)
        held = min(start, size)
        keys, values = (torch.cat([x[:, :, :held], y], dim=2) for x, y in ((self.k_stream, k), (self.v_stream, v)))
        key_pos = torch.cat([self.slot_pos[:held], positions])
        mask = key_pos[None, :] <= positions[:, None]
        if not (self.prefill == "full" and start == 0):
            mask = mask & ((key_pos[None, :] < self.sink) | (positions[:, None] - key_pos[None, :] < self.recent))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.group > 1)
        keep = (positions < self.sink) | (positions >= start + t - self.recent)
        slots = self._slots(positions[keep])
        self.k_stream.index_copy_(2, slots, k[:, :, keep])
        self.v_stream.index_copy_(2, slots, v[:, :, keep])
        self.slot_pos[slots] = positions[keep]
        return out


class ReferenceCache:
    """What `model(tokens, cache=...)` needs: `length`, `layers`, `advance`."""

    def __init__(self, model, full_heads, window, prefill="streaming", capacity=None):
        self.length = 0
        self.layers = [ReferenceLayer(full_heads[i].bool(), block.attn.heads, *window, prefill, capacity)
                       for i, block in enumerate(model.blocks)]

    def advance(self, t):
        self.length += t


def sharp_model(kv_heads, depth=3, seed=0, max_seq_len=256):
    """Random weights scaled up, so greedy choices are not near-ties."""
    torch.manual_seed(seed)
    model = TransformerLM(vocab_size=20, dim=32, depth=depth, heads=4, kv_heads=kv_heads, max_seq_len=max_seq_len)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6)
    return model.eval()


def allocation(depth, kv_heads, seed):
    """A random allocation with full and compressed heads interleaved (so the head reordering matters)."""
    full = torch.rand(depth, kv_heads, generator=torch.Generator().manual_seed(seed)) < 0.5
    full[0, 0], full[0, -1] = False, True
    return full


@pytest.mark.parametrize(("kv_heads", "window", "prompt_len", "prefill"), [
    (4, (2, 5), 12, "streaming"), (2, (2, 5), 3, "streaming"), (4, (0, 7), 30, "full"), (2, (4, 16), 40, "full"),
])
def test_greedy_tokens_match_the_previous_decode_path_far_past_the_window(kv_heads, window, prompt_len, prefill):
    model = sharp_model(kv_heads)
    full = allocation(3, kv_heads, seed=prompt_len)
    prompt = torch.randint(0, 20, (16, prompt_len), generator=torch.Generator().manual_seed(7))
    steps = sum(window) + 72  # 64+ steps past the window: the recent ring wraps several times
    reference = ReferenceCache(model, full, window, prefill, capacity=prompt_len + steps)
    cache = MixedKVCache(model, full, window, capacity=prompt_len + steps, prefill=prefill)
    expected = decode(model, prompt, steps, cache=reference)
    got = decode(model, prompt, steps, cache=cache)
    assert torch.equal(got, expected)
    for new, old in zip(cache.layers, reference.layers, strict=True):  # the rings hold the same positions
        assert new.n_stream == 0 or new.slot_pos.tolist() == old.slot_pos.tolist()
        for mine, theirs in ((new.k_full, old.k_full), (new.v_full, old.v_full), (new.k_stream, old.k_stream),
                             (new.v_stream, old.v_stream)):
            assert (mine is None) == (theirs is None) and (mine is None or torch.equal(mine, theirs))
    step = prompt[:, -1:]
    assert torch.equal(model(step, cache=cache), model(step, cache=reference))


def test_with_every_head_full_the_tokens_match_the_uncached_model_over_many_steps():
    model = sharp_model(2)
    prompt = torch.randint(0, 20, (16, 5), generator=torch.Generator().manual_seed(8))
    for tokens in (decode(model, prompt, 90), decode_uncached(model, prompt, 90)):  # another kernel: up to rounding
        assert_greedy_up_to_rounding(model, prompt, tokens)


def test_chunked_prompts_then_decoding_match_the_previous_path():
    model = sharp_model(4)
    full = allocation(3, 4, seed=3)
    seq = torch.randint(0, 20, (8, 40), generator=torch.Generator().manual_seed(9))
    caches = MixedKVCache(model, full, (2, 6)), ReferenceCache(model, full, (2, 6))
    for cache in caches:  # prompt in two chunks (the second starts with a partly filled ring), then 1-token steps
        logits = [model(seq[:, :5], cache=cache), model(seq[:, 5:20], cache=cache)]
        logits += [model(seq[:, t : t + 1], cache=cache) for t in range(20, 40)]
        cache.logits = torch.cat(logits, dim=1)
    assert torch.equal(caches[0].logits, caches[1].logits)


def test_decoding_writes_in_place_into_buffers_allocated_once():
    model = sharp_model(2, depth=2, max_seq_len=512)
    cache = MixedKVCache(model, torch.tensor([[True, False], [False, True]]), (4, 8), capacity=300)
    model(torch.randint(0, 20, (3, 20)), cache=cache)
    buffers = [(x.data_ptr(), x.shape) for layer in cache.layers for x in
               (layer.k_full, layer.v_full, layer.k_stream, layer.v_stream)]
    token = torch.zeros(3, 1, dtype=torch.long)
    with torch.no_grad():
        for _ in range(250):
            model(token, cache=cache)
    assert cache.length == 270
    assert [(x.data_ptr(), x.shape) for layer in cache.layers for x in
            (layer.k_full, layer.v_full, layer.k_stream, layer.v_stream)] == buffers


def test_slot_positions_follow_the_ring_before_and_after_it_fills():
    model = sharp_model(2, depth=1)
    cache = MixedKVCache(model, torch.tensor([[False, True]]), (2, 3))
    layer = cache.layers[0]
    seen = []
    for t in range(9):
        model(torch.tensor([[t % 20]]), cache=cache)
        seen.append(layer.slot_pos.tolist())
    assert seen[0] == [0, -1, -1, -1, -1] and seen[3] == [0, 1, 2, 3, -1]
    assert seen[8] == [0, 1, 8, 6, 7]  # positions 0..8: slot 2 + r holds the last p with (p - 2) % 3 == r


@pytest.mark.parametrize(("window", "first"), [((2, 5), 23), ((6, 3), 4), ((0, 7), 30)])
def test_a_prompt_attended_in_chunks_gives_what_one_call_gives_and_the_same_rings(window, first):
    """The streaming prefill attends in chunks of `prefill_chunk` new positions; 3 here, so chunks start inside the
    sink, straddle it and lie past it, and the second prompt call starts with a ring that holds part of the first."""
    model = sharp_model(4)
    full = allocation(3, 4, seed=first)
    seq = torch.randint(0, 20, (8, 44), generator=torch.Generator().manual_seed(10))
    whole, chunked = MixedKVCache(model, full, window), MixedKVCache(model, full, window)
    for layer in chunked.layers:
        layer.prefill_chunk = 3
    with torch.no_grad():
        logits = [torch.cat([model(seq[:, :first], cache=c), model(seq[:, first:40], cache=c)]
                            + [model(seq[:, t : t + 1], cache=c) for t in range(40, 44)], dim=1)
                  for c in (whole, chunked)]
    # the keys a chunk sees are a subset of one call's, masked alike: the same sums up to float rounding, which the
    # sharp weights carry through three layers; measured against each tensor's own scale
    def assert_rounding_apart(got, expected):
        assert (got is None) == (expected is None)  # a layer with no full (or no compressed) head has no buffer
        assert got is None or (got - expected).abs().amax() <= 1e-5 * expected.abs().amax()

    assert_rounding_apart(logits[1], logits[0])
    for a, b in zip(whole.layers, chunked.layers, strict=True):
        assert a.slot_pos.tolist() == b.slot_pos.tolist()
        for got, expected in ((b.k_stream, a.k_stream), (b.v_stream, a.v_stream), (b.k_full, a.k_full)):
            assert_rounding_apart(got, expected)
    # ...and not what full attention over the 40 prompt positions would have given the compressed heads
    whole, full_prefill = MixedKVCache(model, full, window), MixedKVCache(model, full, window, prefill="full")
    with torch.no_grad():
        streamed, other = (model(seq[:, :40], cache=c) for c in (whole, full_prefill))
    assert_rounding_apart(streamed, logits[0][:, :40])
    assert (other - streamed).abs().amax() > 1e-2 * streamed.abs().amax()
