"""Newton–Schulz NS5: singular-value band, invariances, shapes, dtypes."""

from __future__ import annotations

import pytest
import torch

from framework.optim import newton_schulz5

torch.set_num_threads(1)


def _with_spectrum(rows: int, cols: int, s: torch.Tensor, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, len(s), generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, len(s), generator=gen, dtype=torch.float64))
    return ((u * s) @ v.T).float()


def _svals(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(x.double())


@pytest.mark.parametrize("shape", [(256, 256), (512, 128), (128, 512)])
@pytest.mark.parametrize(("dtype", "lo", "hi"), [(torch.float32, 0.68, 1.21), (torch.bfloat16, 0.67, 1.22)])
def test_ns5_maps_every_singular_value_above_2e_3_of_the_norm_into_the_band(shape, dtype, lo, hi):
    k = min(shape)
    s = torch.logspace(0, -1.2, k, dtype=torch.float64)
    assert (s / s.norm()).min() >= 2e-3  # the band only holds for σ/‖G‖_F ≥ 1.5e-3
    sv = _svals(newton_schulz5(_with_spectrum(*shape, s), dtype=dtype))
    assert len(sv) == k
    assert lo <= sv.min() and sv.max() <= hi, (sv.min().item(), sv.max().item())


def test_ns5_does_not_lift_singular_values_far_below_the_threshold():
    s = torch.cat([torch.ones(63, dtype=torch.float64), torch.tensor([1e-6], dtype=torch.float64)])
    sv = _svals(newton_schulz5(_with_spectrum(64, 96, s), dtype=torch.float32))
    assert sv.min() < 0.01 and sv[:63].min() > 0.68


@pytest.mark.parametrize("shape", [(3072, 768), (1024, 4096)])
def test_ns5_on_gaussian_matrices_lands_in_0_68_to_1_15_with_mean_near_0_94(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    sv = _svals(newton_schulz5(g, dtype=torch.float32))
    assert 0.68 <= sv.min() and sv.max() <= 1.15, (sv.min().item(), sv.max().item())
    assert 0.93 <= sv.mean() <= 0.96, sv.mean().item()


def test_ns5_in_bf16_on_a_gaussian_matrix_stays_in_the_band():
    g = torch.randn(768, 192, generator=torch.Generator().manual_seed(2))
    out = newton_schulz5(g)
    assert out.dtype == torch.bfloat16
    sv = _svals(out.float())  # bf16 rounding widens the fp32 band slightly (measured [0.6796, 1.1365])
    assert 0.67 <= sv.min() and sv.max() <= 1.15, (sv.min().item(), sv.max().item())


def test_ns5_of_the_transpose_is_the_transpose():
    g = torch.randn(384, 128, generator=torch.Generator().manual_seed(3))
    a = newton_schulz5(g, dtype=torch.float32)
    b = newton_schulz5(g.T.contiguous(), dtype=torch.float32)
    assert a.shape == (384, 128) and b.shape == (128, 384)
    assert (a - b.T).abs().max() <= 1e-6


@pytest.mark.parametrize("c", [1e-3, 1e3])
def test_ns5_is_invariant_to_positive_rescaling_of_its_input(c):
    g = torch.randn(384, 128, generator=torch.Generator().manual_seed(4))
    ref = newton_schulz5(g, dtype=torch.float32)
    assert (newton_schulz5(c * g, dtype=torch.float32) - ref).abs().max() <= 1e-5


def test_ns5_runs_torch_optim_muons_iteration_bit_for_bit_in_bf16():
    muon_ns = pytest.importorskip("torch.optim._muon")._zeropower_via_newtonschulz
    for shape in [(96, 64), (64, 96)]:
        gen = torch.Generator().manual_seed(5)
        # the two take the Frobenius norm differently (ours over dims (-2, -1) plus eps, theirs whole and clamped), so
        # on a Gaussian G it may round apart on some CPU. Signs with 4096 nonzeros have ‖G‖_F = 64 in any summation
        # order: both divide by exactly 64, then run the same addmm/matmul calls on the same bf16 X
        g = torch.randn(*shape, generator=gen).sign()
        g.view(-1)[torch.randperm(g.numel(), generator=gen)[:2048]] = 0
        theirs = muon_ns(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)
        assert torch.equal(newton_schulz5(g), theirs)


def test_ns5_treats_leading_dims_as_a_batch_of_independent_matrices():
    g = torch.randn(2, 3, 40, 24, generator=torch.Generator().manual_seed(6))
    out = newton_schulz5(g, dtype=torch.float32)
    assert out.shape == g.shape
    for i in range(2):
        for j in range(3):
            assert torch.allclose(out[i, j], newton_schulz5(g[i, j], dtype=torch.float32), atol=1e-6)


def test_ns5_of_zero_is_zero_and_zero_rows_stay_exactly_zero():
    assert torch.equal(newton_schulz5(torch.zeros(16, 32), dtype=torch.float32), torch.zeros(16, 32))
    g = torch.randn(64, 128, generator=torch.Generator().manual_seed(7))
    g[0] = 0
    out = newton_schulz5(g)
    assert torch.count_nonzero(out[0]) == 0 and torch.count_nonzero(out[1:]) == out[1:].numel()


def test_ns5_returns_the_compute_dtype_and_none_keeps_the_input_dtype():
    g = torch.randn(8, 4, dtype=torch.float64)
    assert newton_schulz5(g).dtype == torch.bfloat16
    assert newton_schulz5(g, dtype=None).dtype == torch.float64


@pytest.mark.parametrize(
    ("g", "steps", "match"), [(torch.ones(5), 5, "ndim >= 2"), (torch.ones(3, 3), 0, "steps")]
)
def test_ns5_rejects_vectors_and_fewer_than_one_step(g, steps, match):
    with pytest.raises(ValueError, match=match):
        newton_schulz5(g, steps=steps)
