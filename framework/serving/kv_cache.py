"""A mixed per-head KV cache for autoregressive decoding (the inference side of RLKV / DuoAttention).

Full heads keep every key/value; compressed heads keep only the first `sink` positions and the last `recent`
ones (a constant `sink + recent` entries, written into a ring). Keys are cached after rotation, so positions are
never re-indexed. Caching is per KV head: a GQA group is never expanded before it is stored. Decoding with the
cache gives the same tokens as the masked no-cache forward with hard 0/1 gates (`prefill="streaming"`).

    cache = MixedKVCache(model, full_heads=allocation.full_heads(0.5), window=(1, 4)); model(prompt, cache=cache)

`framework.serving.decoding.decode` generates with it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from framework.serving.attention import attention, causal_mask, check_window
from framework.serving.kv_padding import PaddedRows, ring_positions

PREFILL_POLICIES = ("streaming", "full")


class LayerKVCache(PaddedRows):
    """One layer's cache. `full` (kv_heads,) bool marks the heads that keep everything.

    `prefill="streaming"`: compressed heads see only sink + recent keys from the first token on (what the masked
    forward with gates 0 computes); `"full"`: the first call (the prompt) attends causally over everything,
    then the compressed heads are truncated (the Hugging Face evaluation path of RLKV).

    Layout (as DuoAttention's): the heads are reordered once, full heads first, so each group is a contiguous slice
    and gets one attention call. Full heads write into a static (batch, full heads, capacity, head_dim) buffer,
    compressed heads into a static (batch, compressed heads, sink + recent, head_dim) ring; a one-token step writes
    its keys/values in place and allocates no cache memory (the full buffer grows only past `capacity`).

    Left-padded prompts (`attend(..., pads=)` on the first call: row r's first `pads[r]` positions are padding): the
    full heads mask each row's padding; the compressed heads count positions from each row's first token, so a row
    keeps its own sink and recent window, as it would alone. After a padded prompt the cache takes one token a call.
    """

    #: new positions per attention call when compressed heads take several at once (a prompt): bounds the mask and
    #: the work at (chunk, sink + recent + chunk) per call, however long the prompt
    prefill_chunk = 1024

    def __init__(self, full: Tensor, heads: int, sink: int, recent: int, capacity: int | None = None,
                 prefill: str = "streaming"):
        full = torch.as_tensor(full, dtype=torch.bool).flatten()
        kv_heads = full.numel()
        if heads % kv_heads:
            raise ValueError(f"heads={heads} is not a multiple of the {kv_heads} KV heads in `full`")
        if prefill not in PREFILL_POLICIES:
            raise ValueError(f"prefill={prefill!r}; valid: {', '.join(PREFILL_POLICIES)}")
        self.group, self.sink, self.recent = heads // kv_heads, sink, recent
        self.capacity, self.prefill = capacity, prefill
        self.full = full
        self.full_idx, self.stream_idx = full.nonzero().flatten(), (~full).nonzero().flatten()
        self.n_full, self.n_stream = self.full_idx.numel(), self.stream_idx.numel()
        self.kv_order = torch.cat([self.full_idx, self.stream_idx])  # full heads first, then compressed ones
        self.q_order = (self.kv_order[:, None] * self.group + torch.arange(self.group)).flatten()
        self.q_restore = self.q_order.argsort()
        self.permuted = not torch.equal(self.kv_order, torch.arange(kv_heads))
        self.length = 0
        self.k_full: Tensor | None = None  # (batch, full heads, capacity, head_dim)
        self.v_full: Tensor | None = None
        self.k_stream: Tensor | None = None  # (batch, compressed heads, sink + recent, head_dim)
        self.v_stream: Tensor | None = None
        self.pads: Tensor | None = None  # (batch,) left padding of each row; None: no row is padded
        self.sliding: int | None = None  # the layer's sliding window (transformers' `sliding_window`), None: none
        self.full_start = 0  # the position the full heads' buffers start at (a sliding layer drops what none reach)
        self.softcap: float | None = None  # attention-logit softcapping (Gemma 2)
        self._sinks: Tensor | None = None  # sink logits of the query heads being attended (gpt-oss)

    @property
    def slot_pos(self) -> Tensor:
        """The position each ring slot holds (-1: empty), (sink + recent,): a function of `length` alone
        (`framework.serving.kv_padding.ring_positions`)."""
        return ring_positions(torch.tensor([[self.length - 1]]), self.sink, self.recent)[0]

    def _on(self, device: torch.device) -> None:
        """Keep the head orders on the device of the keys (index_select needs them there)."""
        if self.q_order.device != device:
            self.kv_order, self.q_order, self.q_restore = (
                x.to(device) for x in (self.kv_order, self.q_order, self.q_restore))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pads: Tensor | None = None, sliding: int | None = None,
               softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
        """Store the new keys/values (batch, kv_heads, t, d) and return attention outputs (batch, heads, t, d).
        `pads` (batch,), with the prompt only: each row's left padding. What the model's own attention adds is
        carried: `sliding` (its layer's window: every head, full or compressed, sees only the keys less than
        `sliding` positions back), `softcap` (logit softcapping) and `sinks` (one sink logit per query head)."""
        self.sliding, self.softcap = (int(sliding) if sliding else None), softcap
        if pads is not None:
            if self.length or q.shape[2] < 2:
                raise ValueError("left padding (pads=) comes with the prompt, the first call on an empty cache")
            self.pads = pads.to(q.device) if bool(pads.any()) else None
        elif self.pads is not None and q.shape[2] > 1:
            raise ValueError("after a left-padded prompt the mixed KV cache takes one token per call; give the whole "
                             "prompt in the first call")
        if self.permuted:  # one gather each puts the full heads first: both groups become slices
            self._on(q.device)
            q = q.index_select(1, self.q_order)
            k, v = k.index_select(1, self.kv_order), v.index_select(1, self.kv_order)
            sinks = None if sinks is None else sinks.to(q.device).index_select(0, self.q_order)
        nf, ns, nq = self.n_full, self.n_stream, self.n_full * self.group
        outs = []
        if nf:
            self._sinks = None if sinks is None else sinks[:nq]
            outs.append(self._attend_full(q.narrow(1, 0, nq), k.narrow(1, 0, nf), v.narrow(1, 0, nf)))
        if ns:
            self._sinks = None if sinks is None else sinks[nq:]
            outs.append(self._attend_stream(q.narrow(1, nq, ns * self.group), k.narrow(1, nf, ns),
                                            v.narrow(1, nf, ns)))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        self.length += q.shape[2]
        return out.index_select(1, self.q_restore) if self.permuted else out

    def _reserve_full(self, k: Tensor, v: Tensor, end: int) -> None:
        """Make the full heads' buffers hold `end` positions (`capacity` at once; doubling only past it), each in its
        own tensor's dtype (under autocast a rotated key can be float32 while its value is bfloat16)."""
        if self.k_full is not None and end <= self.k_full.shape[2]:
            return
        capacity = min(self.capacity or 0, 2 * self.sliding) if self.sliding else self.capacity or 0
        size = max(end, capacity, 2 * (0 if self.k_full is None else self.k_full.shape[2]))
        held = self.length - self.full_start
        k_new, v_new = (x.new_zeros(x.shape[0], x.shape[1], size, x.shape[3]) for x in (k, v))
        if self.k_full is not None:
            k_new[:, :, :held], v_new[:, :, :held] = (x[:, :, :held] for x in (self.k_full, self.v_full))
        self.k_full, self.v_full = k_new, v_new

    def _slide(self, t: int) -> None:
        """A sliding layer's full heads keep only the `sliding - 1` positions a later query reaches (as transformers'
        own sliding layers do): before a write the buffers cannot take, that tail moves to their front, in place
        (amortised: once every `sliding` or more steps), or into new buffers of 2 × `sliding` (a long prompt's
        buffers are let go)."""
        held = self.length - self.full_start
        if self.k_full is None or held + t <= self.k_full.shape[2]:
            return
        keep = min(held, self.sliding - 1)
        tail = [x.narrow(2, held - keep, keep) for x in (self.k_full, self.v_full)]
        if keep + t <= self.k_full.shape[2] <= 2 * self.sliding + t and held >= 2 * keep:  # no overlap: in place
            for buffer, part in zip((self.k_full, self.v_full), tail, strict=True):
                buffer.narrow(2, 0, keep).copy_(part)
        else:
            size = max(keep + t, 2 * self.sliding)
            new = [x.new_zeros(x.shape[0], x.shape[1], size, x.shape[3]) for x in (self.k_full, self.v_full)]
            for buffer, part in zip(new, tail, strict=True):
                buffer.narrow(2, 0, keep).copy_(part)
            self.k_full, self.v_full = new
        self.full_start = self.length - keep

    def _attend_full(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        start, t = self.length, q.shape[2]
        if self.sliding:
            self._slide(t)
        base, end = self.full_start, start + t
        self._reserve_full(k, v, end - base)
        self.k_full.narrow(2, start - base, t).copy_(k)
        self.v_full.narrow(2, start - base, t).copy_(v)
        if self.pads is not None:
            return self._attend_full_padded(q, end, base)
        keys, values = self.k_full.narrow(2, 0, end - base), self.v_full.narrow(2, 0, end - base)
        if self.sliding and end > self.sliding:  # a sliding layer: each query sees its window's keys
            if t == 1:
                return self._attn(q, keys.narrow(2, end - base - self.sliding, self.sliding),
                                  values.narrow(2, end - base - self.sliding, self.sliding))
            return self._attend_window(q, keys, values, start - base)
        causal = t > 1 and start == 0  # a prompt into an empty cache: no (t, t) mask is built
        mask = None if t == 1 or causal else torch.ones(t, end, dtype=torch.bool, device=q.device).tril(diagonal=start)
        return self._attn(q, keys, values, mask, causal)

    def _attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """Attention as the model computes it (`framework.serving.attention.attention`: softcap and sinks)."""
        return attention(q, k, v, mask, causal, softcap=self.softcap, sinks=self._sinks)

    def _attend_window(self, q: Tensor, keys: Tensor, values: Tensor, start: int) -> Tensor:
        """Queries at start..start+t-1 over `keys` of positions 0.. under the sliding window, in chunks of
        `prefill_chunk` queries that each take only the keys their windows reach."""
        t, outs = q.shape[2], []
        for a in range(0, t, self.prefill_chunk):
            b = min(t, a + self.prefill_chunk)
            lo = max(0, start + a - self.sliding + 1)
            mask = causal_mask(b - a, start + b - lo, start + a - lo, self.sliding, device=q.device)
            outs.append(self._attn(q[:, :, a:b], keys[:, :, lo:start + b], values[:, :, lo:start + b], mask))
        return torch.cat(outs, dim=2)

    def _slots(self, positions: Tensor) -> Tensor:
        return torch.where(positions < self.sink, positions, self.sink + (positions - self.sink) % self.recent)

    def _attend_stream(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        start, t = self.length, q.shape[2]
        size = self.sink + self.recent
        if self.k_stream is None:
            self.k_stream, self.v_stream = (x.new_zeros(x.shape[0], x.shape[1], size, x.shape[3]) for x in (k, v))
        if self.pads is not None:
            return self._attend_stream_padded(q, k, v)
        if t == 1:  # decoding: after the in-place write, every held entry is within the sink or the recent window
            slot = start if start < self.sink else self.sink + (start - self.sink) % self.recent
            self.k_stream.narrow(2, slot, 1).copy_(k)
            self.v_stream.narrow(2, slot, 1).copy_(v)
            if self.sliding and start >= self.sliding:  # a sliding layer: the sink too leaves the window
                held = ring_positions(torch.tensor([[start]], device=q.device), self.sink, self.recent)[0]
                return self._attn(q, self.k_stream, self.v_stream, ((held >= 0) & (start - held < self.sliding))[None])
            if start + 1 >= size:  # the ring is full: attend over all of it, no length to cut
                return self._attn(q, self.k_stream, self.v_stream)
            return self._attn(q, self.k_stream.narrow(2, 0, start + 1), self.v_stream.narrow(2, 0, start + 1))
        return self._prefill_stream(q, k, v)

    def _prefill_stream(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Several new positions at once (a prompt): attend, then keep what the ring holds."""
        start, t = self.length, q.shape[2]
        if self.prefill == "full" and start == 0 and self.sliding and t > self.sliding:
            out = self._attend_window(q, k, v, 0)
        elif self.prefill == "full" and start == 0:  # plain causal attention over the prompt: no (t, t) mask
            out = self._attn(q, k, v, causal=True)
        else:
            out = torch.cat([self._stream_chunk(q, k, v, a, min(t, a + self.prefill_chunk))
                             for a in range(0, t, self.prefill_chunk)], dim=2)
        positions = torch.arange(start, start + t)
        keep = (positions < self.sink) | (positions >= start + t - self.recent)
        slots = self._slots(positions[keep]).to(k.device)
        self.k_stream.index_copy_(2, slots, k[:, :, keep.to(k.device)])
        self.v_stream.index_copy_(2, slots, v[:, :, keep.to(v.device)])
        return out

    def _stream_chunk(self, q: Tensor, k: Tensor, v: Tensor, a: int, b: int) -> Tensor:
        """The compressed heads' outputs for new positions a..b-1 (of the `t` given at once): they attend to what
        the ring held before the call, the new sink positions and the new keys from `a - recent + 1` on, so a
        chunk's mask is (b - a, at most sink + recent + b - a) whatever the prompt's length."""
        start, device = self.length, q.device
        held = min(start, self.sink + self.recent)
        lo = max(0, a - self.recent + 1)  # the first new key inside any of the chunk's recent windows
        sinks = max(0, min(self.sink - start, lo))  # new sink keys before `lo` (the rest lie in k[lo:b])
        keys = torch.cat([self.k_stream[:, :, :held], k[:, :, :sinks], k[:, :, lo:b]], dim=2)
        values = torch.cat([self.v_stream[:, :, :held], v[:, :, :sinks], v[:, :, lo:b]], dim=2)
        key_pos = torch.cat([self.slot_pos[:held].to(device), torch.arange(start, start + sinks, device=device),
                             torch.arange(start + lo, start + b, device=device)])
        query_pos = torch.arange(start + a, start + b, device=device)[:, None]
        mask = (key_pos <= query_pos) & ((key_pos < self.sink) | (query_pos - key_pos < self.recent))
        if self.sliding:
            mask &= query_pos - key_pos < self.sliding
        return self._attn(q[:, :, a:b], keys, values, mask)

    def preload(self, k: Tensor, v: Tensor) -> None:
        """Store keys/values (batch, kv_heads, t, d) of positions 0..t-1 without attending (what a prefill keeps):
        full heads keep all t, compressed heads the sink and the last `recent`. Only on an empty cache."""
        if self.length:
            raise ValueError(f"preload needs an empty cache; this one holds {self.length} positions")
        t = k.shape[2]
        self.k_full = self.v_full = self.k_stream = self.v_stream = self.pads = None
        self.full_start = 0
        if self.n_full:
            full_idx = self.full_idx.to(k.device)
            k_full, v_full = k[:, full_idx], v[:, full_idx]
            self._reserve_full(k_full, v_full, t)
            self.k_full[:, :, :t], self.v_full[:, :, :t] = k_full, v_full
        if self.n_stream:
            positions = torch.arange(t)
            keep = (positions < self.sink) | (positions >= t - self.recent)
            slots = self._slots(positions[keep]).to(k.device)
            shape = (k.shape[0], self.n_stream, self.sink + self.recent, k.shape[3])
            self.k_stream, self.v_stream = k.new_zeros(shape), v.new_zeros(shape)
            stream_idx, keep = self.stream_idx.to(k.device), keep.to(k.device)
            self.k_stream[:, :, slots] = k[:, stream_idx][:, :, keep]
            self.v_stream[:, :, slots] = v[:, stream_idx][:, :, keep]
        self.length = t

    def entries(self) -> Tensor:
        """How many positions each KV head holds: `length` for full heads, `min(length, sink + recent)` else."""
        held = torch.full(self.full.shape, min(self.length, self.sink + self.recent), dtype=torch.long)
        held[self.full] = self._full_held()
        return held

    def _full_held(self) -> int:
        """Positions a full head holds: all of them, or on a sliding layer the `sliding - 1` a later query reaches."""
        return min(self.length, self.sliding - 1) if self.sliding else self.length

    def nbytes(self) -> int:
        """Bytes of the keys and values held (not the buffers' spare capacity), each buffer at its own dtype."""
        full, stream = self.n_full * self._full_held(), self.n_stream * min(self.length, self.sink + self.recent)
        buffers = ((full, self.k_full), (full, self.v_full), (stream, self.k_stream), (stream, self.v_stream))
        return sum(n * x.shape[0] * x.shape[3] * x.element_size() for n, x in buffers if x is not None)


class MixedKVCache:
    """The per-layer caches of a `TransformerLM`; pass it as `model(tokens, cache=cache)` to decode.

    `full_heads` (depth, kv_heads) bool: True keeps the full cache; None keeps every head full (the standard
    cache). `capacity` preallocates the full heads' buffers for that many positions (they grow otherwise).
    """

    def __init__(self, model: nn.Module, full_heads: Tensor | None = None, window: tuple[int, int] = (1, 4),
                 capacity: int | None = None, prefill: str = "streaming"):
        attn = [block.attn for block in model.blocks]
        shape = (len(attn), attn[0].kv_heads)
        full_heads = torch.ones(shape, dtype=torch.bool) if full_heads is None else torch.as_tensor(full_heads)
        if tuple(full_heads.shape) != shape:
            raise ValueError(f"full_heads of shape {tuple(full_heads.shape)} do not fit: expected (depth, kv_heads) "
                             f"= {shape}")
        if not all(a.causal for a in attn):
            raise ValueError("a KV cache needs a causal model (causal=True)")
        self.sink, self.recent = check_window(window)
        self.full_heads = full_heads.bool().cpu()
        self.layers = [LayerKVCache(self.full_heads[i], a.heads, self.sink, self.recent, capacity, prefill)
                       for i, a in enumerate(attn)]
        self.length = 0

    def preload(self, keys_values: list[tuple[Tensor, Tensor]]) -> None:
        """Fill an empty cache with one (keys, values) pair per layer, each (batch, kv_heads, t, head_dim)."""
        if len(keys_values) != len(self.layers):
            raise ValueError(f"preload got {len(keys_values)} (keys, values) pairs for {len(self.layers)} layers")
        for layer, (k, v) in zip(self.layers, keys_values, strict=True):
            layer.preload(k, v)
        self.length = self.layers[0].length

    def advance(self, t: int) -> None:
        """Called by the model after every forward: `t` more positions are cached."""
        self.length += t

    def entries(self) -> Tensor:
        """Positions held per layer and KV head, (depth, kv_heads)."""
        return torch.stack([layer.entries() for layer in self.layers])

    def nbytes(self) -> int:
        """Bytes of keys and values held over all layers (0 before the first forward)."""
        return sum(layer.nbytes() for layer in self.layers)


def kv_fraction(sparsity: float, length: int, window: int) -> float:
    """Share of the full cache that a mixed cache holds at `length` tokens: (1 - s) + s · min(1, W / L)."""
    return (1 - sparsity) + sparsity * min(1.0, window / length)


def theoretical_speedup(sparsity: float, length: int, window: int) -> float:
    """Memory-bound decode speed-up of the mixed cache: 1 / ((1 - s) + s · W / L) (RLKV README)."""
    return 1.0 / kv_fraction(sparsity, length, window)
