"""`GICDM.forward` in torchmetrics' `MetricTester` pattern, with the real features kept across `reset()`.

A fixed set of batches goes through `forward` one at a time; each batch's output must equal the functional
reference on that batch against the kept reals, and the final `compute()` the reference on everything seen. The
reference is the `prdc` package (`prdc.compute_prdc`) for P/R/D/C and `framework.metrics.prdc` for every key.
Regression: `forward` used to store the kept reals again on every call (128 reals became 1024 after three
forwards), so `compute()` gave precision, density and coverage 0.
"""

from __future__ import annotations

import prdc as prdc_ref
import pytest
import torch

from framework.metrics import GICDM, prdc

torch.set_num_threads(1)
K = 5
PRDC = ("precision", "recall", "density", "coverage")
SKEW = "real_k_occurrence_skewness"
KEYS = (*PRDC, SKEW)  # beside approx_graph, in every compute(); a correction adds the corrected skewness
N_REAL, N_BATCHES, BATCH, DIM = 128, 3, 64, 32
pytestmark = pytest.mark.filterwarnings("ignore::framework.metrics.ReconstructionWarning")


def data(seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Seeded Gaussian reals and a fixed list of generated batches (shifted and wider, so no score is 0 or 1)."""
    g = torch.Generator().manual_seed(seed)
    real = torch.randn(N_REAL, DIM, generator=g)
    return real, [torch.randn(BATCH, DIM, generator=g) * 1.1 + 0.1 for _ in range(N_BATCHES)]


def reference(real: torch.Tensor, fake: torch.Tensor) -> dict[str, float]:
    """P/R/D/C of the `prdc` package."""
    return {k: float(v) for k, v in prdc_ref.compute_prdc(real.numpy(), fake.numpy(), nearest_k=K).items()}


def floats(out: dict[str, torch.Tensor], keys: tuple[str, ...] = KEYS) -> dict[str, float]:
    return {k: float(out[k]) for k in keys}


def keys(correction: str) -> tuple[str, ...]:
    """The keys compared under `correction` (the corrected skewness exists only where a correction ran)."""
    return KEYS if correction == "none" else (*KEYS, SKEW + "_corrected")


def n_real(metric: GICDM) -> int:
    return sum(int(t.shape[0]) for t in metric.real_features)


def kept_reals_metric(real: torch.Tensor, **kwargs) -> GICDM:
    metric = GICDM(k=K, reset_real_features=False, **kwargs)
    for chunk in real.split(50):  # reals in uneven chunks, by update()
        metric.update(chunk, real=True)
    return metric


def run_forwards(metric: GICDM, real: torch.Tensor, fakes: list[torch.Tensor], correction: str = "none") -> None:
    """Forward each batch; its value must be the reference on (all kept reals, this batch)."""
    for i, fake in enumerate(fakes):
        out = metric(fake, real=False)
        assert n_real(metric) == len(real), f"batch {i}: the reals were stored again"
        assert len(metric.fake_features) == i + 1
        expected = prdc(real, fake, K, correction)
        assert set(out) == {*keys(correction), "approx_graph"}, f"batch {i}"
        assert floats(out, keys(correction)) == pytest.approx({k: expected[k] for k in keys(correction)}, abs=1e-6)
        if correction == "none":
            assert floats(out, PRDC) == pytest.approx(reference(real, fake), abs=1e-6), f"batch {i}"


def test_the_reported_scenario_128_reals_three_forwards_compute_equals_prdc():
    real, fakes = data()
    metric = GICDM(k=K, reset_real_features=False)
    metric.update(real, real=True)
    for fake in fakes:
        metric(fake, real=False)
    assert n_real(metric) == 128  # was 1024: 128 doubled by each of the three forwards
    out = floats(metric.compute(), PRDC)
    expected = reference(real, torch.cat(fakes))
    assert out == pytest.approx(expected, abs=1e-6)
    assert min(out.values()) > 0.3  # the bug gave precision, density and coverage 0.0
    assert metric.info["n_real"] == 128 and metric.info["n_fake"] == N_BATCHES * BATCH


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"dist_sync_on_step": True}, {"compute_on_cpu": True}],
    ids=["reduce_state_forward", "full_state_forward", "compute_on_cpu"],
)
def test_forward_per_batch_and_accumulated_compute_equal_the_reference(kwargs):
    """Both of torchmetrics' forward paths: `_forward_reduce_state_update` (the default, `full_state_update=False`)
    and `_forward_full_state_update` (taken with `dist_sync_on_step=True`; one process, so nothing to sync)."""
    real, fakes = data(1)
    metric = kept_reals_metric(real, **kwargs)
    run_forwards(metric, real, fakes)
    out = metric.compute()
    everything = torch.cat(fakes)
    assert floats(out, PRDC) == pytest.approx(reference(real, everything), abs=1e-6)
    assert floats(out) == pytest.approx(floats(prdc(real, everything, K)), abs=1e-6)
    assert metric.info["n_real"] == N_REAL and metric.info["n_fake"] == len(everything)
    assert n_real(metric) == N_REAL  # compute() leaves the states as they were


@pytest.mark.parametrize("correction", ["icdm", "gicdm_reconstructed"])
def test_forward_with_a_correction_equals_the_functional(correction):
    real, fakes = data(2)
    metric = kept_reals_metric(real, correction=correction)
    run_forwards(metric, real, fakes, correction)
    expected = floats(prdc(real, torch.cat(fakes), K, correction), keys(correction))
    assert floats(metric.compute(), keys(correction)) == pytest.approx(expected, abs=1e-6)


def test_reals_kept_across_reset_score_several_generators():
    """The use `reset_real_features=False` is for: one reference, a generator per epoch, forward per batch."""
    real, first = data(3)
    _, second = data(4)
    metric = kept_reals_metric(real)
    for fakes in (first, second):
        run_forwards(metric, real, fakes)
        assert floats(metric.compute(), PRDC) == pytest.approx(reference(real, torch.cat(fakes)), abs=1e-6)
        metric.reset()
        assert n_real(metric) == N_REAL and metric.fake_features == []


@pytest.mark.parametrize("reset_real_features", [False, True])
def test_reset_keeps_the_reals_only_when_asked_and_always_drops_the_fakes(reset_real_features):
    real, fakes = data(5)
    metric = GICDM(k=K, reset_real_features=reset_real_features)
    metric.update(real, real=True)
    for fake in fakes:
        metric.update(fake, real=False)
    kept = list(metric.real_features)
    metric.reset()
    assert metric.fake_features == []
    if reset_real_features:
        assert metric.real_features == []
        return
    assert len(metric.real_features) == 1 and metric.real_features[0] is kept[0]
    metric.update(fakes[0], real=False)
    assert floats(metric.compute(), PRDC) == pytest.approx(reference(real, fakes[0]), abs=1e-6)


@pytest.mark.parametrize(
    ("reset_real_features", "reals_first", "batch_is_real"),
    [(True, True, False), (False, False, False), (True, True, True), (False, True, True)],
    ids=["reals_not_kept", "no_reals_yet", "real_batch", "real_batch_with_kept_reals"],
)
def test_forward_of_a_one_sided_batch_is_nan_warns_once_and_the_accumulated_state_survives(
    reset_real_features, reals_first, batch_is_real
):
    """A batch state without reals or without generated features has no value: NaN for every key, one warning per
    metric. torchmetrics has reset the accumulated state before computing it, so raising there used to lose it."""
    reals, fakes = data(6)
    first, more = reals[:80], reals[80:]  # a real batch adds `more`; a generated batch adds fakes[1], fakes[2]
    metric = GICDM(k=K, reset_real_features=reset_real_features)
    if reals_first:
        metric.update(first, real=True)
    metric.update(fakes[0], real=False)
    batches = [(more, True)] if batch_is_real else [(fakes[1], False), (fakes[2], False)]
    with pytest.warns(UserWarning, match="forward got a batch state with") as record:
        outs = [metric(x, real=real) for x, real in batches]
    assert len([w for w in record if "forward got a batch state" in str(w.message)]) == 1
    assert all(set(out) == set(KEYS) | {"approx_graph"} and all(v.isnan() for v in out.values()) for out in outs)
    if not reals_first:
        metric.update(first, real=True)
    seen_reals = torch.cat([first, more]) if batch_is_real else first
    seen_fakes = torch.cat(fakes[:1] if batch_is_real else fakes)
    assert n_real(metric) == len(seen_reals)  # with kept reals, the batch's new reals are added once
    assert sum(int(t.shape[0]) for t in metric.fake_features) == len(seen_fakes)
    assert floats(metric.compute(), PRDC) == pytest.approx(reference(seen_reals, seen_fakes), abs=1e-6)
