"""Left-padded rows in the mixed KV cache (`framework.serving.kv_cache.LayerKVCache`): a batch of prompts of different
lengths, each row decoded as it would be alone.

A row's first `pads[r]` positions are padding. The full heads never attend to them (the padding's own queries attend
to themselves only: their outputs are never used, and a query with no key would give NaNs that zero attention
weights carry into real tokens). The compressed heads count positions from each row's first token, so each row's
ring holds its own sink and recent window. The prompt comes in one call (in chunks of `prefill_chunk` queries), then
one token a call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def ring_positions(last: Tensor, sink: int, recent: int) -> Tensor:
    """The position each ring slot holds (-1: empty), (rows, sink + recent), after each row's position `last`
    (rows, 1): slot p < sink holds position p; slot sink + r the last position p >= sink with (p - sink) % recent
    == r. One row of it is `LayerKVCache.slot_pos`."""
    device = last.device
    sinks = torch.arange(sink, device=device)[None]
    recents = sink + torch.arange(recent, device=device)[None]
    recents = recents + recent * torch.div(last - recents, recent, rounding_mode="floor")
    return torch.cat([sinks.masked_fill(sinks > last, -1), recents.masked_fill(recents < sink, -1)], dim=1)


class PaddedRows:
    """The padded-batch paths of `LayerKVCache` (its state, below, and its `_slots`)."""

    pads: Tensor | None
    length: int
    sink: int
    recent: int
    group: int
    prefill: str
    prefill_chunk: int
    k_full: Any
    v_full: Any
    k_stream: Any
    v_stream: Any
    sliding: int | None

    def _attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        raise NotImplementedError  # LayerKVCache's: attention as the model computes it

    def _attend_full_padded(self, q: Tensor, end: int, base: int = 0) -> Tensor:
        """Full heads of a left-padded batch, their keys already stored from position `base` on (see the module's
        docstring)."""
        t, device = q.shape[2], q.device
        pad = self.pads[:, None, None, None]
        keys, values = self.k_full.narrow(2, 0, end - base), self.v_full.narrow(2, 0, end - base)
        if t == 1:
            position = torch.arange(base, end, device=device)
            mask = position >= pad
            if self.sliding:
                mask &= position > end - 1 - self.sliding
            return self._attn(q, keys, values, mask)
        outs = []
        for a in range(0, t, self.prefill_chunk):
            b = min(t, a + self.prefill_chunk)
            query, key = torch.arange(a, b, device=device)[:, None], torch.arange(b, device=device)
            mask = (key <= query) & ((key >= pad) | (key == query))
            if self.sliding:
                mask &= query - key < self.sliding
            outs.append(self._attn(q[:, :, a:b], keys[:, :, :b], values[:, :, :b], mask))
        return torch.cat(outs, dim=2)

    def _attend_stream_padded(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Compressed heads of a left-padded batch: each row's ring holds its own positions, counted from its first
        token (a prompt of one call, then one token a call)."""
        start, t, device = self.length, q.shape[2], q.device
        if t == 1:
            real = start - self.pads  # (batch,): this token's position in its row
            slot = torch.where(real < self.sink, real, self.sink + (real - self.sink) % self.recent)
            for buffer, new in ((self.k_stream, k), (self.v_stream, v)):
                buffer.scatter_(2, slot.view(-1, 1, 1, 1).expand(-1, new.shape[1], 1, new.shape[3]), new)
            held = ring_positions(real[:, None], self.sink, self.recent)  # all in the row's window
            mask = (held >= 0) & (real[:, None] - held < self.sliding) if self.sliding else held >= 0
            return self._attn(q, self.k_stream, self.v_stream, mask[:, None, None, :])
        pad = self.pads[:, None, None, None]
        outs, first = [], int(self.pads.max()) + self.sink  # past it no row has a sink position
        for a in range(0, t, self.prefill_chunk):
            b = min(t, a + self.prefill_chunk)
            lo = max(0, a - self.recent + 1) if self.prefill == "streaming" else 0
            ends = min(first, lo)  # keys before `lo` that may be a row's sink
            key = torch.cat([torch.arange(ends, device=device), torch.arange(lo, b, device=device)])
            query = torch.arange(a, b, device=device)[:, None]
            mask = (key <= query) & (key >= pad)
            if self.prefill == "streaming":
                mask &= (key - pad < self.sink) | (query - key < self.recent)
            if self.sliding:
                mask &= query - key < self.sliding
            mask |= key == query  # a padding query attends to itself (the module's docstring)
            keys = torch.cat([k[:, :, :ends], k[:, :, lo:b]], dim=2)
            values = torch.cat([v[:, :, :ends], v[:, :, lo:b]], dim=2)
            outs.append(self._attn(q[:, :, a:b], keys, values, mask))
        for row, pad_r in enumerate(self.pads.tolist()):  # each row's sink and last `recent` tokens, in its ring
            real = torch.arange(t - pad_r, device=device)
            keep = (real < self.sink) | (real >= t - pad_r - self.recent)
            for buffer, new in ((self.k_stream, k), (self.v_stream, v)):
                buffer[row].index_copy_(1, self._slots(real[keep]), new[row, :, pad_r:][:, keep])
        return torch.cat(outs, dim=2)
