"""Exact k-NN radii over tiles: memory O(tile·N), never an N×N matrix. The screening primitives live in
`framework.metrics.screening` and the ball-membership counts in `framework.metrics.balls` (re-exported here).

Distances are screened one tile at a time with a matmul in the compute dtype (float32 for float32 features: BLAS
speed on CPU or GPU) under a rigorous bound on the screening error, |s − d²| ≤ (γ_D + 48u)(|a| + |b|)² (Higham's
γ_D for dot products; features are centred first). Only pairs the bound cannot decide (the k-th neighbour and
near-ties with it, or a distance within ~1e-4 of a radius) are recomputed exactly as Σ(a − b)² in float64. Every
decision therefore equals the float64 direct computation whatever the tile size: chunked and dense (one tile)
paths agree exactly. Self-neighbours are excluded by index, never by d = 0. Within one set only the tiles on and
above the diagonal are computed (each serves its rows and, transposed, its columns).

Values are squared distances, optionally times a per-point squared factor: `col_scale2[j]·d²(i, j)` ranks the
neighbours of i under a corrected metric δ_i δ_j d(i, j) (δ_i is constant along a row and drops out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from framework.metrics.balls import BallStats, ball_stats
from framework.metrics.screening import (
    TILE,
    Points,
    bound_coef,
    exact_sq,
    full_precision,
    pairs_sq,
    prepare,
    screen,
    tiles,
)

# BallStats, ball_stats, Points, prepare, TILE and exact_sq lived here first: importing them from here still works
__all__ = ["KNN", "TILE", "BallStats", "Points", "Scan", "ball_stats", "exact_sq", "knn", "knn_from_screened",
           "prepare", "rerank", "scan", "with_exact_values"]

#: k-NN candidates kept per row beyond k while tiles stream past (more only where near-ties need them)
_EXTRA = 4


@dataclass
class KNN:
    """The k smallest (scaled) squared distances of each query row, ascending, and their reference indices.

    From `knn`/`scan` the index sets and the last (k-th: the radius) column are exact; an earlier value may be the
    screened one (relative error ~1e-6) where the bound alone proved it lies among the k nearest."""

    values: Tensor  # (n, k) float64
    index: Tensor  # (n, k) int64


@dataclass
class Scan:
    """What one pass over a pair of sets produced: the exact k-NN, plus optional screened extras."""

    exact: KNN
    approx: KNN | None = None  # raw (unscaled) screened `width` nearest, ascending: values accurate to ~1e-6
    dense: Tensor | None = None  # the whole screened raw d² matrix (float64, +inf on self), when asked for


class _Running:
    """The m smallest values per row (and their column indices), merged tile by tile."""

    def __init__(self, n: int, m: int, dtype: torch.dtype, device: torch.device):
        self.m = m
        self.v = torch.full((n, m), float("inf"), dtype=dtype, device=device)
        self.i = torch.zeros((n, m), dtype=torch.long, device=device)

    def push(self, rows: slice, v: Tensor, col_start: int) -> None:
        """Merge a tile's values (rows × columns starting at `col_start`) into the rows' running lists."""
        thr = self.v[rows].amax(1)  # the current m-th smallest; +inf while a row's list is not full yet
        if bool(torch.isinf(thr).any()):
            self._merge(torch.arange(rows.start, rows.stop, device=v.device), *v.topk(
                min(self.m, v.shape[1]), dim=1, largest=False, sorted=False), col_start)
            return
        hit = (v.amin(1) < thr).nonzero().squeeze(1)  # rows this tile improves (amin is much cheaper than a mask)
        if not hit.numel():
            return
        if 4 * hit.numel() > v.shape[0]:  # usually a few entries per row: merge only those
            ri, ci = (v < thr[:, None]).nonzero(as_tuple=True)
        else:
            ri, ci = (v[hit] < thr[hit, None]).nonzero(as_tuple=True)
            ri = hit[ri]
        touched, counts = ri.unique_consecutive(return_counts=True)
        width = int(counts.max())
        slot = torch.arange(ri.numel(), device=v.device) - (counts.cumsum(0) - counts).repeat_interleave(counts)
        row = torch.arange(len(touched), device=v.device).repeat_interleave(counts)
        pv = torch.full((len(touched), width), float("inf"), dtype=v.dtype, device=v.device)
        pi = torch.zeros((len(touched), width), dtype=torch.long, device=v.device)
        pv[row, slot], pi[row, slot] = v[ri, ci], ci
        self._merge(touched + rows.start, pv, pi, col_start)

    def _merge(self, rows: Tensor, tv: Tensor, ti: Tensor, col_start: int) -> None:
        allv, alli = torch.cat([self.v[rows], tv], 1), torch.cat([self.i[rows], ti + col_start], 1)
        bv, bi = allv.topk(self.m, dim=1, largest=False, sorted=False)
        self.v[rows], self.i[rows] = bv, alli.gather(1, bi)


def knn(
    query: Points,
    ref: Points,
    k: int,
    *,
    self_index: Tensor | None = None,
    col_scale2: Tensor | None = None,
    block_size: int | None = None,
) -> KNN:
    """Exact k nearest references of every query row, ranked by `col_scale2[j]·d²(i, j)` (or d²).

    `self_index[i]` is the index in `ref` of query i itself (same set), excluded by index."""
    return scan(query, ref, k, self_index=self_index, col_scale2=col_scale2, block_size=block_size).exact


def scan(
    query: Points,
    ref: Points,
    k: int,
    *,
    self_index: Tensor | None = None,
    col_scale2: Tensor | None = None,
    width: int = 0,
    dense: bool = False,
    block_size: int | None = None,
    _m: int | None = None,
) -> Scan:
    """`knn`, and from the same tiles the raw screened `width` nearest and/or the full raw matrix.

    Exactness: with L ≤ true ≤ U per pair, the k nearest are among {j : L_j ≤ k-th smallest U}; only those not
    already proven to be strictly inside (U_j < k-th smallest L) are recomputed exactly."""
    n, n_ref, dev = len(query), len(ref), query.x.device
    available = n_ref - (self_index is not None)
    if not 0 < k <= available or width > available:
        raise ValueError(f"k={k} and width={width} must be in 1..{available} (reference points excluding self)")
    symmetric = query is ref and self_index is not None and bool(
        (self_index == torch.arange(n, device=dev)).all())
    dtype = query.c.dtype
    m = min(available, _m or max(k + _EXTRA, width if col_scale2 is None else 0))
    cands = _Running(n, m, dtype, dev)
    raw = _Running(n, width, dtype, dev) if width and col_scale2 is not None else None
    full = torch.empty(n, n_ref, dtype=torch.float64, device=dev) if dense else None
    scale_c = col_scale2.to(dtype) if col_scale2 is not None else None
    row_tiles, col_tiles = tiles(n, block_size), tiles(n_ref, block_size)
    with full_precision():
        for ti, rows in enumerate(row_tiles):
            for tj, cols in enumerate(col_tiles):
                if symmetric and tj < ti:
                    continue
                s = screen(query, rows, ref, cols)
                if self_index is not None:
                    own = self_index[rows]
                    hit = (own >= cols.start) & (own < cols.stop)
                    s[hit.nonzero().squeeze(1), own[hit] - cols.start] = float("inf")
                views = [(rows, s, cols)] + ([(cols, s.T, rows)] if symmetric and tj > ti else [])
                for r_sl, v, c_sl in views:
                    if full is not None:
                        full[r_sl, c_sl] = v.clamp(min=0)
                    if raw is not None:
                        raw.push(r_sl, v, c_sl.start)
                    cands.push(r_sl, v * scale_c[None, c_sl] if scale_c is not None else v, c_sl.start)
    values, index, overflow = _resolve(query, ref, k, cands, col_scale2, available)
    if overflow.numel():  # near-ties beyond the kept candidates (rare): redo those rows with 4× as many
        sub = scan(query.subset(overflow), ref, k, self_index=None if self_index is None else self_index[overflow],
                   col_scale2=col_scale2, block_size=block_size, _m=4 * m)
        values[overflow], index[overflow] = sub.exact.values, sub.exact.index
    approx = None
    if width:
        src = raw or cands
        v, order = src.v.topk(width, dim=1, largest=False, sorted=True)
        approx = KNN(v.double().clamp_(min=0), src.i.gather(1, order))
    return Scan(KNN(values, index), approx, full)


def _resolve(
    query: Points, ref: Points, k: int, cands: _Running, col_scale2: Tensor | None, available: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Exact k-NN from the screened candidates; also the rows whose candidates might miss a near-tie."""
    s, idx = cands.v.double(), cands.i
    coef = bound_coef(query)
    scale = col_scale2[idx] if col_scale2 is not None else 1.0
    band = (query.norm[:, None] + ref.norm[idx]).square_().mul_(coef) * scale
    lower, upper = s - band, s + band
    upper_k = upper.topk(k, dim=1, largest=False).values[:, -1:]  # ≥ the true k-th smallest value t_k
    lower_k = lower.topk(k, dim=1, largest=False).values[:, -1:]  # ≤ t_k
    overflow = torch.zeros(s.shape[0], dtype=torch.bool, device=s.device)
    if cands.m < available:  # every non-candidate is ≥ the largest candidate's screened value
        smax = col_scale2.max() if col_scale2 is not None else 1.0
        worst = (query.norm + ref.norm.max()).square() * coef * smax
        overflow = s.max(1).values - worst <= upper_k.squeeze(1)
    sure = upper < lower_k  # proven strictly inside the k nearest: no exact value needed
    unsure = (lower <= upper_k) & ~sure
    qi, ci = unsure.nonzero(as_tuple=True)
    e = pairs_sq(query, qi, ref, idx[qi, ci])
    val = torch.where(sure, s, float("inf"))
    val[qi, ci] = e * col_scale2[idx[qi, ci]] if col_scale2 is not None else e
    key = torch.where(sure, float("-inf"), val)  # the sure ones first, then the smallest exact values
    pick = key.topk(k, dim=1, largest=False, sorted=False).indices
    top, order = val.gather(1, pick).sort(dim=1)
    return top, idx.gather(1, pick.gather(1, order)), overflow.nonzero().squeeze(1)


def knn_from_screened(
    query: Points,
    ref: Points,
    k: int,
    screened: Tensor,
    *,
    self_index: Tensor | None = None,
    col_scale2: Tensor | None = None,
    block_size: int | None = None,
) -> KNN:
    """`knn` from a screened raw d² matrix that `scan(..., dense=True)` already computed (+inf on self): the same
    candidates and certificates without a new matmul; rows whose candidates may miss a near-tie are rescanned."""
    available = len(ref) - (self_index is not None)
    cands = _Running.__new__(_Running)
    cands.m = min(available, k + _EXTRA)
    scaled = screened * col_scale2[None, :] if col_scale2 is not None else screened
    cands.v, cands.i = scaled.topk(cands.m, dim=1, largest=False, sorted=False)
    values, index, overflow = _resolve(query, ref, k, cands, col_scale2, available)
    if overflow.numel():
        sub = scan(query.subset(overflow), ref, k, self_index=None if self_index is None else self_index[overflow],
                   col_scale2=col_scale2, block_size=block_size, _m=4 * cands.m)
        values[overflow], index[overflow] = sub.exact.values, sub.exact.index
    return KNN(values, index)


def with_exact_values(
    query: Points, ref: Points, nn: KNN, col_scale2: Tensor | None = None, rows: Tensor | None = None
) -> KNN:
    """`nn` with every value (not only the k-th) recomputed as the float64 Σ(a − b)², scaled, re-sorted: results
    that average all k values then depend on the neighbour sets only, not on which screen found them. `rows`: the
    query indices of `nn`'s rows (default all, in order)."""
    n, k = nn.index.shape
    rows = torch.arange(n, device=nn.index.device) if rows is None else rows
    values = pairs_sq(query, rows.repeat_interleave(k), ref, nn.index.reshape(-1)).view(n, k)
    if col_scale2 is not None:
        values = values * col_scale2[nn.index]
    values, order = values.sort(dim=1)
    return KNN(values, nn.index.gather(1, order))


def rerank(candidates: KNN, scale2: Tensor, k: int) -> KNN:
    """The k nearest under `scale2[j]·d²` among each row's candidate lists (raw d² values)."""
    v = candidates.values * scale2[candidates.index]
    top, order = v.topk(k, dim=1, largest=False, sorted=True)
    return KNN(top, candidates.index.gather(1, order))
