"""The evaluation harness behind `recipe=gicdm_eval`: HubnessSweep configurations and MetricEval's report."""

from __future__ import annotations

import json
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from framework.data.hubness import HubnessSweep, digits_pair, gaussian_pair, ood_pair
from framework.metrics import prdc
from framework.modules.metric_eval import MetricEval

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::framework.metrics.ReconstructionWarning")


def test_validation_writes_the_table_json_and_plots_and_logs_seed_means(tmp_path):
    data = HubnessSweep(n=120, dims=[2, 32], seeds=2, digits=False, ood_dim=16, ood_fractions=[0.0, 0.5])
    module = MetricEval(k=3, corrections=["none", "gicdm_reconstructed"], out_dir=str(tmp_path))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    logged = trainer.validate(module, datamodule=data, verbose=False)[0]
    for name in ("gicdm_eval.md", "gicdm_eval.json", "gicdm_hubness.png", "gicdm_scenarios.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = json.loads((tmp_path / "gicdm_eval.json").read_text())["rows"]
    assert len(rows) == (2 * 2 + 2) * 2  # (dims × seeds + OOD fractions) × corrections
    seeds = [prdc(*gaussian_pair(120, 32, s), 3, "gicdm_reconstructed")["precision"] for s in (0, 1)]
    assert logged["gauss_d32/precision_gicdm_reconstructed"] == pytest.approx(sum(seeds) / 2, abs=1e-6)
    # the skewness under the names prdc gives it: raw once per configuration, corrected per correction that ran
    raw = [prdc(*gaussian_pair(120, 32, s), 3)["real_k_occurrence_skewness"] for s in (0, 1)]
    assert logged["gauss_d32/real_k_occurrence_skewness"] == pytest.approx(sum(raw) / 2, abs=1e-6)
    assert [k for k in logged if k.startswith("gauss_d32/real_k")] == [
        "gauss_d32/real_k_occurrence_skewness", "gauss_d32/real_k_occurrence_skewness_corrected_gicdm_reconstructed"]
    assert not any("corrected" in k for r in rows if r["correction"] == "none" for k in r)
    table = (tmp_path / "gicdm_eval.md").read_text()
    assert "| gauss_d32 | 32 | 2 |" in table and "none: P / R / D / C" in table


def test_configurations_are_deterministic_and_sharded_by_rank():
    data = HubnessSweep(n=64, dims=[4], seeds=1, noise_dims=8)
    labels = [c["label"] for c in data.configs()]
    shards = []
    for rank in (0, 1):
        data.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        shards.append([c["label"] for c in data._shard()])
    assert sorted(shards[0] + shards[1]) == sorted(labels) and not set(shards[0]) & set(shards[1])
    assert labels[0] == "gauss_d4" and "ood_p0.8" in labels and "digits_noise_keep2" in labels
    _, fake = ood_pair(64, 4, 0.5, 0)
    _, clean = ood_pair(64, 4, 0.0, 0)
    ratio = fake.norm(dim=1) / clean.norm(dim=1)  # the first half scaled by max(2, 10 + N(0, 1)), the rest as is
    assert bool((ratio[:32] >= 2).all()) and torch.equal(fake[32:], clean[32:])
    r, f = digits_pair(keep=5, noise_dims=8, sigma=0.2, seed=0)
    assert r.shape[1] == 72 and len(r) == 898 and len(f) < 899  # classes >= 5 were dropped from the generated half
    assert torch.equal(digits_pair(5, 8, 0.2, 0)[1], f)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"dims=\[0\] must be a non-empty list of positive dimensions"):
        HubnessSweep(dims=[0])
    with pytest.raises(ValueError, match=r"corrections=\['raw'\] must be non-empty, from none, icdm, "
                                         r"gicdm_reconstructed"):
        MetricEval(corrections=["raw"])
