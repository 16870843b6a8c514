"""The guide docs/guides/your_images.md against the guides' local Hub, every command line verbatim in one folder: as
printed (make test-slow: each in a fresh `python` process, with the shell's environment) and at the small size (make
test: `support.guides`). The folder holds what the section says a
reader has: `my_images/` (one folder per class of PNG files: scikit-learn's digits), `my_samples/` (other digits,
noisier: the "generated" side), and on the Hub an image dataset `your-name/my-images` (parquet, an image and a
ClassLabel column, train and test splits). Each line must exit 0 and give what the section says it gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import guides
from support.digit_images import digits_pngs

pytest.importorskip("datasets")

CLASSES = tuple(range(10))


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


# make test runs the lines at the guide's small size (its training runs cut to 2 steps), make test-slow as printed
@pytest.mark.parametrize("small", [pytest.param(True, marks=pytest.mark.long, id="small"),
                                   pytest.param(False, marks=pytest.mark.slow, id="as-printed")])
def test_the_your_own_images_section_runs_as_printed(tmp_path, guide_hub, small):
    """As printed; and (`small`, a quick check of the lines) the same lines with the training runs cut to 2 steps,
    each forked warm (`support.guides`)."""
    lines = guides.command_lines("your_images")
    assert len(lines) == 4 and all(argv[0] == "python" for argv in lines), lines
    cwd = tmp_path / "reader"
    cwd.mkdir()
    _reader_files(cwd, guide_hub)
    env = guides.reader_env(guide_hub, guide_hub.home, small, FRAMEWORK_DATA_CACHE=str(tmp_path / "data_cache"))
    outputs = []
    for argv in lines:
        before = guides.outputs(cwd)
        train = argv[1:3] == ["-m", "framework.train"]
        proc = guides.run_line([*argv, "trainer.max_steps=2"] if small and train else argv, cwd, env, small,
                               timeout=600)
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        outputs.append(guides.new_results(cwd, before) if train else proc.stdout)
    trained, opened, tuned, scored = outputs
    assert trained["data"]["dataset"] == "my_images/" and trained["data"]["classes"] == 10
    assert trained["data"]["images"] == 150 and trained["data"]["input_size"] == [1, 64, 64]  # grey: one channel
    pushed = guide_hub.api.list_repo_files("your-name/my-classifier")
    assert {"config.json", "model.safetensors"} <= set(pushed), pushed
    assert opened.split()[-4:] == ["10", "(1,", "64,", "64)"], opened  # timm's own loader: 10 classes, 64x64
    assert tuned["data"]["dataset"] == "your-name/my-images" and tuned["data"]["validation"] == "test"
    assert tuned["data"]["sha"] == guide_hub.api.dataset_info("your-name/my-images").sha
    assert (tuned["data"]["train_images"], tuned["data"]["val_images"]) == (100, 20)
    report = json.loads(scored[scored.index("{"):])
    assert report["n_real"] == 150 and report["n_fake"] == 60 and report["feature"]["name"].endswith("my-classifier")
    assert "real" in json.dumps(report["roles"]) and {"raw", "corrected", "hubness"} <= set(report)
    assert all(0.0 <= report["raw"][m] for m in ("precision", "recall", "density", "coverage"))
    assert (cwd / "samples.png").stat().st_size > 10_000
