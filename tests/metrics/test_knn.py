"""Exact chunked k-NN and ball counts: parity with prdc, with a float64 brute force, and
between tile sizes, on random data and on data built to defeat a float32 screen (ties, duplicates, offsets)."""

from __future__ import annotations

import numpy as np
import prdc as prdc_ref
import pytest
import torch

from framework.metrics import prdc
from framework.metrics.knn import ball_stats, knn, prepare, scan

torch.set_num_threads(1)


def brute_sq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Float64 Σ(a − b)², directly (no matmul), the reference the chunked code must equal."""
    return (a.double()[:, None, :] - b.double()[None, :, :]).square().sum(-1)


def brute_knn_kth(x: torch.Tensor, k: int, scale2: torch.Tensor | None = None, self_set: bool = True) -> torch.Tensor:
    d2 = brute_sq(x, x) if self_set else None
    if scale2 is not None:
        d2 = d2 * scale2[None, :]
    d2.fill_diagonal_(float("inf"))
    return d2.sort(1).values[:, k - 1]


@pytest.mark.parametrize("d", [2, 32, 256])
def test_raw_metrics_equal_prdc_compute_prdc_exactly(d, capsys):
    rng = np.random.default_rng(d)
    real = rng.standard_normal((500, d)).astype(np.float32)
    fake = (rng.standard_normal((400, d)) * 1.1 + 0.1).astype(np.float32)
    ref = prdc_ref.compute_prdc(real, fake, nearest_k=5)
    ours = prdc(real, fake, k=5)
    assert {key: ours[key] for key in ref} == {key: float(v) for key, v in ref.items()}


def test_chunked_and_dense_paths_agree_exactly():
    g = torch.Generator().manual_seed(1)
    real, fake = torch.randn(300, 48, generator=g), torch.randn(260, 48, generator=g) * 1.05
    dense = prdc(real, fake, k=4, block_size=10_000)
    for tile in (29, 64, 299):
        assert prdc(real, fake, k=4, block_size=tile) == dense


def _adversarial() -> torch.Tensor:
    """Two far clusters (|x| ~ 1e3, spreads ~1e-2: float32 cancellation), exact duplicates, and a grid with ties."""
    g = torch.Generator().manual_seed(0)
    far = torch.cat([1000 + 0.01 * torch.randn(60, 8, generator=g), -1000 + 0.01 * torch.randn(60, 8, generator=g)])
    dups = torch.randn(10, 8, generator=g).repeat(4, 1)
    grid = torch.stack(torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1).reshape(16, 2)
    grid = torch.cat([grid, torch.zeros(16, 6)], 1)
    return torch.cat([far, dups, grid])


@pytest.mark.parametrize("tile", [13, 1024])
def test_knn_radius_equals_float64_brute_force_on_adversarial_data(tile):
    x = _adversarial()
    p = prepare(x, x.double().mean(0))
    n = len(x)
    for k in (1, 3, 7):
        got = knn(p, p, k, self_index=torch.arange(n), block_size=tile)
        assert torch.equal(got.values[:, -1], brute_knn_kth(x, k))
        d2 = brute_sq(x, x)
        # the returned neighbours are truly the k nearest: their exact distances are ≤ the k-th value
        assert bool((d2.gather(1, got.index) <= got.values[:, -1:]).all())
        assert not bool((got.index == torch.arange(n)[:, None]).any())  # self excluded by index


def test_scaled_knn_ranks_by_scaled_distance_exactly():
    x = _adversarial()
    g = torch.Generator().manual_seed(3)
    scale2 = torch.rand(len(x), generator=g, dtype=torch.float64) + 0.5
    p = prepare(x, x.double().mean(0))
    got = knn(p, p, 4, self_index=torch.arange(len(x)), col_scale2=scale2, block_size=16)
    assert torch.equal(got.values[:, -1], brute_knn_kth(x, 4, scale2))


@pytest.mark.parametrize("strict", [True, False])
def test_ball_stats_equal_brute_force_with_scales_and_both_comparisons(strict):
    x = _adversarial()
    g = torch.Generator().manual_seed(5)
    y = torch.cat([x[::3] + 1e-3 * torch.randn(x[::3].shape, generator=g), x[:20]])  # near-ties and duplicates
    center = x.double().mean(0)
    px, py = prepare(x, center), prepare(y, center)
    rx = brute_knn_kth(x, 3)
    ry = brute_knn_kth(y, 3)
    sy = torch.rand(len(y), generator=g, dtype=torch.float64) + 0.5
    sx = torch.rand(len(x), generator=g, dtype=torch.float64) + 0.5
    got = ball_stats(py, px, rx, ry, query_scale2=sy, ref_scale2=sx, strict=strict, block_size=9)
    d2 = brute_sq(y, x)  # (M, N)
    cmp = torch.lt if strict else torch.le
    a = cmp(d2 * sy[:, None], rx[None, :])
    b = cmp(d2 * sx[None, :], ry[:, None])
    assert torch.equal(got.counts, a.sum(1))
    assert torch.equal(got.covered, a.any(0))
    assert torch.equal(got.inside, b.any(0))


def test_identical_constant_features_give_zero_with_strict_and_one_with_le():
    # prdc issue #7: radius 0 and a strict '<' make identical features score 0; Kynkäänniemi's '<=' scores 1
    x = torch.ones(20, 4)
    strict, le = prdc(x, x.clone(), k=3), prdc(x, x.clone(), k=3, strict=False)
    assert [strict[m] for m in ("precision", "recall", "density", "coverage")] == [0.0, 0.0, 0.0, 0.0]
    assert [le[m] for m in ("precision", "recall", "coverage")] == [1.0, 1.0, 1.0]
    assert le["density"] == pytest.approx(20 / 3)  # every fake lies in all 20 real balls


def test_scan_returns_screened_width_lists_and_dense_matrix():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(50, 6, generator=g)
    p = prepare(x, x.double().mean(0))
    out = scan(p, p, 3, self_index=torch.arange(50), width=10, dense=True, block_size=16)
    d2 = brute_sq(x, x).fill_diagonal_(float("inf"))
    ref = d2.sort(1)
    torch.testing.assert_close(out.approx.values, ref.values[:, :10], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.dense, d2, rtol=1e-5, atol=1e-5)


def test_bad_inputs_name_the_value_and_what_is_valid():
    x = torch.randn(10, 3)
    with pytest.raises(ValueError, match=r"correction='gicdmm' is not one of 'none', 'icdm', 'gicdm_reconstructed'"):
        prdc(x, x, k=3, correction="gicdmm")
    with pytest.raises(ValueError, match=r"k=10 must be in 1\.\.9"):
        prdc(x, x, k=10)
    with pytest.raises(ValueError, match="real features have 3 dims but fake features have 4"):
        prdc(x, torch.randn(10, 4), k=3)
    with pytest.raises(ValueError, match="NaN"):
        prdc(x, x.clone().fill_(float("nan")), k=3)
