"""Exact ball-membership counts over tiles (precision, recall, density, coverage): memory O(tile²), never an
M×N matrix. Each tile is screened as in `framework.metrics.knn`; pairs within the screening bound of a radius are
settled by their float64 screened value and per-pair bound, and those still unsure by the exact Σ(a − b)²."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from framework.metrics.screening import UNIT, Points, bound_coef, full_precision, pairs_sq, screen, tiles

#: one ball test (see `ball_stats`): per-point squared scale, squared radius, whether the scale belongs to the
#: query rows (test A) or the reference columns (test B), and whether the scale is all ones
_Test = tuple[Tensor, Tensor, bool, bool]


@dataclass
class BallStats:
    """Ball-membership results of a cross pass between queries Q (generated) and references R (real)."""

    counts: Tensor  # (M,) int64: number of reference balls containing each query (precision, density)
    covered: Tensor  # (N,) bool: reference ball holds at least one query (coverage)
    inside: Tensor | None  # (N,) bool: reference point lies in at least one query ball (recall)
    ambiguous: int  # pairs the screening bound could not decide (recomputed exactly)


def ball_stats(
    query: Points,
    ref: Points,
    ref_radius2: Tensor,
    query_radius2: Tensor | None = None,
    *,
    query_scale2: Tensor | None = None,
    ref_scale2: Tensor | None = None,
    strict: bool = True,
    block_size: int | None = None,
) -> BallStats:
    """One pass over all (query j, reference i) pairs deciding, exactly,
    A: query_scale2[j]·d²(j, i) < ref_radius2[i]  (query j in reference i's ball), and
    B: ref_scale2[i]·d²(j, i) < query_radius2[j]  (reference i in query j's ball; skipped without radii).
    `strict=False` uses <= (Kynkäänniemi et al.) instead of < (prdc)."""
    m, n, dev = len(query), len(ref), query.x.device
    counts = torch.zeros(m, dtype=torch.long, device=dev)
    covered = torch.zeros(n, dtype=torch.bool, device=dev)
    inside = torch.zeros(n, dtype=torch.bool, device=dev) if query_radius2 is not None else None
    ones_q, ones_r = torch.ones(m, dtype=torch.float64, device=dev), torch.ones(n, dtype=torch.float64, device=dev)
    tests: list[_Test] = [(query_scale2 if query_scale2 is not None else ones_q, ref_radius2, True,
                           query_scale2 is None)]
    if query_radius2 is not None:
        tests.append((ref_scale2 if ref_scale2 is not None else ones_r, query_radius2, False, ref_scale2 is None))
    ambiguous = 0
    with full_precision():
        for rows in tiles(m, block_size):
            for cols in tiles(n, block_size):
                s = screen(query, rows, ref, cols)
                masks, near = _screen_tile(query, ref, s, rows, cols, tests)
                ambiguous += _settle(query, ref, s, rows, cols, tests, masks, near, strict)
                a8 = masks[0].view(torch.uint8)
                counts[rows] += a8.sum(1, dtype=torch.int32)
                covered[cols] |= a8.amax(0).bool()
                if inside is not None:
                    inside[cols] |= masks[1].view(torch.uint8).amax(0).bool()
    return BallStats(counts, covered, inside, ambiguous)


def _screen_tile(
    query: Points, ref: Points, s: Tensor, rows: slice, cols: slice, tests: list[_Test]
) -> tuple[list[Tensor], Tensor]:
    """Per test, the tile's pairs proven inside by a loose tile-wide bound on the screened `s`; and the pairs
    near a radius under that bound (for any test), which `_settle` decides."""
    coef, unit, dtype = bound_coef(query), UNIT[query.c.dtype], query.c.dtype
    masks, near = [], None
    rn_max = ref.norm[cols].max()
    for scale, radius, on_query, unit_scale in tests:
        sc = scale[rows, None] if on_query else scale[None, cols]
        rad = radius[None, cols] if on_query else radius[rows, None]
        if unit_scale:  # one loose tolerance for the tile: thresholds are plain vectors, no float temporary
            tol = (query.norm[rows].max() + rn_max).square() * coef + 32 * unit * rad.max()
            sure_in = s < (rad - tol).to(dtype)
            amb = (s <= (rad + tol).to(dtype)).logical_and_(~sure_in)
        else:  # one loose tolerance per row (largest norm, scale and radius of the tile)
            tol = (query.norm[rows] + rn_max).square() * coef * sc.amax(1) + 32 * unit * rad.amax(1)
            t = (s * sc.to(dtype)).sub_(rad.to(dtype))
            tol = tol.to(dtype)[:, None]
            sure_in = t < -tol
            amb = t.abs_() <= tol
        masks.append(sure_in)
        near = amb if near is None else near.logical_or_(amb)
    return masks, near


def _settle(
    query: Points, ref: Points, s: Tensor, rows: slice, cols: slice, tests: list[_Test], masks: list[Tensor],
    near: Tensor, strict: bool,
) -> int:
    """Decide the `near` pairs of a tile in `masks` (in place): by the per-pair bound on the float64 screened
    value, else exactly. Returns how many pairs needed the exact distance."""
    near_rows = near.view(torch.uint8).amax(1).nonzero().squeeze(1)  # u8 max: far cheaper than any()
    qi, ri = near[near_rows].nonzero(as_tuple=True)
    qi = near_rows[qi]
    if not qi.numel():
        return 0
    coef, unit = bound_coef(query), UNIT[query.c.dtype]
    gq, gr = qi + rows.start, ri + cols.start
    sp = s[qi, ri].double()
    band = (query.norm[gq] + ref.norm[gr]).square_().mul_(coef)
    todo = []
    for mask, (scale, radius, on_query, _) in zip(masks, tests, strict=True):
        sc = scale[gq] if on_query else scale[gr]
        rad = radius[gr] if on_query else radius[gq]
        t, tol = sp * sc - rad, band * sc + 32 * unit * rad
        mask[qi, ri] = t < -tol
        todo.append((t.abs() <= tol, mask, sc, rad))
    exact_needed = torch.stack([u for u, *_ in todo]).any(0)
    ambiguous = int(exact_needed.sum())
    if bool(exact_needed.any()):
        e = pairs_sq(query, gq[exact_needed], ref, gr[exact_needed])
        cmp = torch.lt if strict else torch.le
        for _, mask, sc, rad in todo:
            mask[qi[exact_needed], ri[exact_needed]] = cmp(e * sc[exact_needed], rad[exact_needed])
    return ambiguous
