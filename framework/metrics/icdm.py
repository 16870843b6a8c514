"""ICDM (Jégou et al., CVPR 2007 / TPAMI 2010) and hubness diagnostics (Radovanović et al., JMLR 2010).

ICDM rescales distances as d'(i, j) = δ_i δ_j d(i, j) and updates δ in the spirit of Sinkhorn scaling until every
point's k-NN neighbourhood has the same mean radius: δ_i ← δ_i (r̄ / r_i)^α with r_i the mean corrected distance
to i's k nearest neighbours (recomputed each iteration) and r̄ their geometric mean. α = 0.5, one iteration, is
the non-iterative CDM. The neighbours are recomputed every iteration, exactly from the points (`ExactGraph`: the
same neighbours and float64 distances whether a screened N×N matrix is cached or tiled passes are made), from a
given (N, N) matrix of raw d², or from the C nearest raw neighbours of each point (the candidate graph: memory
N·C, approximate when a corrected neighbour lies outside, so only on explicit request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from framework.metrics.knn import KNN, Points, knn, knn_from_screened, rerank, with_exact_values


@dataclass
class ExactGraph:
    """The points themselves: each iteration finds the exact k-NN under d' (proven by the screening bound, every
    distance then recomputed in float64), over the cached screened matrix `screened` when given (memory N², no
    matmul per iteration) or by tiled passes (memory O(tile·N)). Both give identical results.

    Tiled: a full pass keeps each row's `width` nearest (exact raw d²) and the next scaled value, a lower bound
    for every other point. While δ moves little, later iterations re-rank those lists, and a row is certified
    when its k-th value stays below the bound times the smallest change of δ²; only the rows that are not
    certified are rescanned, and a new full pass is made when more than a quarter of them fail."""

    points: Points
    screened: Tensor | None = None
    block_size: int | None = None
    width: int = 64
    _lists: KNN | None = field(default=None, repr=False)  # exact raw d² of each row's `width` nearest at the pass
    _bound: Tensor | None = field(default=None, repr=False)  # the pass's next scaled value per row
    _scale2: Tensor | None = field(default=None, repr=False)  # δ² at the pass

    def neighbours(self, scale2: Tensor, k: int) -> KNN:
        p, own = self.points, torch.arange(len(self.points), device=scale2.device)
        if self.screened is None:
            return self._tiled(scale2, k, own)
        nn_t = knn_from_screened(p, p, k, self.screened, self_index=own, col_scale2=scale2, block_size=self.block_size)
        return with_exact_values(p, p, nn_t, scale2)

    def _tiled(self, scale2: Tensor, k: int, own: Tensor) -> KNN:
        p, width = self.points, min(self.width, len(self.points) - 2)
        if width <= k:
            return knn(p, p, k, self_index=own, col_scale2=scale2, block_size=self.block_size)
        for fresh in (False, True):
            if fresh or self._lists is None:  # a full pass: the width + 1 nearest under the current δ
                full = knn(p, p, width + 1, self_index=own, col_scale2=scale2, block_size=self.block_size)
                self._lists = with_exact_values(p, p, KNN(full.values[:, :width], full.index[:, :width]))
                self._bound, self._scale2 = full.values[:, -1], scale2
            change = float((scale2 / self._scale2).min()) * (1 - 1e-9)  # no other point came closer than this
            scaled = self._lists.values * scale2[self._lists.index]
            top, order = scaled.topk(k, dim=1, largest=False, sorted=True)
            failed = (top[:, -1] >= self._bound * change).nonzero().squeeze(1)
            if fresh or 4 * failed.numel() <= len(p):
                break
        index = self._lists.index.gather(1, order)  # the lists hold exact d²: `top` is exact already
        if failed.numel():
            sub = knn(p.subset(failed), p, k, self_index=failed, col_scale2=scale2, block_size=self.block_size)
            sub = with_exact_values(p, p, KNN(sub.values, sub.index), scale2, rows=failed)
            top[failed], index[failed] = sub.values, sub.index
        return KNN(top, index)


@dataclass
class ICDMResult:
    """Factors δ (N,) with geometric mean 1, the k-NN graph under the corrected metric, and convergence facts."""

    delta: Tensor
    rbar: float  # geometric mean of the corrected mean k-NN radii at the returned δ
    neighbours: KNN  # values: δ_j²·d²(i, j) of i's k nearest under d' (δ_i left out), ascending
    iterations: int
    converged: bool
    history: list[float] = field(default_factory=list)  # S_t = mean |r_i - r̄| / r̄ per iteration


def icdm(
    graph: ExactGraph | Tensor | KNN,
    k: int,
    *,
    alpha: float = 0.5,
    max_iter: int = 50,
    tol: float = 1e-4,
) -> ICDMResult:
    """Iterate δ on `graph`: the points (`ExactGraph`), an (N, N) tensor of raw d² with +inf on the diagonal, or
    candidate lists (KNN of raw d², self excluded, ≥ k columns; approximate). Stops when S_t ≤ `tol` (converged),
    when S_t stops decreasing (the best δ so far is kept), or after `max_iter` updates."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1] (0.5 reproduces CDM)")
    if max_iter < 0:
        raise ValueError(f"max_iter={max_iter} must be ≥ 0")
    ref = graph.points.x if isinstance(graph, ExactGraph) else graph if isinstance(graph, Tensor) else graph.values
    n, device = ref.shape[0], ref.device
    delta = torch.ones(n, dtype=torch.float64, device=device)
    history: list[float] = []
    best: tuple[float, Tensor, float, KNN] | None = None
    converged = False
    while True:
        nn_t = corrected_neighbours(graph, delta, k)
        r = delta * nn_t.values.sqrt().mean(1)
        rbar = float(r.log().mean().exp())
        spread = float((r - rbar).abs().mean() / rbar)
        history.append(spread)
        if best is None or spread < best[0]:
            best = (spread, delta, rbar, nn_t)
        if spread <= tol:
            converged = True
            break
        if (len(history) > 1 and spread >= history[-2]) or len(history) > max_iter:
            break  # stalled (neighbour sets cycle) or out of iterations: keep the best factors seen
        delta = delta * (rbar / r) ** alpha
    _, delta, rbar, nn_t = best
    return ICDMResult(delta, rbar, nn_t, len(history) - 1, converged, history)


def corrected_neighbours(graph: ExactGraph | Tensor | KNN, delta: Tensor, k: int) -> KNN:
    """Each point's k nearest under δ_i δ_j d(i, j) (values δ_j² d², δ_i left out), from the points, a dense matrix
    or a candidate graph."""
    scale2 = delta.square()
    if isinstance(graph, ExactGraph):
        return graph.neighbours(scale2, k)
    if isinstance(graph, KNN):
        return rerank(graph, scale2, k)
    top, index = (graph * scale2[None, :]).topk(k, dim=1, largest=False, sorted=True)
    return KNN(top, index)


def k_occurrence(index: Tensor, n: int) -> Tensor:
    """N_k(x): how many k-NN lists (rows of `index`, (N, k)) contain each of the n points."""
    return torch.bincount(index.reshape(-1), minlength=n)


def hubness(index: Tensor, n: int | None = None) -> dict[str, float]:
    """Hubness of a k-NN graph: k-occurrence skewness S_Nk, Robin-Hood index, hub and antihub fractions.

    Hubs have N_k > 2k and antihubs N_k = 0 (scikit-hubness conventions)."""
    k = index.shape[1]
    counts = k_occurrence(index, n or index.shape[0]).double()
    centred = counts - counts.mean()
    std = centred.square().mean().sqrt()
    skew = float(centred.pow(3).mean() / std.pow(3)) if std > 0 else 0.0
    robin_hood = float(centred.abs().sum() / (2 * counts.sum())) if counts.sum() > 0 else 0.0
    return {
        "skewness": skew,
        "robin_hood": robin_hood,
        "hub_fraction": float((counts > 2 * k).double().mean()),
        "antihub_fraction": float((counts == 0).double().mean()),
    }
