"""The screening primitives shared by the k-NN (`framework.metrics.knn`) and ball (`framework.metrics.balls`)
passes: prepared point sets, tiles, the screened tile d² and its error bound, and the exact float64 d².

A tile's d² is screened with one matmul in the compute dtype under the bound |s − d²| ≤ (γ_D + 48u)(|a| + |b|)²
(`bound_coef` · the squared norm sum); pairs the bound cannot decide are recomputed by `pairs_sq` in float64.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

#: unit round-off of the screening dtypes
UNIT = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
#: default tile edge: a 1024×1024 float32 tile is 4 MiB and stays in cache for the passes after the matmul
TILE = 1024


@dataclass
class Points:
    """A point set prepared for screening: `x` as given (exact work upcasts it), a centred compute-dtype copy
    `c`, its squared norms `sq`, and `norm` (an upper estimate of |c| in float64, for the error bound)."""

    x: Tensor
    c: Tensor
    sq: Tensor
    norm: Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def dim(self) -> int:
        return self.x.shape[1]

    def subset(self, rows: Tensor) -> Points:
        return Points(self.x[rows], self.c[rows], self.sq[rows], self.norm[rows])


def prepare(x: Tensor, center: Tensor | None = None, dtype: torch.dtype | None = None) -> Points:
    """Screening copy of `x` (N, D), centred on `center` (distances do not change; cancellation does)."""
    if x.ndim != 2:
        raise ValueError(f"features must be a 2-D (points, dims) tensor, got shape {tuple(x.shape)}")
    dtype = dtype or (torch.float64 if x.dtype == torch.float64 else torch.float32)
    if dtype not in UNIT:
        raise ValueError(f"screening dtype must be float32 or float64, got {dtype}")
    c = x.to(dtype)
    if center is not None:
        c = c - center.to(device=x.device, dtype=dtype)
    sq = torch.cat([part.square().sum(1) for part in c.split(4096)]) if len(c) else c.new_zeros(0)
    return Points(x, c, sq, sq.double().sqrt() * (1 + (x.shape[1] + 4) * UNIT[dtype]))


def bound_coef(p: Points) -> float:
    """The screening error bound's factor (γ_D + 48u, with margin) for `p`'s dimension and compute dtype."""
    return (p.dim + 48) * UNIT[p.c.dtype] * 1.1


def tiles(n: int, tile: int | None) -> list[slice]:
    """Consecutive slices of at most `tile` (default `TILE`) covering 0..n."""
    step = max(1, tile or TILE)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Plain IEEE float32 matmuls (no TF32/bf16 shortcuts), which the screening error bound assumes."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def screen(q: Points, rows: slice, r: Points, cols: slice) -> Tensor:
    """Approximate d² of a tile: |a|² + |b|² − 2 a·b in the compute dtype."""
    return torch.addmm(q.sq[rows, None] + r.sq[None, cols], q.c[rows], r.c[cols].T, alpha=-2.0)


def exact_sq(a: Tensor, b: Tensor, chunk_elements: int = 2**18) -> Tensor:
    """Row-wise Σ(a_p − b_p)² in float64 for matching rows of `a` and `b` (P, D): the reference values."""
    out = torch.empty(a.shape[0], dtype=torch.float64, device=a.device)
    step = max(1, chunk_elements // max(a.shape[1], 1))
    for i in range(0, a.shape[0], step):
        out[i : i + step] = (a[i : i + step].double() - b[i : i + step].double()).square_().sum(1)
    return out


def pairs_sq(q: Points, qi: Tensor, r: Points, ri: Tensor) -> Tensor:
    """Exact d² for the index pairs (qi[p], ri[p])."""
    out = torch.empty(qi.shape[0], dtype=torch.float64, device=q.x.device)
    step = max(1, 2**20 // max(q.dim, 1))
    for i in range(0, qi.shape[0], step):
        out[i : i + step] = exact_sq(q.x[qi[i : i + step]], r.x[ri[i : i + step]])
    return out
