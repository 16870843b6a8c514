"""The char_lm half of `tools/bench/optimizers.py`: (c) the lr sweep of every optimizer, (c') every Newton–Schulz
path at OLion's best lr, (f) OLion's AdamW-branch lr, each run a fresh `python -m framework.train` process."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from framework.optim.hybrid import DEFAULT_ADAMW_LR

REPO = Path(__file__).resolve().parents[2]

# 5-point grids centred on the previous sweep's best (AdamW 3e-3, OLion and Muon ≥ 1e-2, Lion 3e-4); a best lr on
# an edge extends its grid by one more point that way (at most MAX_EXTEND times), so every best printed is interior
LR_GRID = {
    "adamw": (1e-3, 2e-3, 3e-3, 6e-3, 1e-2),
    "olion": (3e-3, 1e-2, 2e-2, 4e-2, 8e-2),
    "muon": (3e-3, 1e-2, 2e-2, 4e-2, 8e-2),
    "lion": (1e-4, 2e-4, 3e-4, 6e-4, 1e-3),  # Lion wants a 3-10x smaller lr than AdamW (lion-pytorch README)
}
MAX_EXTEND = 2


def first_match(rows: list[dict], key: str, optimizer: str, target: float) -> dict | None:
    """The smallest lr at which `optimizer` reaches `target` (lower is better), or None."""
    hits = [r for r in rows if r["optimizer"] == optimizer and r[key] <= target]
    return min(hits, key=lambda r: r["lr"]) if hits else None


#: the NS paths of table (c'), as optimizer overrides (`olion` at its best lr is the default path)
PATH_OVERRIDES = {
    "olion_fp32": ("optimizer.ns_dtype=float32", "optimizer.ns_form=standard"),
    "olion_fp32_gram": ("optimizer.ns_dtype=float32", "optimizer.ns_form=auto"),
    "olion_bf16": ("optimizer.ns_dtype=bfloat16", "optimizer.ns_form=standard"),
    "olion_bf16_gram": ("optimizer.ns_dtype=bfloat16", "optimizer.ns_form=auto"),
}


def run_char_lm(optimizer: str, lr: float, steps: int, out: Path, path: str | None = None, seed: int = 0,
                extra: tuple[str, ...] = ()) -> dict:
    """One fresh char_lm run (an old run dir is deleted first, so a table never mixes in stale results)."""
    run_dir = out / f"{path or optimizer}_lr{lr:g}" if seed == 0 else out / f"{path or optimizer}_lr{lr:g}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "framework.train", "recipe=olion_char_lm", f"optimizer={optimizer}",
        f"optimizer.lr={lr}", f"trainer.max_steps={steps}", "trainer.val_check_interval=50", f"seed={seed}",
        "threads=1", "validate_before_fit=false", f"hydra.run.dir={run_dir}", *PATH_OVERRIDES.get(path, ()), *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode:
        return {"optimizer": optimizer, "lr": lr, "val_bpb": float("nan"), "error": proc.stderr[-500:]}
    res = json.loads((run_dir / "results.json").read_text())
    return {"optimizer": optimizer, "lr": lr, "val_bpb": res["metrics"]["val/bpb"], "seconds": res["seconds"],
            "csv": str(run_dir / "csv" / "metrics.csv")}


def best_of(rows: list[dict], key: str) -> dict[str, dict]:
    best: dict[str, dict] = {}
    for row in rows:
        name = row["optimizer"]
        if row[key] == row[key] and (name not in best or row[key] < best[name][key]):
            best[name] = row
    return best


def extend(rows: list[dict], key: str, grids: dict[str, list[float]]) -> list[tuple[str, float]]:
    """One more lr past the edge for each optimizer whose best sits on its grid's edge (same ratio as the edge)."""
    more = []
    for name, row in best_of(rows, key).items():
        lrs = sorted(grids[name])
        if row["lr"] == lrs[-1]:
            more.append((name, lrs[-1] * lrs[-1] / lrs[-2]))
        elif row["lr"] == lrs[0]:
            more.append((name, lrs[0] * lrs[0] / lrs[1]))
    for name, lr in more:
        grids[name].append(lr)
    return more


def quality(steps: int, out: Path, jobs: int) -> tuple[list[dict], dict[str, list[float]]]:
    grids = {name: list(lrs) for name, lrs in LR_GRID.items()}
    todo = [(o, lr) for o, lrs in grids.items() for lr in lrs]
    rows: list[dict] = []
    for _ in range(MAX_EXTEND + 1):
        with ThreadPoolExecutor(max_workers=jobs) as pool:  # one torch thread per job
            rows += list(pool.map(lambda a: run_char_lm(a[0], a[1], steps, out), todo))
        todo = extend(rows, "val_bpb", grids)
        if not todo:
            break
    return rows, grids


def plot_curves(best: dict[str, dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, row in best.items():
        steps, vals = [], []
        with open(row["csv"]) as fh:
            for rec in csv.DictReader(fh):
                if rec.get("val/bpb"):
                    steps.append(int(rec["step"]))
                    vals.append(float(rec["val/bpb"]))
        ax.plot(steps, vals, marker="o", label=f"{name} (lr {row['lr']:g})")
    ax.set(xlabel="step", ylabel="validation bits per byte", title="char_lm: each optimizer at its best lr")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def print_grid(rows: list[dict], key: str, fmt: str, names) -> dict[str, dict]:
    """One line per optimizer: every lr and its result, the best, and whether the best is inside the grid."""
    best = best_of(rows, key)
    for name in names:
        cells = sorted((r for r in rows if r["optimizer"] == name), key=lambda r: r["lr"])
        line = " ".join(f"{r['lr']:.2g}:{r[key]:{fmt}}" for r in cells)
        if name in best:
            lrs = [r["lr"] for r in cells]
            where = "interior" if lrs[0] < best[name]["lr"] < lrs[-1] else "EDGE"
            line += f"   best {best[name][key]:{fmt}} @ {best[name]['lr']:g} ({where})"
        print(f"{name:8s} {line}")
    return best


def print_lr_ratio(workload: str, rows: list[dict], key: str, best: dict[str, dict],
                   name: str = "olion") -> float | None:
    """Print and return the lr ratio `name`/AdamW at which `name` first matches AdamW's best (None: never)."""
    if "adamw" not in best:
        return None
    label, target = "OLion" if name == "olion" else name, f"{best['adamw'][key]:.3f} @ {best['adamw']['lr']:g}"
    hit = first_match(rows, key, name, best["adamw"][key])
    if hit is None:
        print(f"{workload}: {label} never matches AdamW's best ({target}) on its grid")
        return None
    ratio = hit["lr"] / best["adamw"]["lr"]
    lowest = hit["lr"] == min(r["lr"] for r in rows if r["optimizer"] == name)
    print(f"{workload}: {label} first matches AdamW's best ({target}) at lr {hit['lr']:g}: lr ratio {label}/AdamW "
          f"{'≤' if lowest else '='} {ratio:.3g}" + (" (its lowest grid lr: may be smaller)" if lowest else ""))
    return ratio


#: seeds of table (c'): one seed's bpb moves by ~0.02 with rounding-level changes at OLion's best lr (measured:
#: the fp32 Gram path at +0.023 and +0.005 of fp32 standard in two runs that differ only in matmul operand order)
PATH_SEEDS = (0, 1, 2)


def path_quality(olion_best: dict, steps: int, out: Path, jobs: int) -> dict[str, float]:
    """char_lm bpb of every NS path (the default too) at the default OLion's best lr, mean over `PATH_SEEDS`,
    against the fp32 standard path."""
    lr = olion_best["lr"]
    paths = ["olion (default)", *PATH_OVERRIDES]
    jobs_list = [(path, seed) for path in paths for seed in PATH_SEEDS]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(lambda job: run_char_lm("olion", lr, steps, out, job[0] if job[0] in PATH_OVERRIDES
                                                     else "olion_default", job[1]), jobs_list))  # own run dirs
    per_path: dict[str, list[float]] = {path: [] for path in paths}
    for (path, _), run in zip(jobs_list, runs, strict=True):
        per_path[path].append(run["val_bpb"])
    bpb = {path: statistics.fmean(values) for path, values in per_path.items()}
    print(f"\n(c') char_lm bits/byte after {steps} steps of each NS path at the default OLion's best lr {lr:g}, mean "
          f"of seeds {', '.join(map(str, PATH_SEEDS))}, vs olion_fp32 (goal: within 0.01)")
    for name, value in bpb.items():
        seeds = " ".join(f"{v:.3f}" for v in per_path[name])
        print(f"{name:18s} {value:.3f}  {value - bpb['olion_fp32']:+.3f}   (seeds: {seeds})")
    return bpb


def char_lm_tables(args: argparse.Namespace, report: dict) -> None:
    """Print (c) and (c') (unless --skip-paths), write the curves' PNG, and add their figures to `report`."""
    rows, grids = quality(args.steps, args.out, args.jobs)
    print(f"\n(c) char_lm validation bits/byte after {args.steps} steps, lr:bpb (lower is better); a best on "
          f"an edge extends that grid (at most {MAX_EXTEND} points)")
    best = print_grid(rows, "val_bpb", ".3f", LR_GRID)
    if "olion" in best and "adamw" in best:
        print(f"OLion − AdamW at best lr: {best['olion']['val_bpb'] - best['adamw']['val_bpb']:+.3f} bpb "
              "(goal ≤ 0)")
    ratio = print_lr_ratio("char_lm", rows, "val_bpb", best)
    if "olion" in best and not args.skip_paths:
        report["paths_bpb"] = path_quality(best["olion"], args.steps, args.out, args.jobs)
    if "olion" in best:
        report["adamw_branch_bpb"] = adamw_branch_quality(best["olion"], args.steps, args.out, args.jobs)
    png = args.out / "optimizers_char_lm.png"
    plot_curves(best, png)
    print(f"curves: {png}")
    report.update({"steps": args.steps, "runs": rows, "grids": grids, "best": best, "lr_ratio": ratio})


#: table (f): the lr of OLion's AdamW branch (embeddings, head, norms, biases) at OLion's best lr; None: tied to it
ADAMW_BRANCH_GRID = (DEFAULT_ADAMW_LR, 3e-3, 1e-2, None)


def adamw_branch_quality(olion_best: dict, steps: int, out: Path, jobs: int) -> dict[str, float]:
    """Print (f): char_lm bpb with OLion at its best lr and its AdamW branch at each lr of `ADAMW_BRANCH_GRID`."""
    lr = olion_best["lr"]
    # the default's run is (c)'s, at the same lr; an lr equal to OLion's is the tied run
    todo = [a for a in ADAMW_BRANCH_GRID if a not in (DEFAULT_ADAMW_LR, lr)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(lambda a: run_char_lm("olion", lr, steps, out, f"olion_adamw_lr{a}", extra=(
            f"optimizer.adamw_lr={'null' if a is None else a}",)), todo))
    bpb = {f"{DEFAULT_ADAMW_LR:g} (default)": olion_best["val_bpb"]}
    for a, run in zip(todo, runs, strict=True):
        bpb["tied to OLion's lr" if a is None else f"{a:g}"] = run["val_bpb"]
    print(f"\n(f) char_lm bits/byte after {steps} steps, OLion at its best lr {lr:g}, by the lr of its AdamW branch "
          "(embeddings, head, norms, biases)")
    for name, value in bpb.items():
        print(f"adamw_lr {name:20s} {value:.3f}")
    return bpb
