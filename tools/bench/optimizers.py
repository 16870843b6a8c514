"""OLion vs Muon, Lion and AdamW, side by side in one run.

(a) optimizer step time on the parameter set of a 6-layer, d=384 transformer (median of N steps), as ratios to
    AdamW and OLion/Muon; (b) validation bits-per-byte on `char_lm` after the same number of steps, each
    optimizer at its best lr from a 3-point sweep, with the loss curves as a PNG.

    python tools/bench/optimizers.py [--steps 300] [--timing-steps 20] [--skip-quality] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from framework.models.transformer import TransformerLM  # noqa: E402
from framework.optim import MuonAdamW, OLion  # noqa: E402
from framework.optim.peers import lion  # noqa: E402

LR_GRID = {
    "adamw": (1e-3, 3e-3, 1e-2),
    "olion": (1e-3, 3e-3, 1e-2),
    "muon": (1e-3, 3e-3, 1e-2),
    "lion": (1e-4, 3e-4, 1e-3),  # Lion wants a 3-10x smaller lr than AdamW (lion-pytorch README)
}


def step_times(steps: int, threads: int, bf16: bool) -> dict[str, float]:
    """Median optimizer.step() seconds on a 6-layer d=384 transformer's parameters with fixed random grads.

    torch.optim.Muon always runs Newton-Schulz in bf16, which is ~30x slower than fp32 on CPUs without bf16
    matrix units, so on CPU the like-for-like Muon is `ortho_momentum` (the same NS code as OLion, in fp32,
    Muon's update with RMS matching); `--bf16` adds torch.optim.Muon and OLion-in-bf16 (2 steps each).
    """
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=256, dim=384, depth=6, heads=6)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    factories = {
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
        "olion": lambda ps: OLion(ps, lr=1e-3),  # NS in fp32 on CPU (bf16 on CUDA)
        "ortho_momentum": lambda ps: OLion(ps, lr=1e-3, sign=False),
        "lion": lambda ps: lion(ps, lr=1e-4),
    }
    slow = {
        "olion_bf16": lambda ps: OLion(ps, lr=1e-3, ns_dtype="bfloat16"),
        "muon_torch_bf16": lambda ps: MuonAdamW(ps, lr=1e-3),  # torch.optim.Muon: NS always in bf16
    }
    if bf16:
        factories.update(slow)
    out = {}
    for name, make in factories.items():
        opt = make(list(model.named_parameters()))
        warm, n = (1, 2) if name in slow else (3, steps)
        for _ in range(warm):
            opt.step()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def run_char_lm(optimizer: str, lr: float, steps: int, out: Path) -> dict:
    run_dir = out / f"{optimizer}_lr{lr:g}"
    if not (run_dir / "results.json").exists():
        cmd = [
            sys.executable, "-m", "framework.train", "recipe=olion_char_lm", f"optimizer={optimizer}",
            f"optimizer.lr={lr}", f"trainer.max_steps={steps}", "trainer.val_check_interval=50",
            "threads=1", "validate_before_fit=false", f"hydra.run.dir={run_dir}",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode:
            return {"optimizer": optimizer, "lr": lr, "val_bpb": float("nan"), "error": proc.stderr[-500:]}
    res = json.loads((run_dir / "results.json").read_text())
    return {"optimizer": optimizer, "lr": lr, "val_bpb": res["metrics"]["val/bpb"], "seconds": res["seconds"],
            "csv": str(run_dir / "csv" / "metrics.csv")}


def quality(steps: int, out: Path, jobs: int) -> list[dict]:
    grid = [(o, lr) for o, lrs in LR_GRID.items() for lr in lrs]
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # one torch thread per job
        return list(pool.map(lambda a: run_char_lm(a[0], a[1], steps, out), grid))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="training steps per char_lm run")
    ap.add_argument("--timing-steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the step-time table")
    ap.add_argument("--jobs", type=int, default=2, help="char_lm runs in parallel (one thread each)")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="also time torch.optim.Muon and OLion with bf16 NS")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "optimizers")
    ap.add_argument("--quick", action="store_true", help="5 timing steps, 60 training steps per run (a smoke size)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.timing_steps = 60, 5
    args.out.mkdir(parents=True, exist_ok=True)

    times = step_times(args.timing_steps, args.threads, args.bf16)
    print(f"\n(a) optimizer step time, 6-layer d=384 transformer parameters, median of {args.timing_steps} "
          f"steps, {args.threads} thread(s), {torch.__version__} CPU")
    print(f"{'optimizer':16s} {'ms/step':>9s} {'× AdamW':>8s}")
    for name, t in times.items():
        print(f"{name:16s} {1e3 * t:9.1f} {t / times['adamw']:8.2f}")
    print(f"OLion / Muon (ortho_momentum: same NS code and dtype): {times['olion'] / times['ortho_momentum']:.3f}"
          "  (goal ≤ 1.05)")
    if "muon_torch_bf16" in times:
        print(f"OLion(bf16 NS) / torch.optim.Muon (bf16 NS):          "
              f"{times['olion_bf16'] / times['muon_torch_bf16']:.3f}")
    report = {"step_seconds": times, "threads": args.threads}

    if not args.skip_quality:
        rows = quality(args.steps, args.out, args.jobs)
        best = {}
        for row in rows:
            if row["val_bpb"] == row["val_bpb"] and (
                row["optimizer"] not in best or row["val_bpb"] < best[row["optimizer"]]["val_bpb"]
            ):
                best[row["optimizer"]] = row
        print(f"\n(b) char_lm validation bits/byte after {args.steps} steps (lower is better)")
        print(f"{'optimizer':10s} " + " ".join(f"{'lr':>8s} {'bpb':>6s}" for _ in range(3)) + "   best")
        for name in LR_GRID:
            cells = [r for r in rows if r["optimizer"] == name]
            line = " ".join(f"{r['lr']:8.0e} {r['val_bpb']:6.3f}" for r in cells)
            print(f"{name:10s} {line}   {best[name]['val_bpb']:.3f} @ {best[name]['lr']:g}" if name in best else line)
        if "olion" in best and "adamw" in best:
            print(f"OLion − AdamW at best lr: {best['olion']['val_bpb'] - best['adamw']['val_bpb']:+.3f} bpb "
                  "(goal ≤ 0)")
        png = args.out / "optimizers_char_lm.png"
        plot_curves(best, png)
        print(f"curves: {png}")
        report.update({"steps": args.steps, "runs": rows, "best": best})
    (args.out / "optimizers.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
