"""Corrections are opt-in and named for what they are; ICDM's neighbours are exact at every N unless the candidate
graph is asked for by name, and the result says which ran."""

from __future__ import annotations

import warnings

import pytest
import torch

import framework.metrics.functional as functional
from framework.metrics import GICDM, ReconstructionWarning, prdc
from framework.modules.metric_eval import MetricEval

torch.set_num_threads(1)
RECON = "gicdm_reconstructed"


def sets(n: int = 500, d: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)


def test_the_reconstruction_warns_exactly_once_per_process_and_nothing_else_warns(monkeypatch):
    monkeypatch.setattr(functional, "_warned", False)  # as in a fresh process
    real, fake = sets(60, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prdc(real, fake, 3)
        prdc(real, fake, 3, "icdm")
        GICDM()
        assert not [w for w in caught if issubclass(w.category, ReconstructionWarning)]
        prdc(real, fake, 3, RECON)
        prdc(real, fake, 3, RECON)
        GICDM(correction=RECON)
        MetricEval(corrections=["none", RECON])
    ours = [w for w in caught if issubclass(w.category, ReconstructionWarning)]
    assert len(ours) == 1 and issubclass(ReconstructionWarning, UserWarning)
    assert "not the paper's algorithm" in str(ours[0].message) and "over-corrects" in str(ours[0].message)


def test_the_paper_name_gicdm_is_refused_with_the_reconstruction_named():
    real, fake = sets(60, 8)
    match = r"correction='gicdm' is not available.*correction='gicdm_reconstructed'.*Valid: 'none', 'icdm'"
    for make in (lambda: prdc(real, fake, 3, "gicdm"), lambda: GICDM(correction="gicdm"),
                 lambda: MetricEval(corrections=["none", "gicdm"])):
        with pytest.raises(ValueError, match=match):
            make()


@pytest.mark.filterwarnings("ignore::framework.metrics.ReconstructionWarning")
@pytest.mark.parametrize("correction", ["icdm", RECON])
def test_exact_neighbours_give_identical_results_with_or_without_the_dense_matrix(correction):
    # dense_max only chooses memory (cached N×N screen) or time (a tiled pass per ICDM iteration): same numbers
    real, fake = sets()
    dense = prdc(real, fake, 5, correction, return_factors=True)
    tiled = prdc(real, fake, 5, correction, dense_max=100, block_size=128, return_factors=True)
    for key, value in dense.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(tiled[key], value), key
        else:
            assert tiled[key] == value, key
    assert dense["neighbours"] == "exact"


@pytest.mark.filterwarnings("ignore::framework.metrics.ReconstructionWarning")
def test_the_candidate_graph_is_an_explicit_option_and_the_result_records_it():
    real, fake = sets(400, 256)
    exact = prdc(real, fake, 5, RECON)
    approx = prdc(real, fake, 5, RECON, neighbours="approx_graph", candidates=16)
    assert approx["neighbours"] == "approx_graph" and exact["neighbours"] == "exact"
    assert approx["density"] != exact["density"]  # an approximation: it is never chosen silently
    metric = GICDM(correction=RECON, neighbours="approx_graph", options={"candidates": 16})
    metric.update(real, real=True)
    metric.update(fake, real=False)
    out = metric.compute()
    assert float(out["approx_graph"]) == 1.0 and metric.info["neighbours"] == "approx_graph"
    assert float(out["density"]) == pytest.approx(approx["density"], abs=1e-6)
    with pytest.raises(ValueError, match=r"candidates=16 applies only to neighbours='approx_graph' \(got 'exact'\)"):
        prdc(real, fake, 5, RECON, candidates=16)
    with pytest.raises(ValueError, match=r"neighbours='graph' is not one of 'exact', 'approx_graph'"):
        GICDM(neighbours="graph")
