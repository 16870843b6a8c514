"""OLion vs torch.optim.Muon, Lion and AdamW, side by side in one run.

(a) optimizer step time on the parameter set of a 6-layer, d=384 transformer (median of N interleaved rounds), as
    ratios to AdamW and to torch.optim.Muon, for OLion's default and each Newton–Schulz path pinned (dtype fp32 /
    bf16, standard / Gram form), with each path's sign agreement with float64 NS5; (b) OLion's step time under DDP
    on 2 gloo processes, round-robin Newton–Schulz owners vs every rank computing everything, as a ratio;
    (c) validation bits-per-byte on `char_lm` after the same number of steps, each optimizer at its best lr of a
    5-point sweep (extended past an edge best), with the loss curves as a PNG, and (c') every NS path at the
    default's best lr; (d) batched vs per-matrix Newton–Schulz; (e) the lr ratio OLion/AdamW at which OLion first
    matches AdamW's best, on a new user's MLP and on char_lm; (f) char_lm with OLion at its best lr and its AdamW
    branch (embeddings, head, norms, biases) at each of a few lrs. Every char_lm run is fresh (no reuse); the
    char_lm half lives in `_char_lm_sweep.py`.

    python tools/bench/optimizers.py [--steps 300] [--timing-steps 20] [--skip-quality] [--skip-ddp] [--out DIR]
    python tools/bench/optimizers.py --only c e --skip-paths    # the lr sweeps alone (no step times, no (c'))
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from framework.models.transformer import TransformerLM  # noqa: E402
from framework.optim import MuonAdamW, OLion, is_hidden_matrix, newton_schulz5  # noqa: E402
from framework.optim.newton_schulz import orthogonalize  # noqa: E402
from framework.optim.ns_dtype import fast_ns_dtype, measured_ratio  # noqa: E402
from framework.optim.peers import lion  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _char_lm_sweep import char_lm_tables, extend, first_match, print_grid, print_lr_ratio  # noqa: E402, F401

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
    else:  # olion_tied: the AdamW branch (the biases here) at OLion's lr, the default before issue 34
        opt = OLion(net.named_parameters(), lr=lr, **({"adamw_lr": None} if opt_name == "olion_tied" else {}))
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


def timing_tables(args: argparse.Namespace) -> dict:
    """Print (a), (d) and the NS paths' sign agreement; return their figures."""
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
    return {"step_seconds": times, "page_faults_per_step": faults, "ns_dtype": str(chosen), "bf16_ratio": ratio,
            "ns_paths": paths}


def ddp_table(args: argparse.Namespace, report: dict) -> None:
    """Print (b) and add it to `report`."""
    ddp = ddp_step_times(args.timing_steps)
    print(f"\n(b) OLion step time under DDP, 2 gloo processes x 1 thread, {TIMING_SET} parameters, median of "
          f"{args.timing_steps}")
    for mode, t in ddp.items():
        print(f"{mode:12s} {1e3 * t:9.1f} ms/step")
    print(f"round_robin / redundant: {ddp['round_robin'] / ddp['redundant']:.3f}  (goal ≤ 0.6)")
    report["ddp_step_seconds"] = ddp


def mlp_table(report: dict) -> None:
    """Print (e) and add it to `report`."""
    names = ("adamw", "olion", "olion_tied")
    mlp = [{"optimizer": o, "lr": lr, "loss": mlp_losses(o, lr)} for o in names for lr in MLP_GRID]
    print("\n(e) new-user MLP (16-64-64-4, batch 64, 24 steps, seed 0): held-out cross-entropy by lr (olion_tied: "
          "adamw_lr=None, the AdamW branch at OLion's lr)")
    mlp_best = print_grid(mlp, "loss", ".3f", names)
    report["mlp"] = {"runs": mlp, "lr_ratio": print_lr_ratio("mlp", mlp, "loss", mlp_best),
                     "lr_ratio_tied": print_lr_ratio("mlp", mlp, "loss", mlp_best, "olion_tied")}


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
    ap.add_argument("--only", nargs="+", choices=("a", "b", "c", "e"), default=("a", "b", "c", "e"),
                    help="sections to run (a: step times, NS paths, (d); b: DDP; c: char_lm sweep and (c'); e: MLP)")
    ap.add_argument("--skip-paths", action="store_true", help="skip (c'), every NS path at OLion's best lr")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.timing_steps = 60, 3
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"threads": args.threads}
    if "a" in args.only:
        report.update(timing_tables(args))
    if "b" in args.only and not args.skip_ddp:
        ddp_table(args, report)
    if "e" in args.only:
        mlp_table(report)
    if "c" in args.only and not args.skip_quality:
        char_lm_tables(args, report)
    (args.out / "optimizers.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
