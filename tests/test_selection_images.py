"""tools/experiments/selection_images.py at its `--quick` size: sklearn's digits written as PNG files in an ImageFolder
tree with label noise, two policies trained through the real CLI at equal wall-clock, the results file."""

from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import REPO, run_cli
from PIL import Image

_spec = importlib.util.spec_from_file_location("selection_images", REPO / "tools" / "experiments" /
                                               "selection_images.py")
selection_images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(selection_images)


@pytest.mark.slow  # 9 s; make test selects among image-folder samples (tests/data/test_images.py)
def test_the_tree_holds_the_digits_with_the_stated_noise_and_two_policies_train_at_equal_wall_clock(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    launched = []

    def launch(args, env):
        launched.append(args)
        return run_cli(*args, env={"OMP_NUM_THREADS": env["OMP_NUM_THREADS"]}, timeout=300)

    record = selection_images.main(out, work, [0], 2, [0.2], ("full", "random"), size=16, limit=100,
                                   launch=launch)
    tree = work / "data" / "digits16_noise20"
    train, test = sorted((tree / "train").rglob("*.png")), sorted((tree / "test").rglob("*.png"))
    assert (len(train), len(test)) == (80, 20)
    assert not {p.name for p in train} & {p.name for p in test}  # the test images are held out
    with Image.open(train[0]) as image:
        assert image.size == (16, 16)
    # the noisy files sit in a class folder other than their digit's: the digit sklearn gives that image
    from sklearn.datasets import load_digits

    target = load_digits().target
    noisy = json.loads((tree / "noisy.json").read_text())
    assert len(noisy) == 16  # 20% of 80
    for entry in noisy:
        path = tree / entry["file"]
        assert path.is_file() and entry["given"] != entry["true"] == target[int(path.stem)]
        assert path.parent.name == str(entry["given"])
    clean = [p for p in train if f"train/{p.parent.name}/{p.name}" not in {e["file"] for e in noisy}]
    assert all(int(p.parent.name) == target[int(p.stem)] for p in clean + test)
    # each policy ran once through the CLI, under the same time budget, and the file reports what its run wrote
    assert [a[a.index("recipe=selection_compare") + 9] for a in launched] == ["sampler=full", "sampler=random"]
    assert all("trainer.max_time=00:00:00:02" in a for a in launched)
    saved = json.loads((out / "selection_images.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(record["summary"]))
    for row in saved["runs"]:
        run_dir = work / "runs" / "digits16_noise20" / "seed0" / row["policy"]
        results = json.loads((run_dir / "results.json").read_text())
        assert row["acc"] == 100 * results["metrics"]["test/val/acc"] and row["steps"] == results["global_step"] > 0
        assert 2.0 <= row["seconds"] < 6.0  # stopped by the budget, not by running out of epochs
        assert results["data"]["validation"] == "test" and results["data"]["val_images"] == 20
    full, rand = saved["summary"]
    assert (full["cost"], rand["cost"]) == (1.0, 0.5)
    # random's epochs pass over half the images (at this size an epoch's own overhead, not its steps, may set how
    # many epochs fit in the budget, so the epoch counts are not compared)
    per_epoch = {r["policy"]: r["samples"] / r["epochs"] for r in (full, rand)}
    assert per_epoch["random"] == pytest.approx(0.5 * per_epoch["full"], rel=0.1), per_epoch
    table = (out / "selection_images.md").read_text()
    assert f"| digits16_noise20 | random | {rand['acc']:.2f} ± 0.00 (n=1) | {rand['delta']:+.2f} |" in table
