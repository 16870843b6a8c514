"""README's "Your own images" section, run as printed against the local Hub: every command line verbatim, in one
folder, each in a fresh `python` process, with the shell's environment. The folder holds what the section says a
reader has: `my_images/` (one folder per class of PNG files: scikit-learn's digits), `my_samples/` (other digits,
noisier: the "generated" side), and on the Hub an image dataset `your-name/my-images` (parquet, an image and a
ClassLabel column, train and test splits). Each line must exit 0 and give what the section says it gives."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from helpers import guide
from support import warm_cli
from support.digit_images import digits_pngs

pytest.importorskip("datasets")

CLASSES = tuple(range(10))


def _lines() -> list[list[str]]:
    body = guide("your_images")
    blocks = re.findall(r"^```bash\n(.*?)^```", body, flags=re.M | re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.strip()]


def _reader_files(cwd, hub) -> None:
    """The reader's folders in `cwd` and their image dataset on the Hub."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature
    from PIL import Image

    digits_pngs(cwd / "my_images", n=150, classes=CLASSES, size=32)
    samples = digits_pngs(cwd / "my_samples", n=60, classes=CLASSES, size=32, start=150)
    rng = np.random.default_rng(0)
    for f in sorted(samples.rglob("*.png")):  # "generated": the other digits, with pixel noise
        pixels = np.asarray(Image.open(f), dtype=np.float32) + rng.normal(0, 40, (32, 32))
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(f)
    tree = digits_pngs(cwd / "hub_pngs", n=120, classes=CLASSES, size=32, start=300)
    files = sorted(tree.rglob("*.png"))
    up = cwd / "hub_dataset" / "data"
    up.mkdir(parents=True)
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=[str(c) for c in CLASSES])})
    for split, part in (("train", slice(0, 100)), ("test", slice(100, 120))):
        rows = {"image": [str(f) for f in files[part]], "label": [int(f.parent.name) for f in files[part]]}
        Dataset.from_dict(rows, features=features).to_parquet(up / f"{split}-00000-of-00001.parquet")
    hub.api.create_repo("your-name/my-images", repo_type="dataset", exist_ok=True)
    hub.api.upload_folder(repo_id="your-name/my-images", repo_type="dataset", folder_path=str(up.parent))


def _results(cwd, before: set) -> dict:
    new = sorted(set((cwd / "outputs").rglob("results.json")) - before)
    assert len(new) == 1, new
    return json.loads(new[0].read_text())


def _run(argv: list[str], cwd, env: dict, small: bool, monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the line in a fresh `python`, as printed. At the small size a `framework.train`
    line runs 2 steps in a process forked from a warm one (`support.warm_cli`), and the `python -c` and
    `framework.metrics` lines run in this process, on the same files and Hub."""
    if small and argv[1:3] == ["-m", "framework.train"]:
        proc = warm_cli.run(argv[2], [*argv[3:], "trainer.max_steps=2"], env, cwd, timeout=600)
        return proc.returncode, proc.stdout, proc.stderr
    if small:
        from huggingface_hub import constants

        from framework.metrics.__main__ import main

        with monkeypatch.context() as m:
            m.chdir(cwd)
            m.setattr(constants, "HF_HUB_OFFLINE", False)
            m.setenv("FRAMEWORK_DATA_CACHE", env["FRAMEWORK_DATA_CACHE"])
            capsys.readouterr()
            code = main(argv[3:]) if argv[1:3] == ["-m", "framework.metrics"] else exec(argv[2]) or 0
            out, err = capsys.readouterr()
        return code, out, err
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


# both in make test-slow: make test keeps each line's path (tests/data/test_images.py trains on a folder and reads a
# Hub image dataset, tests/models/test_timm_models.py opens a run's push with timm in a fresh process,
# tests/metrics/test_image_cli.py scores two folders in a fresh process); `small` is the quicker check of the lines
@pytest.mark.parametrize("small", [pytest.param(False, marks=pytest.mark.slow, id="as-printed"),
                                   pytest.param(True, marks=pytest.mark.slow, id="small")])
def test_the_your_own_images_section_runs_as_printed(tmp_path, hub, small, monkeypatch, capsys):
    """As printed; and (`small`, a quick check of the lines) the same lines with the training runs cut to 2 steps and
    the two short lines run in this process."""
    lines = _lines()
    assert len(lines) == 4 and all(argv[0] == "python" for argv in lines), lines
    cwd = tmp_path / "reader"
    cwd.mkdir()
    _reader_files(cwd, hub)
    env = {**{k: v for k, v in os.environ.items() if k != "FRAMEWORK_SMOKE"}, "HF_ENDPOINT": hub.url,
           "HF_TOKEN": "dummy", "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1",
           "FRAMEWORK_DATA_CACHE": str(tmp_path / "data_cache")}
    outputs = []
    for argv in lines:
        before = set((cwd / "outputs").rglob("results.json")) if (cwd / "outputs").exists() else set()
        code, out, err = _run(argv, cwd, env, small, monkeypatch, capsys)
        assert code == 0, (argv, err[-3000:])
        outputs.append(_results(cwd, before) if argv[1:3] == ["-m", "framework.train"] else out)
    trained, opened, tuned, scored = outputs
    assert trained["data"]["dataset"] == "my_images/" and trained["data"]["classes"] == 10
    assert trained["data"]["images"] == 150 and trained["data"]["input_size"] == [1, 64, 64]  # grey: one channel
    pushed = hub.api.list_repo_files("your-name/my-classifier")
    assert {"config.json", "model.safetensors"} <= set(pushed), pushed
    assert opened.split()[-4:] == ["10", "(1,", "64,", "64)"], opened  # timm's own loader: 10 classes, 64x64
    assert tuned["data"]["dataset"] == "your-name/my-images" and tuned["data"]["validation"] == "test"
    assert tuned["data"]["sha"] == hub.api.dataset_info("your-name/my-images").sha
    assert (tuned["data"]["train_images"], tuned["data"]["val_images"]) == (100, 20)
    report = json.loads(scored[scored.index("{"):])
    assert report["n_real"] == 150 and report["n_fake"] == 60 and report["feature"]["name"].endswith("my-classifier")
    assert "real" in json.dumps(report["roles"]) and {"raw", "corrected", "hubness"} <= set(report)
    assert all(0.0 <= report["raw"][m] for m in ("precision", "recall", "density", "coverage"))
    assert (cwd / "samples.png").stat().st_size > 10_000
