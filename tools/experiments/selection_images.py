"""Data selection on an image folder with a timm model, at equal wall-clock (issue 45; docs/data_agent.md "On an
image folder with a timm model").

1. Writes scikit-learn's 1797 digits as PNG files in an ImageFolder tree, upsampled (bilinear) to `--size`:
   `train/<class>/<i>.png` and a fixed held-out `test/<class>/<i>.png` (a fifth of the images, drawn once by
   `--data-seed`), which `data=images` reads as its validation and test split. With label noise, a stated fraction
   of the training files is moved to a wrong class folder (`corrupt_labels`, the noise `data=digits` uses; seeded
   by `--data-seed`), each moved file listed in the tree's `noisy.json`.
2. Trains through the real CLI, one run at a time in a subprocess of one thread: `recipe=selection_compare
   data=images model=timm model.name=test_resnet` (GroupNorm, so a pruned epoch that ends on a batch of one is
   trained too) with `sampler=` each policy, every policy stopped by Lightning's `trainer.max_time` after the same
   `--budget` seconds of fit. SGD-Nesterov at the lr, batch size and gradient clip of the benchmark's CNN workloads
   (`tools/bench/selection.py`); after 20 warm-up steps the lr stays constant (`scheduler.min_lr_ratio=1.0`), since a
   cosine planned in epochs would end at a different point of its decay for each policy when time stops the fit;
   `trainer.max_epochs` is too large to be reached, so no policy reaches its annealing epoch (δ) either. No
   validation during the fit (it would take a share of the budget that grows with the epochs a policy reaches); the
   test split is evaluated once, after the fit.
3. Writes OUT/selection_images.json (every run and the summary) and OUT/selection_images.md (the table: test
   accuracy mean ± sd over seeds, epochs, steps and sample passes reached in the budget, the selection's cost).

    python tools/experiments/selection_images.py [--seeds 0 1 2] [--budget 20] [--noise 0 0.2] [--out DIR]
        [--work DIR] [--quick]

`--quick`: a 100-image tree at 16x16, `full` and `random`, one seed, a 2-second budget (the test's size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.bench.selection import WORKLOADS  # noqa: E402

POLICIES = ("full", "random", "infobatch", "data_agent", "data_agent_amortised")
REFERENCE = "full"
TEST_FRACTION = 0.2
#: the benchmark's CNN workload's batch size, lr, timm model (test_resnet) and gradient-norm clip
_CNN = WORKLOADS["digits_cnn_noise20"]
BATCH_SIZE, LR, MODEL, CLIP = _CNN[0]["batch_size"], _CNN[2], _CNN[3], _CNN[4]
Launch = Callable[[list[str], dict[str, str]], subprocess.CompletedProcess]


def write_digits(root: Path, size: int, noise: float = 0.0, data_seed: int = 0, limit: int | None = None) -> dict:
    """sklearn's digits as `size`x`size` grayscale PNGs under root/train/<class>/ and root/test/<class>/, `noise` of
    the training files in a wrong class folder (listed in root/noisy.json); kept when root/manifest.json already
    says the same. Returns the manifest."""
    import numpy as np
    import torch
    from PIL import Image
    from sklearn.datasets import load_digits

    from framework.data.digits import corrupt_labels

    want = {"source": "sklearn.datasets.load_digits", "size": size, "noise": noise, "data_seed": data_seed,
            "limit": limit, "test_fraction": TEST_FRACTION}
    manifest = root / "manifest.json"
    if manifest.is_file() and {k: v for k, v in json.loads(manifest.read_text()).items() if k in want} == want:
        return json.loads(manifest.read_text())
    digits = load_digits()
    g = torch.Generator().manual_seed(data_seed)
    order = torch.randperm(len(digits.target), generator=g, device=g.device)[:limit].tolist()
    n_test = int(TEST_FRACTION * len(order))
    test, train = order[:n_test], order[n_test:]
    true = torch.tensor(digits.target[train], dtype=torch.long)
    given, moved = corrupt_labels(true, noise, 10, g)
    noisy = []
    for split, rows, labels in (("test", test, digits.target[test]), ("train", train, given.tolist())):
        for i, label in zip(rows, labels, strict=True):
            path = root / split / str(int(label)) / f"{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            pixels = (digits.images[i] * (255 / 16)).round().astype(np.uint8)  # 0..16 grey levels to 0..255
            Image.fromarray(pixels).resize((size, size), Image.BILINEAR).save(path)
    for k in moved.nonzero().flatten().tolist():
        noisy.append({"file": f"train/{int(given[k])}/{train[k]:04d}.png", "true": int(true[k]),
                      "given": int(given[k])})
    (root / "noisy.json").write_text(json.dumps(noisy, indent=1) + "\n")
    out = {**want, "train_images": len(train), "test_images": len(test), "noisy_files": len(noisy)}
    manifest.write_text(json.dumps(out, indent=1) + "\n")
    return out


def cli_args(source: Path, policy: str, seed: int, budget: int, size: int, run_dir: Path) -> list[str]:
    """The `python -m framework.train` arguments of one run."""
    return ["recipe=selection_compare", "data=images", f"data.source={source}", f"data.image_size={size}",
            "data.train_transform=none", f"data.batch_size={BATCH_SIZE}", "model=timm", f"model.name={MODEL}",
            "+model.norm_layer=groupnorm1", f"sampler={policy}", f"seed={seed}", f"optimizer.lr={LR}",
            "scheduler.min_lr_ratio=1.0", f"trainer.gradient_clip_val={CLIP}", "trainer.max_epochs=100000",
            f"trainer.max_time=00:00:{budget // 60:02d}:{budget % 60:02d}", "trainer.limit_val_batches=0",
            "trainer.enable_progress_bar=false", "threads=1", f"hydra.run.dir={run_dir}"]


def subprocess_launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.train", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=1800)


def run_one(launch: Launch, workload: str, source: Path, policy: str, seed: int, budget: int, size: int,
            run_dir: Path) -> dict:
    """One run through the CLI (reused when run_dir already holds its finished results.json); its figures."""
    results = run_dir / "results.json"
    args = cli_args(source, policy, seed, budget, size, run_dir)
    if not (results.is_file() and json.loads(results.read_text()).get("command", "").endswith(" ".join(args))):
        print(f"+ {workload} {policy} seed={seed}", flush=True)
        proc = launch(args, {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        if proc.returncode:
            raise RuntimeError(f"framework.train {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    done = json.loads(results.read_text())
    m = done["metrics"]
    return {"workload": workload, "policy": policy, "seed": seed, "acc": 100 * m["test/val/acc"],
            "steps": done["global_step"], "epochs": int(m["selection/epochs"]),
            "samples": int(m["selection/samples_seen"]), "cost": m["selection/cost"], "seconds": done["seconds"],
            "overhead_s": m["selection/overhead_s"], "run_dir": str(run_dir)}


def summarise(rows: list[dict]) -> list[dict]:
    """Per (workload, policy): the mean of each figure over seeds, the test accuracy's sd, and its gap to full's."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["policy"]), []).append(r)
    out = []
    for (workload, policy), rs in groups.items():
        accs = [r["acc"] for r in rs]
        mean = {k: statistics.mean(r[k] for r in rs) for k in ("acc", "steps", "epochs", "samples", "cost", "seconds")}
        out.append({"workload": workload, "policy": policy, "n": len(rs), **mean,
                    "sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                    "callback_share": statistics.mean(r["overhead_s"] / r["seconds"] for r in rs)})
    full = {s["workload"]: s for s in out if s["policy"] == REFERENCE}
    for s in out:
        ref = full.get(s["workload"])
        s["delta"] = s["acc"] - ref["acc"] if ref else None
        s["samples_vs_full"] = s["samples"] / ref["samples"] if ref else None
    return out


def markdown(summary: list[dict], budget: int) -> str:
    lines = [f"| workload | policy | test acc % (mean ± sd) | Δ vs full | epochs in {budget} s | steps "
             "| sample passes | vs full's | selection cost | callback share of fit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        delta = "–" if s["delta"] is None else f"{s['delta']:+.2f}"
        ratio = "–" if s["samples_vs_full"] is None else f"{s['samples_vs_full']:.2f}"
        lines.append(f"| {s['workload']} | {s['policy']} | {s['acc']:.2f} ± {s['sd']:.2f} (n={s['n']}) | {delta} "
                     f"| {s['epochs']:.1f} | {s['steps']:.0f} | {s['samples']:.0f} | {ratio} | {s['cost']:.3f} "
                     f"| {100 * s['callback_share']:.1f}% |")
    return "\n".join(lines)


def main(out: Path, work: Path, seeds: list[int], budget: int, noise: list[float], policies: tuple[str, ...] = POLICIES,
         size: int = 32, limit: int | None = None, launch: Launch = subprocess_launch) -> dict:
    """Write the trees, run every (workload, seed, policy) one after another, write OUT/selection_images.{json,md}."""
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise SystemExit(f"error: unknown policies {unknown}; valid: {', '.join(POLICIES)}")
    started = time.time()
    rows, trees = [], {}
    for fraction in noise:
        workload = f"digits{size}_noise{round(100 * fraction)}"
        source = work / "data" / workload
        trees[workload] = write_digits(source, size, fraction, limit=limit)
        for seed in seeds:  # seed-major: a change in the machine's load falls on every policy alike
            for policy in policies:
                rows.append(run_one(launch, workload, source, policy, seed, budget, size,
                                    work / "runs" / workload / f"seed{seed}" / policy))
    summary = summarise(rows)
    table = markdown(summary, budget)
    record = {"command": "python tools/experiments/selection_images.py " + " ".join(sys.argv[1:]),
              "model": MODEL, "budget_s": budget, "batch_size": BATCH_SIZE, "lr": LR, "clip": CLIP,
              "cores": os.cpu_count(), "load_average_at_end": list(os.getloadavg()),
              "sweep_minutes": round((time.time() - started) / 60, 1), "trees": trees, "summary": summary,
              "runs": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "selection_images.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "selection_images.md").write_text(table + "\n")
    print(table)
    return record


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=20, help="seconds of fit per run (trainer.max_time)")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.2], help="training label noise, per workload")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--size", type=int, default=32, help="the PNGs' side in pixels")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "experiments" / "selection_images")
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "experiments" / "selection_images" / "work",
                    help="where the image trees and the run dirs go")
    ap.add_argument("--quick", action="store_true", help="100 images at 16x16, full and random, 1 seed, 2 s")
    a = ap.parse_args()
    if a.quick:
        main(a.out, a.work, [0], 2, [0.2], ("full", "random"), size=16, limit=100)
    else:
        main(a.out, a.work, a.seeds, a.budget, a.noise, tuple(a.policies), a.size)
