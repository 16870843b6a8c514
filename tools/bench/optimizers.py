"""OLion vs torch.optim.Muon, Lion and AdamW, side by side in one run.

(a) optimizer step time on the parameter set of a 6-layer, d=384 transformer (median of N interleaved rounds), as
    ratios to AdamW and to torch.optim.Muon, for OLion's default and each Newton–Schulz path pinned (dtype fp32 /
    bf16, standard / Gram form), with each path's sign agreement with float64 NS5; (b) OLion's step time under DDP
    on 2 gloo processes, round-robin Newton–Schulz owners vs every rank computing everything, as a ratio;
    (c) validation bits-per-byte on `char_lm` after the same number of steps, each optimizer at its best lr of a
    5-point sweep (extended past an edge best), with the loss curves as a PNG, and (c') every NS path at the
    default's best lr; (d) batched vs per-matrix Newton–Schulz; (e) the lr ratio OLion/AdamW at which OLion first
    matches AdamW's best, on a new user's MLP and on char_lm. Every char_lm run is fresh (no reuse).

    python tools/bench/optimizers.py [--steps 300] [--timing-steps 20] [--skip-quality] [--skip-ddp] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
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
from framework.optim import MuonAdamW, OLion, is_hidden_matrix, newton_schulz5  # noqa: E402
from framework.optim.newton_schulz import orthogonalize  # noqa: E402
from framework.optim.ns_dtype import fast_ns_dtype, measured_ratio  # noqa: E402
from framework.optim.peers import lion  # noqa: E402

# 5-point grids centred on the previous sweep's best (AdamW 3e-3, OLion and Muon ≥ 1e-2, Lion 3e-4); a best lr on
# an edge extends its grid by one more point that way (at most MAX_EXTEND times), so every best printed is interior
LR_GRID = {
    "adamw": (1e-3, 2e-3, 3e-3, 6e-3, 1e-2),
    "olion": (3e-3, 1e-2, 2e-2, 4e-2, 8e-2),
    "muon": (3e-3, 1e-2, 2e-2, 4e-2, 8e-2),
    "lion": (1e-4, 2e-4, 3e-4, 6e-4, 1e-3),  # Lion wants a 3-10x smaller lr than AdamW (lion-pytorch README)
}
MAX_EXTEND = 2
TIMING_SET = "6-layer d=384 transformer"


def timing_model() -> TransformerLM:
    """The parameter set every step time is measured on, with fixed random grads (same on every rank)."""
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=256, dim=384, depth=6, heads=6)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    return model


def median_step(opt: torch.optim.Optimizer, warm: int, n: int, sync=None) -> float:
    for _ in range(warm):
        opt.step()
    times = []
    for _ in range(n):
        if sync:
            sync()
        t0 = time.perf_counter()
        opt.step()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_factories() -> dict:
    """Every optimizer of table (a). `olion` is the default (NS dtype measured, Gram form from aspect 2); the
    `olion_*` rows pin one Newton–Schulz path each (`olion_fp32` is OLion's default before the measured choice)."""
    return {
        "adamw": lambda ps: torch.optim.AdamW([p for _, p in ps], lr=1e-3, weight_decay=0.1),
        "olion": lambda ps: OLion(ps, lr=1e-3, ns_batch=1),
        "olion_fp32": lambda ps: OLion(ps, lr=1e-3, ns_batch=1, ns_dtype="float32", ns_form="standard"),
        "olion_fp32_gram": lambda ps: OLion(ps, lr=1e-3, ns_batch=1, ns_dtype="float32", ns_form="auto"),
        "olion_bf16": lambda ps: OLion(ps, lr=1e-3, ns_batch=1, ns_dtype="bfloat16", ns_form="standard"),
        "olion_bf16_gram": lambda ps: OLion(ps, lr=1e-3, ns_batch=1, ns_dtype="bfloat16", ns_form="auto"),
        "olion_batched": lambda ps: OLion(ps, lr=1e-3, ns_batch=8),
        "ortho_momentum": lambda ps: OLion(ps, lr=1e-3, sign=False, ns_batch=1),
        "lion": lambda ps: lion([p for _, p in ps], lr=1e-4),
        "muon": lambda ps: MuonAdamW(ps, lr=1e-3),  # torch.optim.Muon itself: NS always in bf16
    }


def step_times(steps: int, threads: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median optimizer.step() seconds on the timing set's parameters, every optimizer in the same run, and the
    median minor page faults per step (fresh memory the step touched first: `getrusage`, Linux/macOS).

    The steps are interleaved (one step of each optimizer per round), so load on the machine hits every row alike.
    torch.optim.Muon always runs Newton–Schulz in bf16; where the measured choice says bf16 is slow (a CPU
    without bf16 matrix units, ~30x slower) it and the bf16 rows get 2 rounds instead of `steps`.
    """
    torch.set_num_threads(threads)
    model = timing_model()
    named = list(model.named_parameters())
    bf16_fast = fast_ns_dtype("cuda" if torch.cuda.is_available() else "cpu") == torch.bfloat16
    opts = {name: make(named) for name, make in step_factories().items()}
    times: dict[str, list[float]] = {name: [] for name in opts}
    faults: dict[str, list[int]] = {name: [] for name in opts}
    for rnd in range(steps + 1):  # round 0 warms up
        for name, opt in opts.items():
            if not bf16_fast and rnd > 2 and ("bf16" in name or name == "muon"):
                continue
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = median_step(opt, 0, 1)
            if rnd:
                times[name].append(t)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return ({name: statistics.median(ts) for name, ts in times.items()},
            {name: statistics.median(fs) for name, fs in faults.items()})


def ns_paths() -> dict[str, dict]:
    """For each NS path: (form, dtype) and its sign agreement with float64 NS5 on the timing set's first-step
    directions (random gradients) and on low-rank + noise matrices of the same shapes (the hard case)."""
    model = timing_model()
    shapes = [tuple(p.shape) for n, p in model.named_parameters() if p.ndim == 2 and is_hidden_matrix(n, p)]
    gen = torch.Generator().manual_seed(3)
    sets = {"timing set": [p.grad for n, p in model.named_parameters() if tuple(p.shape) in shapes and p.ndim == 2
                           and is_hidden_matrix(n, p)],
            "low-rank + noise": [torch.randn(s[0], 8, generator=gen) @ torch.randn(8, s[1], generator=gen)
                                 + 0.1 * torch.randn(*s, generator=gen) for s in shapes]}
    default = fast_ns_dtype("cuda" if torch.cuda.is_available() else "cpu")
    paths = {"olion (default)": ("auto", default), "olion_fp32": ("standard", torch.float32),
             "olion_fp32_gram": ("auto", torch.float32), "olion_bf16": ("standard", torch.bfloat16),
             "olion_bf16_gram": ("auto", torch.bfloat16)}
    out = {}
    for name, (form, dtype) in paths.items():
        row = {"form": form, "dtype": str(dtype).removeprefix("torch.")}
        for label, mats in sets.items():
            agree = [(torch.sign(orthogonalize(g, dtype=dtype, form=form).double())
                      == torch.sign(newton_schulz5(g.double(), dtype=None))).double().mean().item() for g in mats]
            row[label] = (statistics.fmean(agree), min(agree))
        out[name] = row
    return out


def _ddp_worker(rank: int, init_file: str, steps: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = timing_model()
        times = {}
        for mode in ("redundant", "round_robin"):
            opt = OLion(list(model.named_parameters()), lr=1e-3, distributed=mode, ns_batch=1)
            times[mode] = median_step(opt, 1, steps, sync=dist.barrier)
        if rank == 0:
            Path(out).write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()


def ddp_step_times(steps: int) -> dict[str, float]:
    """OLion step seconds on 2 gloo ranks x 1 thread: every rank runs every NS (redundant) vs owners (round_robin)."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        mp.start_processes(_ddp_worker, args=(str(Path(tmp) / "init"), steps, out), nprocs=2, join=True,
                           start_method="fork")
        return json.loads(Path(out).read_text())


def mlp_losses(opt_name: str, lr: float, steps: int = 24) -> float:
    """The issue's new-user check: a 16-64-64-4 MLP, batch 64, `steps` steps, same seed; held-out CE at the end."""
    torch.manual_seed(0)
    teacher = torch.randn(16, 4)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 4))
    if opt_name == "adamw":
        opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        opt = OLion(net.named_parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(64, 16, generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), (x @ teacher).argmax(1)).backward()
        opt.step()
    x = torch.randn(1024, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(net(x), (x @ teacher).argmax(1)).item()


MLP_GRID = tuple(round(1e-4 * 2 ** (k / 2), 7) for k in range(24))  # 1e-4 .. 4e-1, factor sqrt(2)


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


def run_char_lm(optimizer: str, lr: float, steps: int, out: Path, path: str | None = None, seed: int = 0) -> dict:
    """One fresh char_lm run (an old run dir is deleted first, so a table never mixes in stale results)."""
    run_dir = out / f"{path or optimizer}_lr{lr:g}" if seed == 0 else out / f"{path or optimizer}_lr{lr:g}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "framework.train", "recipe=olion_char_lm", f"optimizer={optimizer}",
        f"optimizer.lr={lr}", f"trainer.max_steps={steps}", "trainer.val_check_interval=50", f"seed={seed}",
        "threads=1", "validate_before_fit=false", f"hydra.run.dir={run_dir}", *PATH_OVERRIDES.get(path, ()),
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


def print_lr_ratio(workload: str, rows: list[dict], key: str, best: dict[str, dict]) -> float | None:
    if "adamw" not in best:
        return None
    hit = first_match(rows, key, "olion", best["adamw"][key])
    if hit is None:
        print(f"{workload}: OLion never matches AdamW's best ({best['adamw'][key]:.3f} @ {best['adamw']['lr']:g}) "
              "on its grid")
        return None
    ratio = hit["lr"] / best["adamw"]["lr"]
    lowest = hit["lr"] == min(r["lr"] for r in rows if r["optimizer"] == "olion")
    print(f"{workload}: OLion first matches AdamW's best ({best['adamw'][key]:.3f} @ {best['adamw']['lr']:g}) "
          f"at lr {hit['lr']:g}: lr ratio OLion/AdamW {'≤' if lowest else '='} {ratio:.3g}"
          + (" (OLion's lowest grid lr: the ratio may be smaller)" if lowest else ""))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="training steps per char_lm run")
    ap.add_argument("--timing-steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the step-time table")
    ap.add_argument("--jobs", type=int, default=2, help="char_lm runs in parallel (one thread each)")
    ap.add_argument("--skip-quality", action="store_true", help="skip (c), the char_lm lr sweep")
    ap.add_argument("--skip-ddp", action="store_true", help="skip (b), the 2-process DDP timing")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "optimizers")
    ap.add_argument("--quick", action="store_true", help="3 timing steps, 60 training steps per run (a smoke size)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.timing_steps = 60, 3
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"

    times, faults = step_times(args.timing_steps, args.threads)
    chosen = fast_ns_dtype("cuda" if torch.cuda.is_available() else "cpu")
    ratio = measured_ratio(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"\n(a) optimizer step time, {TIMING_SET} parameters, median of {args.timing_steps} interleaved rounds, "
          f"{args.threads} thread(s), torch {torch.__version__}, {device}")
    print(f"OLion's default NS dtype here: {str(chosen).removeprefix('torch.')} (bf16 matmul took {ratio:.2f}x "
          "fp32's in a re-measurement; bf16 is chosen at <= 0.75x)")
    print(f"{'optimizer':34s} {'ms/step':>9s} {'× AdamW':>8s} {'× Muon':>7s} {'page faults/step':>17s}")
    labels = {"muon": "muon (torch.optim.Muon, bf16 NS)", "lion": "lion (lion-pytorch)",
              "olion": "olion (default)", "olion_fp32": "olion_fp32 (standard NS, fp32)",
              "olion_fp32_gram": "olion_fp32_gram", "olion_bf16": "olion_bf16 (standard NS, bf16)",
              "olion_bf16_gram": "olion_bf16_gram"}
    for name, t in times.items():
        print(f"{labels.get(name, name):34s} {1e3 * t:9.1f} {t / times['adamw']:8.2f} {t / times['muon']:7.3f} "
              f"{faults[name]:17.0f}")
    print(f"OLion (default) / torch.optim.Muon: {times['olion'] / times['muon']:.3f}  (goal ≤ 1.0 where bf16 is "
          "native; ≤ 0.8, stretch 0.7)")
    print(f"OLion (default) / olion_fp32: {times['olion'] / times['olion_fp32']:.3f}  (goal ≤ 1.0)")
    print(f"OLion / ortho_momentum (Muon's update, same NS code and dtype): "
          f"{times['olion'] / times['ortho_momentum']:.3f}  (goal ≤ 1.05)")
    print(f"(d) batched / loop Newton–Schulz (olion_batched / olion, {device}): "
          f"{times['olion_batched'] / times['olion']:.3f}")
    paths = ns_paths()
    print("\nNS paths: sign agreement with float64 NS5 (mean over the matrices, min), goal ≥ 0.98")
    print(f"{'path':18s} {'form':9s} {'dtype':9s} {'timing set':>16s} {'low-rank + noise':>18s}")
    for name, row in paths.items():
        cells = [f"{row[k][0]:.4f} ({row[k][1]:.4f})" for k in ("timing set", "low-rank + noise")]
        print(f"{name:18s} {row['form']:9s} {row['dtype']:9s} {cells[0]:>16s} {cells[1]:>18s}")
    report: dict = {"step_seconds": times, "page_faults_per_step": faults, "threads": args.threads,
                    "ns_dtype": str(chosen), "bf16_ratio": ratio,
                    "ns_paths": paths}

    if not args.skip_ddp:
        ddp = ddp_step_times(args.timing_steps)
        print(f"\n(b) OLion step time under DDP, 2 gloo processes x 1 thread, {TIMING_SET} parameters, median of "
              f"{args.timing_steps}")
        for mode, t in ddp.items():
            print(f"{mode:12s} {1e3 * t:9.1f} ms/step")
        print(f"round_robin / redundant: {ddp['round_robin'] / ddp['redundant']:.3f}  (goal ≤ 0.6)")
        report["ddp_step_seconds"] = ddp

    mlp = [{"optimizer": o, "lr": lr, "loss": mlp_losses(o, lr)} for o in ("adamw", "olion") for lr in MLP_GRID]
    print("\n(e) new-user MLP (16-64-64-4, batch 64, 24 steps, seed 0): held-out cross-entropy by lr")
    mlp_best = print_grid(mlp, "loss", ".3f", ("adamw", "olion"))
    report["mlp"] = {"runs": mlp, "lr_ratio": print_lr_ratio("mlp", mlp, "loss", mlp_best)}

    if not args.skip_quality:
        rows, grids = quality(args.steps, args.out, args.jobs)
        print(f"\n(c) char_lm validation bits/byte after {args.steps} steps, lr:bpb (lower is better); a best on "
              f"an edge extends that grid (at most {MAX_EXTEND} points)")
        best = print_grid(rows, "val_bpb", ".3f", LR_GRID)
        if "olion" in best and "adamw" in best:
            print(f"OLion − AdamW at best lr: {best['olion']['val_bpb'] - best['adamw']['val_bpb']:+.3f} bpb "
                  "(goal ≤ 0)")
        ratio = print_lr_ratio("char_lm", rows, "val_bpb", best)
        if "olion" in best:
            report["paths_bpb"] = path_quality(best["olion"], args.steps, args.out, args.jobs)
        png = args.out / "optimizers_char_lm.png"
        plot_curves(best, png)
        print(f"curves: {png}")
        report.update({"steps": args.steps, "runs": rows, "grids": grids, "best": best, "lr_ratio": ratio})
    (args.out / "optimizers.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
