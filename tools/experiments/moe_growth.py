"""Orthogonal growth vs training from scratch at equal extra steps (recipe `moe_growth`; docs/growth.md).

Per seed, every grown arm trains the recipe's small MoE (2 layers, 4 experts, top-1) for S steps, grows it at
step S and continues for X steps (one warmup-cosine schedule over S + X); each control trains the grown size
from scratch for X steps (`moe_growth_scratch`, warmup-cosine over X). Arms:
  depth         interposition, zero-initialised copies      → 4 layers, 4 experts top-1
  depth_copy    interposition, plain copies (paper default) → 4 layers, 4 experts top-1
  depth_stack   stacking, zero-initialised copies           → 4 layers, 4 experts top-1
  width         noisy expert copies, α = 0.01               → 2 layers, 8 experts top-2
  both          depth (interposition, zero-init) + width     → 4 layers, 8 experts top-2
  small         no growth: the small model for S + X steps
Writes runs/experiments/moe_growth/{table.md, summary.json} and docs/img/growth_{curves,norm_profile}.png.

    python tools/experiments/moe_growth.py [--seeds 0] [--grow-at 200] [--extra 200] [--jobs 2] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
GROW = "callbacks.orthogonal_growth."
ARMS = {
    "depth": [f"{GROW}width_factor=1"],
    "depth_copy": [f"{GROW}width_factor=1", f"{GROW}zero_init_copies=false"],
    "depth_stack": [f"{GROW}width_factor=1", f"{GROW}depth_method=stack"],
    "width": [f"{GROW}depth_factor=1"],
    "both": [],
    "small": [],  # at_step past the end: never grows
}
SCRATCH = {"depth": ["model.depth=4", "model.num_experts=4", "model.top_k=1"],
           "width": ["model.depth=2", "model.num_experts=8", "model.top_k=2"],
           "both": ["model.depth=4", "model.num_experts=8", "model.top_k=2"]}
CONTROL = {"depth": "depth", "depth_copy": "depth", "depth_stack": "depth", "width": "width", "both": "both"}
SET: list[str] = []


def run(args: list[str], run_dir: Path) -> dict:
    """One `framework.train` run (skipped when its results.json exists); returns results.json."""
    if not (run_dir / "results.json").exists():
        cmd = [sys.executable, "-m", "framework.train", *args, "threads=1", "trainer.enable_progress_bar=false",
               f"hydra.run.dir={run_dir}", *SET]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return json.loads((run_dir / "results.json").read_text())


def val_curve(run_dir: Path, offset: int = 0) -> list[tuple[int, float]]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/loss")]
    return [(int(float(r["step"])) + offset, float(r["val/loss"])) for r in rows]


def load(run_dir: Path, ckpt: str, config: dict | None = None):
    """The model of `run_dir` from `checkpoints/<ckpt>` (its grown config unless `config` is given)."""
    from framework.models.moe import MoETransformerLM

    state = torch.load(run_dir / "checkpoints" / ckpt, weights_only=True, map_location="cpu")["state_dict"]
    model = MoETransformerLM(**(config or json.loads((run_dir / "model_config.json").read_text())["config"]))
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    return model


def norm_profiles(seed_dir: Path, step: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(at growth: the trained base grown by interposition and by stacking with plain copies; at the end of
    training: the depth arms and the from-scratch control), per-layer ‖W‖_F/√numel over all block matrices."""
    from framework.grow import grow, norm_profile

    small = {**json.loads((seed_dir / "depth_copy" / "model_config.json").read_text())["config"], "depth": 2}
    base = load(seed_dir / "depth_copy", f"step{step:06d}.ckpt", small)
    at_growth = {f"trained base, step {step}": norm_profile(base.blocks, "all")}
    for method in ("interposition", "stack"):
        grown = copy.deepcopy(base)
        grow(grown, depth_factor=2, depth_method=method)
        at_growth[f"{method} ×2 (plain copies)"] = norm_profile(grown.blocks, "all")
    at_end = {arm: norm_profile(load(seed_dir / arm, "last.ckpt").blocks, "all")
              for arm in ("depth", "depth_copy", "depth_stack", "scratch_depth")}
    return at_growth, at_end


def plot_profiles(profiles: tuple[dict[str, list[float]], dict[str, list[float]]], png: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8))
    for ax, (title, curves) in zip(fig.subplots(1, 2), zip(("at the growth step", "after the extra steps"), profiles,
                                                           strict=True), strict=True):
        for label, values in curves.items():
            ax.plot([(i + 0.5) / len(values) for i in range(len(values))], values, marker="o", markersize=4,
                    label=f"{label} ({len(values)} layers)")
        ax.set(xlabel="relative depth (layer + ½) / layers", ylabel="mean ‖W‖_F / √numel", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--grow-at", type=int, default=200, help="S: steps before growth")
    ap.add_argument("--extra", type=int, default=200, help="X: steps after growth (and for scratch)")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel, one torch thread each")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "experiments" / "moe_growth")
    ap.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every run")
    args = ap.parse_args()
    SET[:] = args.set
    s, x = args.grow_at, args.extra
    every = [f"trainer.val_check_interval={max(1, x // 3)}", "trainer.check_val_every_n_epoch=null",
             f"callbacks.checkpoint.every_n_train_steps={s}"]
    jobs = [(seed, arm, ["recipe=moe_growth", f"seed={seed}", f"{GROW}at_step={s if arm != 'small' else s + x + 1}",
                         f"trainer.max_steps={s + x}",
                         *every, *ARMS[arm]]) for seed in args.seeds for arm in ARMS]
    jobs += [(seed, f"scratch_{c}", ["recipe=moe_growth_scratch", f"seed={seed}", f"trainer.max_steps={x}", *every,
                                     *SCRATCH[c]]) for seed in args.seeds for c in SCRATCH]
    jobs.sort(key=lambda j: j[1] not in ("both", "scratch_both"))  # the longest first
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(zip([(j[0], j[1]) for j in jobs],
                           pool.map(lambda j: run(j[2], args.out / f"seed{j[0]}" / j[1]), jobs), strict=True))

    lines = ["| arm | params (active) after | train-batch loss before → after growth | val loss before → after"
             " growth | final val loss, grown | final val loss, scratch | grown − scratch |",
             "|---|---|---|---|---|---|---|"]
    summary: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": {}}
    wins = []
    for seed in args.seeds:
        for arm in ARMS:
            r = results[(seed, arm)]["metrics"]
            summary["runs"][f"{seed}/{arm}"] = r
            if arm == "small":
                lines.append(f"| small, no growth (seed {seed}) | – | – | – | {r['val/loss']:.4f} | – | – |")
                continue
            sc = results[(seed, f"scratch_{CONTROL[arm]}")]["metrics"]
            wins.append(r["val/loss"] < sc["val/loss"])
            lines.append(
                f"| {arm} (seed {seed}) | {int(r['growth/params_after']):,} ({int(r['growth/active_after']):,}) |"
                f" {r['growth/loss_before']:.4f} → {r['growth/loss_after']:.4f} |"
                f" {r['growth/val_loss_before']:.4f} → {r['growth/val_loss_after']:.4f} | {r['val/loss']:.4f} |"
                f" {sc['val/loss']:.4f} | {r['val/loss'] - sc['val/loss']:+.4f} |")
    table = "\n".join(lines) + (f"\n\nS = {s} steps before growth, X = {x} steps after (scratch: X steps);"
                                f" grown beats scratch in {sum(wins)}/{len(wins)} arm×seed pairs.")
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_curves(args, s)
    profiles = norm_profiles(args.out / f"seed{args.seeds[0]}", s)
    summary["norm_profiles"] = {"at_growth": profiles[0], "at_end": profiles[1]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_profiles(profiles, args.img / "growth_norm_profile.png")


def plot_curves(args: argparse.Namespace, s: int) -> None:
    from matplotlib.figure import Figure

    seed = args.seeds[0]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for arm in [*ARMS, *(f"scratch_{c}" for c in SCRATCH)]:
        curve = val_curve(args.out / f"seed{seed}" / arm, offset=s if arm.startswith("scratch") else 0)
        steps, values = zip(*curve, strict=True)
        ax.plot(steps, values, marker="o", markersize=3, ls="--" if arm.startswith("scratch") else "-", label=arm)
    before = [v for step, v in val_curve(args.out / f"seed{seed}" / "depth") if 0 < step <= s]
    if before:  # zoom on the part after the growth step (scratch starts near 5.5 nats/byte)
        ax.set_ylim(top=before[-1] + 0.6)
    ax.axvline(s, color="grey", ls=":", lw=1)
    ax.set(xlabel="step (scratch runs shifted to start at the growth step)", ylabel="val loss (nats/byte)",
           title=f"grow at step {s} vs grown size from scratch (seed {seed})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    args.img.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.img / "growth_curves.png", dpi=110)


if __name__ == "__main__":
    main()
