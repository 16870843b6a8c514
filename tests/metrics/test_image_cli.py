"""`python -m framework.metrics REAL GEN` on images: folders of real PNG/JPEG files written here (scikit-learn's digits,
and noisy JPEG copies of other digits as the generated side), a tiny timm model pushed to the local Hub and named by
`--feature hf-hub:...`; the features cache keyed by content and extractor; bad input refused in one line."""

from __future__ import annotations

import json
import shutil
import weakref
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from huggingface_hub import constants
from PIL import Image

from framework.metrics import image_features as F
from framework.metrics import prdc
from framework.metrics.__main__ import main

METRICS = ("precision", "recall", "density", "coverage")
TINY = "hf-hub:local-user/tiny-vit"


@pytest.fixture(scope="module")
def pushed(hub):
    """The tiny timm ViT on the local Hub (and as timm's own repo of `test_vit`'s default tag); its commit sha."""
    from timm.models import push_to_hf_hub

    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False, num_classes=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        push_to_hf_hub(model, "local-user/tiny-vit", safe_serialization=True)
        push_to_hf_hub(model, "timm/test_vit.r160_in1k", safe_serialization=True)
        hub.api.create_repo("local-user/a-llama")
        hub.api.upload_file(path_or_fileobj=json.dumps({"model_type": "llama"}).encode(), path_in_repo="config.json",
                            repo_id="local-user/a-llama")
        sha = hub.api.model_info("local-user/tiny-vit").sha
    return sha


@pytest.fixture(autouse=True)
def online(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def _digits(folder: Path, rows: range, noise: float = 0.0, suffix: str = "png") -> Path:
    """sklearn's digits as 32x32 RGB files (half in a subfolder); with `noise`, Gaussian noise added."""
    from sklearn.datasets import load_digits

    images = load_digits().images
    rng = np.random.default_rng(0)
    for i in rows:
        pixels = np.kron(images[i] * 255 / 16, np.ones((4, 4)))
        pixels = np.clip(pixels + rng.normal(0, noise, pixels.shape), 0, 255).astype(np.uint8)
        where = folder / ("odd" if i % 2 else "") / f"{i:04d}.{suffix}"
        where.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).convert("RGB").save(where)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    real = _digits(root / "real", range(0, 40))
    gen = _digits(root / "generated", range(40, 80), noise=40.0, suffix="jpg")
    (gen / "notes.png").write_text("not an image")  # skipped and counted
    return real, gen


def test_two_folders_are_scored_with_roles_revision_and_raw_and_corrected_figures(pushed, folders, tmp_path, capsys):
    """The command's `main` in this process (a fresh `python -m framework.metrics` on two folders: the your_images
    guide's test, small in make test, as printed in make test-slow)."""
    real, gen = folders
    cache, figure = tmp_path / "cache", tmp_path / "fig.png"
    code = main([str(real), str(gen), "--feature", TINY, "--cache-dir", str(cache), "--plot", str(figure),
                 "--workers", "1", "--correction", "icdm"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    out = json.loads(captured.out)
    assert out["roles"]["real"] == str(real) and out["roles"]["generated"] == str(gen)
    assert out["feature"]["name"] == TINY and out["feature"]["revision"] == pushed
    assert out["real"]["files"] == 40 and out["real"]["skipped"] == 0 and out["n_real"] == 40
    assert out["fake"]["files"] == 41 and out["fake"]["skipped"] == 1 and out["n_fake"] == 40
    assert "notes.png: not an image" in out["fake"]["skipped_examples"][0]
    assert out["real"]["features_cache"] == out["fake"]["features_cache"] == "new"
    assert out["dim"] == 64 and out["corrected"]["correction"] == "icdm"
    assert figure.stat().st_size > 10_000
    # the raw figures are prdc's on the features the cache holds (the extractor's in this process), the top-level
    # ones the correction asked for
    feats = [np.load(out[side]["cache_file"])["features"] for side in ("real", "fake")]
    ours = F.ImageFeatures(F.resolve(TINY), workers=0).extract(F.folder_images(real)).features
    np.testing.assert_allclose(feats[0], ours, rtol=1e-4, atol=1e-4)
    raw, icdm = prdc(*feats, 5), prdc(*feats, 5, "icdm")
    for m in METRICS:
        assert out["raw"][m] == pytest.approx(raw[m], abs=1e-9)
        assert out["corrected"][m] == pytest.approx(icdm[m], abs=1e-9) == out[m]
    assert out["hubness"]["real_k_occurrence_skewness"] == pytest.approx(raw["real_k_occurrence_skewness"])
    assert out["hubness"]["real_k_occurrence_skewness_corrected"] == pytest.approx(
        icdm["real_k_occurrence_skewness_corrected"])


def test_the_cache_is_reused_for_a_renamed_folder_and_missed_when_one_file_changes(pushed, folders, tmp_path,
                                                                                    capsys):
    real, gen = folders
    cache = tmp_path / "cache"
    args = ["--feature", TINY, "--cache-dir", str(cache), "--workers", "0"]
    assert main([str(real), str(gen), *args]) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(list(cache.glob("*.npz"))) == 2 and not list(cache.glob(".tmp-*"))
    moved = shutil.copytree(gen, tmp_path / "renamed")
    assert main([str(real), str(moved), *args]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["real"]["features_cache"] == again["fake"]["features_cache"] == "reused"
    assert again["fake"]["skipped"] == 1 and again["fake"]["cache_file"] == first["fake"]["cache_file"]
    assert {m: again[m] for m in METRICS} == {m: first[m] for m in METRICS}
    Image.fromarray(np.full((32, 32, 3), 255, np.uint8)).save(moved / "0040.jpg")  # one file's content changed
    assert main([str(real), str(moved), *args]) == 0
    changed = json.loads(capsys.readouterr().out)
    assert changed["real"]["features_cache"] == "reused" and changed["fake"]["features_cache"] == "new"
    assert changed["fake"]["cache_file"] != first["fake"]["cache_file"] and len(list(cache.glob("*.npz"))) == 3


def test_a_timm_name_reads_timms_own_repo_and_bf16_extracts_close_to_float32(pushed, folders, tmp_path, capsys):
    real, gen = folders
    resolved = F.resolve("test_vit")  # its default tag's weights: timm/test_vit.r160_in1k, here on the local Hub
    assert (resolved.repo, resolved.default) == ("timm/test_vit.r160_in1k", False)
    full = F.ImageFeatures(resolved, workers=0).extract(F.folder_images(real)).features
    half = F.ImageFeatures(F.resolve(TINY), workers=0, bf16=True).extract(F.folder_images(real)).features
    cos = (full * half).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(half, axis=1)
    assert full.shape == half.shape == (40, 64) and cos.min() > 0.99
    assert main([str(real), str(gen), "--feature", "test_vit", "--no-cache", "--workers", "0", "--le", "--k", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feature"]["repo"] == "timm/test_vit.r160_in1k" and out["real"]["features_cache"] == "off"
    assert not (tmp_path / "cache").exists()


def test_images_are_decoded_one_batch_at_a_time(pushed):
    alive, most = [0], []

    def read(i: int) -> Image.Image:
        image = Image.new("RGB", (48, 48), (i, 0, 0))
        alive[0] += 1
        weakref.finalize(image, lambda: alive.__setitem__(0, alive[0] - 1))
        most.append(alive[0])
        return image

    images = F.ImageSet([f"img{i}" for i in range(100)], read, "synthetic")
    out = F.ImageFeatures(F.resolve(TINY), workers=0, batch_size=8).extract(images)
    assert out.features.shape == (100, 64) and max(most) <= 9


def _refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def test_bad_input_is_one_error_line_exit_2_and_nothing_written(pushed, folders, tmp_path, capsys):
    real, gen = folders
    cache = tmp_path / "cache"
    args = ["--cache-dir", str(cache), "--workers", "0"]
    (tmp_path / "empty").mkdir()
    assert "'%s' holds no image" % (tmp_path / "empty") in _refused(capsys, [str(real), str(tmp_path / "empty"),
                                                                            "--feature", TINY, *args])
    line = _refused(capsys, [str(tmp_path / "nowhere"), str(gen), "--feature", TINY, *args])
    assert line.startswith(f"error: {tmp_path / 'nowhere'}: no such file or folder (a side is a folder of images")
    line = _refused(capsys, [str(real), str(gen), "--feature", TINY, "--strict", *args])
    assert line.startswith(f"error: {gen / 'notes.png'}: not an image") and "--strict refuses it" in line
    truncated = shutil.copytree(real, tmp_path / "truncated")
    data = (truncated / "0002.png").read_bytes()
    (truncated / "0002.png").write_bytes(data[: len(data) // 2])
    line = _refused(capsys, [str(truncated), str(gen), "--feature", TINY, "--strict", *args])
    assert line.startswith(f"error: {truncated / '0002.png'}: truncated")
    line = _refused(capsys, [str(real), str(gen), "--feature", "vit_tiny_patch16_22", *args])
    assert "is not a timm model: did you mean 'vit_tiny_patch16_224'" in line
    line = _refused(capsys, [str(real), str(gen), "--feature", "hf-hub:local-user/a-llama", *args])
    assert "hf-hub:local-user/a-llama is not a timm model: local-user/a-llama holds a transformers model" in line
    line = _refused(capsys, [str(real), str(gen), "--feature", "hf-hub:local-user/nothing-here", *args])
    assert "no model repository 'local-user/nothing-here'" in line
    np.save(tmp_path / "a.npy", np.zeros((10, 4), np.float32))
    np.save(tmp_path / "b.npy", np.ones((10, 8), np.float32))
    line = _refused(capsys, [str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), *args])
    assert "have 4 dims but the generated ones" in line and "have 8" in line
    assert not cache.exists()


def test_the_default_extractor_is_named_and_an_unreachable_hub_is_one_clear_line(folders, tmp_path, monkeypatch,
                                                                                 capsys):
    real, gen = folders
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    assert main([str(real), str(gen), "--cache-dir", str(tmp_path / "cache")]) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: ExtractorUnavailable: the default feature extractor "
                           "vit_large_patch14_dinov2.lvd142m (DINOv2 ViT-L/14")
    assert "http://127.0.0.1:9 cannot give it" in line and "--feature" in line
    assert captured.out == "" and not (tmp_path / "cache").exists()


def test_a_hub_image_dataset_is_a_side_read_by_name(pushed, folders, hub, tmp_path, capsys):
    real, gen = folders
    upload = shutil.copytree(real, tmp_path / "upload" / "train")
    hub.api.create_repo("local-user/digits", repo_type="dataset")
    sha = hub.api.upload_folder(folder_path=upload.parent, repo_id="local-user/digits", repo_type="dataset").oid
    args = ["--feature", TINY, "--cache-dir", str(tmp_path / "cache"), "--workers", "0"]
    assert main(["local-user/digits", str(gen), *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["real"]["read_as"] == "images" and out["real"]["source"]["sha"] == sha and out["n_real"] == 40
    assert main([str(real), str(gen), *args]) == 0  # the same images from the folder: the same figures
    same = json.loads(capsys.readouterr().out)
    for m in METRICS:
        assert out[m] == pytest.approx(same[m], abs=1e-9)
