"""Precision, recall (Kynkäänniemi et al. 2019), density, coverage (Naeem et al. 2020), raw or hubness-corrected.

`correction="none"` (the default everywhere) equals `prdc.compute_prdc` (strict `<`, radius = distance to the k-th
neighbour, self excluded). Corrections rescale distances as d'(a, b) = δ_a δ_b d(a, b) and recompute every radius
under d'; they are opt-in:

* `icdm`: ICDM factors δ_x on the real set; generated points keep δ_y = 1 (only the reals are corrected).
* `gicdm_reconstructed`: **our reconstruction** of GICDM (Salvy, Talbot, Thirion, arXiv 2602.16449), whose algorithm
  text was not available; it is not the paper's method and it over-corrects clearly different sets (docs/gicdm.md),
  so using it warns once per process (`ReconstructionWarning`). Real factors by ICDM; each generated point gets the
  out-of-sample ICDM fixed point from real data only, δ_y = (r̄ / s_k(y))^β with s_k(y) the mean of its k smallest
  δ_x d(x, y), clamped to the real δ range; a multi-scale filter leaves true outliers uncorrected (δ_y = 1): y is an
  outlier when its mean raw distance to its K nearest reals exceeds the q-quantile of the same leave-one-out
  statistic over reals, at any K ∈ k·`filter_scales`. Generated points never influence the real factors.

ICDM's neighbours are exact at every N (`neighbours="exact"`); the candidate graph is an explicit approximation
(`neighbours="approx_graph"`) and the result says which ran.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from framework.metrics.balls import BallStats, ball_stats
from framework.metrics.icdm import ExactGraph, ICDMResult, hubness, icdm
from framework.metrics.knn import KNN, Scan, knn, scan
from framework.metrics.screening import Points, prepare

CORRECTIONS = ("none", "icdm", "gicdm_reconstructed")
NEIGHBOURS = ("exact", "approx_graph")
#: the reals' k-occurrence skewness S_Nk on the raw distances, and after the correction (present only when one ran)
SKEWNESS = "real_k_occurrence_skewness"
SKEWNESS_CORRECTED = SKEWNESS + "_corrected"
_warned = False  # the reconstruction warns once per process


class ReconstructionWarning(UserWarning):
    """`correction="gicdm_reconstructed"` is our reconstruction of GICDM, not the paper's algorithm."""


def check_correction(correction: str) -> str:
    """`correction` if valid; the old name 'gicdm' gets an error naming its replacement. Warns once per process
    when the reconstruction is chosen."""
    global _warned
    valid = ", ".join(map(repr, CORRECTIONS))
    if correction == "gicdm":
        raise ValueError(
            "correction='gicdm' is not available: the GICDM paper's algorithm is not implemented here. Our "
            "reconstruction of it, which over-corrects clearly different sets (docs/gicdm.md), is opt-in as "
            f"correction='gicdm_reconstructed'; the default 'none' gives the raw metrics. Valid: {valid}"
        )
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r} is not one of {valid}")
    if correction == "gicdm_reconstructed" and not _warned:
        _warned = True
        warnings.warn(
            "correction='gicdm_reconstructed' is our reconstruction of GICDM (arXiv 2602.16449), not the paper's "
            "algorithm, and it over-corrects: on clearly different sets (N(0, I) vs N(5·e1, I), d = 512) it raises "
            "precision from .386 (raw) to .919 (docs/gicdm_eval/gicdm_ladder.md); read docs/gicdm.md before "
            "reporting it",
            ReconstructionWarning,
            stacklevel=3,
        )
    return correction


def as_features(x: Any, name: str) -> Tensor:
    """A 2-D floating tensor from a tensor or array (float64 is kept; other types become float32)."""
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x)
    if t.ndim != 2:
        raise ValueError(f"{name} features must be 2-D (points, dims), got shape {tuple(t.shape)}")
    if t.dtype != torch.float64:
        t = t.float()
    if t.numel() and not (bool(torch.isfinite(t.amax())) and bool(torch.isfinite(t.amin()))):  # NaN propagates
        raise ValueError(f"{name} features contain NaN or inf values")
    return t


@dataclass(frozen=True)
class PRDCOptions:
    """`prdc`'s keyword options in one value, for its helpers (see `prdc` for each one's meaning)."""

    strict: bool = True
    neighbours: str = "exact"
    alpha: float = 0.5
    max_iter: int = 50
    tol: float = 1e-4
    beta: float = 1.0
    filter_scales: tuple[int, ...] = (1, 2, 4, 8)
    filter_quantile: float = 0.99
    candidates: int | None = None
    dense_max: int = 4096
    block_size: int | None = None
    return_factors: bool = False


def prdc(
    real: Any,
    fake: Any,
    k: int = 5,
    correction: str = "none",
    *,
    strict: bool = True,
    neighbours: str = "exact",
    alpha: float = 0.5,
    max_iter: int = 50,
    tol: float = 1e-4,
    beta: float = 1.0,
    filter_scales: tuple[int, ...] = (1, 2, 4, 8),
    filter_quantile: float = 0.99,
    candidates: int | None = None,
    dense_max: int = 4096,
    block_size: int | None = None,
    return_factors: bool = False,
) -> dict[str, Any]:
    """P/R/D/C of `fake` against `real` (N, D) and (M, D) features, plus the real set's k-occurrence skewness
    (`real_k_occurrence_skewness`, on the raw distances) and, when a correction ran, after it
    (`real_k_occurrence_skewness_corrected`; absent under `correction="none"`). `strict=False` uses Kynkäänniemi's
    `<=`; `block_size` is the tile edge (None: 1024; ≥ N is the dense path, with identical results). ICDM: `alpha`,
    `max_iter`, `tol`; `neighbours="exact"` finds the exact corrected k-NN each iteration, over a cached screened N×N
    matrix up to `dense_max` real points (memory) and by tiled passes beyond (time), with identical results;
    `"approx_graph"` re-ranks the `candidates` (default 64) nearest raw neighbours (memory N·C, approximate).
    Reconstruction: `beta`, `filter_scales`, `filter_quantile`."""
    check_correction(correction)  # called here, so that its warning points at prdc's caller
    options = PRDCOptions(strict=strict, neighbours=neighbours, alpha=alpha, max_iter=max_iter, tol=tol, beta=beta,
                          filter_scales=filter_scales, filter_quantile=filter_quantile, candidates=candidates,
                          dense_max=dense_max, block_size=block_size, return_factors=return_factors)
    return _prdc(real, fake, k, correction, options)


def _checked_features(real: Any, fake: Any, k: int, o: PRDCOptions) -> tuple[Tensor, Tensor]:
    """The two feature sets as tensors on real's device, after every check of the inputs and options."""
    if o.neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours={o.neighbours!r} is not one of {', '.join(map(repr, NEIGHBOURS))}")
    approx = o.neighbours == "approx_graph"
    if o.candidates is not None and (not approx or o.candidates < k):
        raise ValueError(f"candidates={o.candidates} applies only to neighbours='approx_graph' (got {o.neighbours!r})"
                         f" and must be >= k={k}")
    real, fake = as_features(real, "real"), as_features(fake, "fake").to(real.device)
    if real.shape[1] != fake.shape[1]:
        raise ValueError(f"real features have {real.shape[1]} dims but fake features have {fake.shape[1]}")
    n, m = real.shape[0], fake.shape[0]
    if min(n, m) < 2:
        raise ValueError(f"k={k} needs at least {k + 1} real and {k + 1} fake points; got {n} real and {m} fake"
                         " (a set of fewer than 2 points has no neighbours)")
    if not 0 < k < min(n, m):
        raise ValueError(f"k={k} must be in 1..{min(n, m) - 1} (fewer than the {n} real and {m} fake points)")
    if not o.filter_scales or min(o.filter_scales) < 1 or not 0 < o.filter_quantile <= 1:
        raise ValueError(f"filter_scales={o.filter_scales} must be ≥ 1 and filter_quantile={o.filter_quantile} in"
                         " (0, 1]")
    return real, fake


def _prdc(real: Any, fake: Any, k: int, correction: str, o: PRDCOptions) -> dict[str, Any]:
    """`prdc` once `correction` is checked: the real set's one scan, the radii (raw or corrected), the statistics."""
    real, fake = _checked_features(real, fake, k, o)
    n, m = real.shape[0], fake.shape[0]
    dtype = torch.float64 if torch.float64 in (real.dtype, fake.dtype) else torch.float32
    center = real.mean(0, dtype=torch.float64)
    x, y = prepare(real, center, dtype), prepare(fake, center, dtype)
    approx, gicdm = o.neighbours == "approx_graph", correction == "gicdm_reconstructed"
    cache = correction != "none" and not approx and n <= o.dense_max
    width = 0
    if correction != "none":
        width = max(k * max(o.filter_scales) if gicdm else 0, (o.candidates or 64) if approx else 0)
    real_scan = scan(x, x, k, self_index=torch.arange(n, device=real.device), width=min(width, n - 1), dense=cache,
                     block_size=o.block_size)
    skew = hubness(real_scan.exact.index, n)["skewness"]
    out: dict[str, Any] = {"correction": correction, "k": k}
    if correction == "none":
        fake_nn = knn(y, y, k, self_index=torch.arange(m, device=real.device), block_size=o.block_size)
        stats = ball_stats(y, x, real_scan.exact.values[:, -1], fake_nn.values[:, -1], strict=o.strict,
                           block_size=o.block_size)
        skew_after, dx, dy = None, None, None
    else:
        stats, skew_after, dx, dy = _corrected_stats(x, y, real_scan, k, correction, width, o, out)
    out.update(
        precision=int((stats.counts > 0).sum()) / m,
        recall=int(stats.inside.sum()) / n,
        density=(1.0 / k) * (int(stats.counts.sum()) / m),
        coverage=int(stats.covered.sum()) / n,
    )
    out[SKEWNESS] = skew
    if skew_after is not None:
        out[SKEWNESS_CORRECTED] = skew_after
    if o.return_factors:
        out["delta_real"], out["delta_fake"] = dx, dy
    return out


def _corrected_stats(
    x: Points, y: Points, real_scan: Scan, k: int, correction: str, width: int, o: PRDCOptions, out: dict[str, Any]
) -> tuple[BallStats, float, Tensor, Tensor]:
    """Ball statistics under the corrected metric d': ICDM on the real set, then the generated factors (ones, or
    the reconstruction's). Adds the ICDM diagnostics to `out`; returns the stats, the corrected real skewness and
    the factors δ_x, δ_y."""
    n, m, approx = len(x), len(y), o.neighbours == "approx_graph"
    n_cand, gicdm = o.candidates or 64, correction == "gicdm_reconstructed"
    graph = real_scan.approx if approx else ExactGraph(x, real_scan.dense, o.block_size)
    if approx and width > n_cand:  # the filter's wider lists: re-rank only the first C
        graph = KNN(graph.values[:, :n_cand], graph.index[:, :n_cand])
    res = icdm(graph, k, alpha=o.alpha, max_iter=o.max_iter, tol=o.tol)
    real_scan.dense = None
    dx = res.delta
    skew_after = hubness(res.neighbours.index, n)["skewness"]
    out.update(neighbours=o.neighbours, icdm_iterations=res.iterations, icdm_converged=res.converged,
               icdm_spread=res.history[-1], delta_real_min=float(dx.min()), delta_real_max=float(dx.max()))
    if gicdm:
        dy, outlier = generated_factors(x, y, real_scan.approx, res, k, beta=o.beta, scales=o.filter_scales,
                                        quantile=o.filter_quantile, block_size=o.block_size)
        out["filtered_fraction"] = float(outlier.double().mean())
    else:
        dy = torch.ones(m, dtype=torch.float64, device=x.x.device)
    fake_nn = knn(y, y, k, self_index=torch.arange(m, device=x.x.device), col_scale2=dy.square() if gicdm else None,
                  block_size=o.block_size)
    # radii under d': real ρ_x = δ_{x(k)} d(x, x(k)) (δ_x cancels in the ball test), fake ρ_y likewise
    stats = ball_stats(y, x, res.neighbours.values[:, -1], fake_nn.values[:, -1], query_scale2=dy.square(),
                       ref_scale2=dx.square(), strict=o.strict, block_size=o.block_size)
    return stats, skew_after, dx, dy


def generated_factors(
    x: Points,
    y: Points,
    real_nn: KNN,
    res: ICDMResult,
    k: int,
    *,
    beta: float = 1.0,
    scales: tuple[int, ...] = (1, 2, 4, 8),
    quantile: float = 0.99,
    block_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Reconstruction: δ_y from real data only, clamped to the real δ range; multi-scale outliers get 1.

    `real_nn`: each real point's raw leave-one-out neighbours, ≥ k·max(scales) columns unless N is smaller.
    Returns δ_y (M,) and the outlier mask."""
    width = min(k * max(scales), len(x))
    to_real = scan(y, x, k, col_scale2=res.delta.square(), width=width, block_size=block_size)
    s_k = to_real.exact.values.sqrt().mean(1)  # mean of the k smallest δ_x d(x, y)
    delta = ((res.rbar / s_k) ** beta).clamp(float(res.delta.min()), float(res.delta.max()))
    outlier = torch.zeros(len(y), dtype=torch.bool, device=delta.device)
    real_d, fake_d = real_nn.values.sqrt(), to_real.approx.values.sqrt()
    for scale in sorted(set(scales)):
        kk = min(k * scale, real_d.shape[1], fake_d.shape[1])
        tau = torch.quantile(real_d[:, :kk].mean(1), quantile)
        outlier |= fake_d[:, :kk].mean(1) > tau
    delta[outlier] = 1.0
    return delta, outlier
