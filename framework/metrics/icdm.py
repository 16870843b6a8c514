"""ICDM (Jégou et al., CVPR 2007 / TPAMI 2010) and hubness diagnostics (Radovanović et al., JMLR 2010).

ICDM rescales distances as d'(i, j) = δ_i δ_j d(i, j) and updates δ in the spirit of Sinkhorn scaling until every
point's k-NN neighbourhood has the same mean radius: δ_i ← δ_i (r̄ / r_i)^α with r_i the mean corrected distance
to i's k nearest neighbours (recomputed each iteration) and r̄ their geometric mean. α = 0.5, one iteration, is
the non-iterative CDM. The neighbours are recomputed every iteration from a graph of raw squared distances: the
dense (N, N) matrix (exact ICDM; memory N², for moderate N), or the C nearest raw neighbours of each point
(the candidate-graph variant for large N: memory N·C, approximate when a corrected neighbour lies outside).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from framework.metrics.knn import KNN, rerank


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
    graph: Tensor | KNN,
    k: int,
    *,
    alpha: float = 0.5,
    max_iter: int = 50,
    tol: float = 1e-4,
) -> ICDMResult:
    """Iterate δ on `graph`: an (N, N) tensor of raw d² with +inf on the diagonal, or candidate lists (KNN of raw
    d², self excluded, ≥ k columns). Stops when S_t ≤ `tol` (converged), when S_t stops decreasing (the best δ so
    far is kept), or after `max_iter` updates."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1] (0.5 reproduces CDM)")
    if max_iter < 0:
        raise ValueError(f"max_iter={max_iter} must be ≥ 0")
    n = graph.shape[0] if isinstance(graph, Tensor) else graph.values.shape[0]
    device = graph.device if isinstance(graph, Tensor) else graph.values.device
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


def corrected_neighbours(graph: Tensor | KNN, delta: Tensor, k: int) -> KNN:
    """Each point's k nearest under δ_i δ_j d(i, j) (values δ_j² d², δ_i left out), from a dense or candidate graph."""
    scale2 = delta.square()
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
