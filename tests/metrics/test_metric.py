"""The torchmetrics `GICDM` (states, reset, feature extractor, registry) and the CLI."""

from __future__ import annotations

import json

import lightning as L
import numpy as np
import prdc as prdc_ref
import pytest
import torch
from torch import nn

from framework.metrics import GICDM, prdc
from framework.modules.metric_eval import MetricEval
from framework.registry import METRICS

torch.set_num_threads(1)
SKEW, SKEW_CORRECTED = "real_k_occurrence_skewness", "real_k_occurrence_skewness_corrected"
KEYS = ("precision", "recall", "density", "coverage", SKEW)  # a correction adds SKEW_CORRECTED
pytestmark = pytest.mark.filterwarnings("ignore::framework.metrics.ReconstructionWarning")


def sets(seed: int = 0, n: int = 300, m: int = 240, d: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randn(m, d, generator=g) * 1.1


def keys(correction: str = "none") -> tuple[str, ...]:
    """What compute() and prdc() give under `correction` (beside approx_graph and prdc's facts)."""
    return KEYS if correction == "none" else (*KEYS, SKEW_CORRECTED)


def as_floats(out: dict, correction: str = "none") -> dict:
    return {k: float(out[k]) for k in keys(correction)}


@pytest.mark.parametrize("correction", ["none", "gicdm_reconstructed"])
def test_metric_in_batches_equals_the_functional_on_the_concatenated_sets(correction):
    real, fake = sets()
    metric = GICDM(k=5, correction=correction)
    for chunk in real.split(64):
        metric.update(chunk, real=True)
    for chunk in fake.split(50):
        metric.update(chunk, real=False)
    out = metric.compute()
    ref = prdc(real, fake, 5, correction)
    assert metric.info["correction"] == correction and metric.info["n_real"] == 300
    assert set(out) == {*keys(correction), "approx_graph"} and (SKEW_CORRECTED in ref) == (correction != "none")
    assert as_floats(out, correction) == pytest.approx(as_floats(ref, correction), abs=1e-6)  # tensors are float32


def test_defaults_everywhere_are_the_raw_metrics_of_prdc():
    real, fake = sets()
    ref = {k: float(v) for k, v in prdc_ref.compute_prdc(real.numpy(), fake.numpy(), nearest_k=5).items()}
    assert {k: prdc(real, fake)[k] for k in ref} == ref
    for metric in (GICDM(), METRICS.build("gicdm")):
        metric.update(real, real=True)
        metric.update(fake, real=False)
        assert as_floats(metric.compute()) == pytest.approx({k: prdc(real, fake)[k] for k in KEYS}, abs=1e-6)
        assert metric.correction == "none" and metric.info["correction"] == "none"
    assert MetricEval().corrections == ["none"]


class _Logs(L.LightningModule):
    """The pattern users write: log the metric's compute() with log_dict at the end of validation."""

    def __init__(self, real: torch.Tensor, fake: torch.Tensor, correction: str):
        super().__init__()
        self.real, self.fake, self.metric = real, fake, GICDM(correction=correction)

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.metric.update(self.real, real=True)
        self.metric.update(self.fake, real=False)

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.metric.compute())
        self.metric.reset()


@pytest.mark.parametrize("correction", ["none", "icdm"])
def test_compute_returns_tensors_only_so_log_dict_accepts_it(correction):
    real, fake = sets()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    logged = trainer.validate(_Logs(real, fake, correction), torch.utils.data.DataLoader(torch.zeros(1, 1)),
                              verbose=False)[0]
    ref = prdc(real, fake, 5, correction)
    assert logged == pytest.approx({**as_floats(ref, correction), "approx_graph": 0.0}, abs=1e-6)


def test_states_are_lists_that_sync_by_concatenation_and_reset_keeps_real_features_on_request():
    real, fake = sets()
    metric = GICDM(k=3, correction="none", reset_real_features=False)
    assert metric._reductions["real_features"].__name__ == "dim_zero_cat"
    metric.update(real, real=True)
    metric.update(fake, real=False)
    metric.reset()
    assert len(metric.real_features) == 1 and metric.fake_features == []
    metric.update(fake[:100], real=False)
    assert as_floats(metric.compute()) == pytest.approx(as_floats(prdc(real, fake[:100], 3)), abs=1e-6)
    fresh = GICDM(k=3, correction="none")
    fresh.update(real, real=True)
    fresh.reset()
    with pytest.raises(RuntimeError, match="needs real and generated features; got 0 real"), pytest.warns(UserWarning):
        fresh.compute()


def test_feature_extractor_maps_inputs_and_a_timm_backbone_plugs_in():
    timm = pytest.importorskip("timm")
    backbone = timm.create_model("resnet10t", pretrained=False, num_classes=0)
    metric = GICDM(feature=backbone, k=3, correction="icdm")
    g = torch.Generator().manual_seed(0)
    images = torch.rand(24, 3, 32, 32, generator=g)
    metric.update(images[:12], real=True)
    metric.update(images[12:], real=False)
    assert metric.real_features[0].shape == (12, backbone.num_features)
    assert backbone.training  # the extractor ran in eval mode and was put back
    with torch.no_grad():
        feats = backbone.eval()(images)
    out = metric.compute()
    assert float(out["precision"]) == pytest.approx(prdc(feats[:12], feats[12:], 3, "icdm")["precision"], abs=1e-6)


def test_registered_as_gicdm_and_bad_arguments_are_named():
    assert isinstance(METRICS.build("gicdm"), GICDM)
    with pytest.raises(ValueError, match="correction='hub' is not one of 'none', 'icdm', 'gicdm_reconstructed'"):
        GICDM(correction="hub")
    with pytest.raises(ValueError, match=r"options \['neighbors'\] are not prdc options; valid: alpha"):
        GICDM(options={"neighbors": "exact"})
    with pytest.raises(TypeError, match="feature must be an nn.Module"):
        GICDM(feature="dinov2")
    with pytest.raises(ValueError, match="k=0 must be a positive integer"):
        GICDM(k=0)
    assert isinstance(GICDM(feature=nn.Identity()).feature, nn.Identity)


def test_cli_prints_the_metrics_as_json(tmp_path, capsys):
    """The command's `main` in this process (tests/metrics/test_image_cli.py runs `python -m framework.metrics` in a
    fresh one)."""
    from framework.metrics.__main__ import main

    real, fake = sets(1, 200, 150, 16)
    np.save(tmp_path / "real.npy", real.numpy())
    np.save(tmp_path / "fake.npy", fake.numpy())
    assert main([str(tmp_path / "real.npy"), str(tmp_path / "fake.npy"), "--k", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = prdc(real, fake, 4)
    assert {k: out[k] for k in KEYS[:4]} == {k: ref[k] for k in KEYS[:4]}
    assert out["hubness"] == {SKEW: ref[SKEW]}
    assert out["correction"] == "none" and out["n_real"] == 200 and out["dim"] == 16
    assert main([str(tmp_path / "real.npy"), str(tmp_path / "fake.npy"), "--correction", "gicdm"]) == 2
    assert "correction='gicdm_reconstructed'" in capsys.readouterr().err
    assert main([str(tmp_path / "real.npy"), str(tmp_path / "missing.npy")]) != 0
    assert "no such features file" in capsys.readouterr().err


def _sides(tmp_path) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Two tiny `.npy` feature sets for the CLI: (its two arguments, the real and the generated features)."""
    real, fake = sets(3, 80, 60, 8)
    np.save(tmp_path / "real.npy", real.numpy())
    np.save(tmp_path / "fake.npy", fake.numpy())
    return [str(tmp_path / "real.npy"), str(tmp_path / "fake.npy")], real, fake


def _keys(tree: object) -> list[str]:
    """Every key of a JSON value, nested ones included."""
    if isinstance(tree, dict):
        return [key for k, v in tree.items() for key in (k, *_keys(v))]
    return [key for v in tree for key in _keys(v)] if isinstance(tree, list) else []


def test_cli_with_the_correction_off_never_runs_icdm_and_prints_no_corrected_figures(tmp_path, capsys, monkeypatch):
    """Issue 51: `--correction none` (the default) used to compute ICDM too. Now ICDM's entry point is never called
    (patched to fail here), by the CLI or by `GICDM(correction="none")`; with the correction on, it is."""
    import importlib

    from framework.metrics import functional
    from framework.metrics.__main__ import main

    icdm_module = importlib.import_module("framework.metrics.icdm")  # the package's `icdm` is the function

    argv, real, fake = _sides(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("ICDM ran")

    with monkeypatch.context() as patched:
        patched.setattr(functional, "icdm", refuse)
        patched.setattr(icdm_module, "icdm", refuse)
        assert main([*argv, "--correction", "none", "--plot", str(tmp_path / "fig.png")]) == 0
        out = json.loads(capsys.readouterr().out)
        metric = GICDM(k=5)  # the metric object's "none" skips the corrected path too
        metric.update(real, real=True)
        metric.update(fake, real=False)
        assert float(metric.compute()["precision"]) == pytest.approx(prdc(real, fake)["precision"], abs=1e-6)
        with pytest.raises(AssertionError, match="ICDM ran"):  # the patch is where a correction goes through
            main([*argv, "--correction", "icdm"])
    capsys.readouterr()
    raw = prdc(real, fake)
    assert out["correction"] == "none" and out["raw"] == {m: raw[m] for m in KEYS[:4]}
    assert not [key for key in _keys(out) if "corrected" in key or key.startswith("icdm")], out
    assert out["hubness"] == {SKEW: raw[SKEW]}
    assert (tmp_path / "fig.png").stat().st_size > 1000
    assert main([*argv, "--correction", "icdm"]) == 0
    out, icdm = json.loads(capsys.readouterr().out), prdc(real, fake, 5, "icdm")
    assert out["corrected"] == {"correction": "icdm", **{m: icdm[m] for m in KEYS[:4]},
                                **{k: v for k, v in icdm.items() if k.startswith(("icdm_", "delta_real_"))}}
    assert out["raw"] == {m: raw[m] for m in KEYS[:4]} and out["precision"] == icdm["precision"]
    assert out["hubness"] == {SKEW: raw[SKEW], SKEW_CORRECTED: icdm[SKEW_CORRECTED], "corrected_by": "icdm"}


@pytest.mark.parametrize("correction", ["none", "icdm"])
def test_cli_json_names_each_quantity_once_raw_and_corrected_side_by_side(tmp_path, capsys, correction):
    """Issue 53: the JSON gave the reals' skewness twice under two names (`hub_skew_real_corrected`, equal to the raw
    one under `--correction none`, and `hubness.real_k_occurrence_skewness_corrected`). Now `hubness` alone holds it,
    raw and corrected side by side, and without a correction no corrected value is there at all."""
    from collections import Counter

    from framework.metrics.__main__ import main

    argv, real, fake = _sides(tmp_path)
    assert main([*argv, "--correction", correction]) == 0
    out = json.loads(capsys.readouterr().out)
    names = Counter(_keys({k: v for k, v in out.items() if k not in ("real", "fake")}))  # the sides' own entries
    raw = prdc(real, fake)
    assert [k for k in names if "skew" in k] == ([SKEW] if correction == "none" else [SKEW, SKEW_CORRECTED])
    assert names[SKEW] == 1 and names[SKEW_CORRECTED] <= 1
    assert out["hubness"][SKEW] == raw[SKEW]
    if correction == "none":
        assert out["hubness"] == {SKEW: raw[SKEW]} and "corrected" not in out
        assert not [k for k in names if "corrected" in k or k.startswith(("icdm", "delta"))], names
        return
    icdm = prdc(real, fake, 5, "icdm")
    assert out["hubness"] == {SKEW: raw[SKEW], SKEW_CORRECTED: icdm[SKEW_CORRECTED], "corrected_by": "icdm"}
    assert icdm[SKEW_CORRECTED] != raw[SKEW]
    # the P/R/D/C are raw and corrected side by side (the top level repeats --correction's, as documented); every
    # other quantity is named once
    assert {k for k, n in names.items() if n > 1} == {*KEYS[:4], "correction"}
    assert out["raw"] == {m: raw[m] for m in KEYS[:4]} and {m: out[m] for m in KEYS[:4]} == {
        m: out["corrected"][m] for m in KEYS[:4]}


def test_cli_threads_sets_torchs_thread_count_for_the_computation_and_zero_is_refused(tmp_path, capsys, monkeypatch):
    """Issue 51: `--threads N` is torch's intra-op thread count while the metrics are computed (restored after);
    by default the CPUs this process may use minus the decoding workers (none for `.npy` sides), at least 1."""
    from framework.metrics import __main__ as cli

    argv, _, _ = _sides(tmp_path)
    seen: list[int] = []

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return prdc(*args, **kwargs)

    monkeypatch.setattr(cli, "prdc", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cli.main([*argv, "--threads", "1"]) == 0
        assert seen == [1] and torch.get_num_threads() == 2
        monkeypatch.setattr(cli, "usable_cpus", lambda: 3)
        assert cli.main(argv) == 0
        assert seen == [1, 3] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert cli.default_threads(workers=1) == 2 and cli.default_threads(workers=8) == 1
    capsys.readouterr()
    assert cli.main([*argv, "--threads", "0"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("error: --threads=0: "), captured.err
    assert ">= 1" in lines[0] and seen == [1, 3]
