"""The mask-agnostic effect at the recipe's full size, over seeds (spec 1.4 protocol).

Per seed: pretrain the needle MDLM (`recipe=mdlm_baseline`, MDLM loss only), then fine-tune four arms from the
same checkpoint at equal compute (same steps, batch, lr; every arm keeps the MDLM loss):
  mdlm_only      no fine-tuning loss (the MDLM loss alone, continued)
  ce_many        CE on the many-mask view only
  ce_both        ½[CE(k1) + CE(k2)] without alignment
  mask_agnostic  ½[CE(k1) + CE(k2)] + λ·TV, stop-gradient anchor
k1 = 2 and k2 ≤ 16 in fine-tuning; evaluation goes to m = 64 appended masks (m = 48, 64 are longer than any
training sequence). Writes runs/experiments/mask_agnostic/{summary.json, table.md, effect.png}.

    python tools/experiments/mask_agnostic.py [--seeds 0 1 2] [--pretrain-steps 3000] [--ft-steps 200] [--jobs 2]
        [--set data.context_len=8 ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARMS = ("mdlm_only", "ce_many", "ce_both", "mask_agnostic")


def run(args: list[str], run_dir: Path) -> dict:
    if not (run_dir / "results.json").exists():
        cmd = [sys.executable, "-m", "framework.train", *args, "threads=1", f"hydra.run.dir={run_dir}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return json.loads((run_dir / "mask_sweep.json").read_text())


SET: list[str] = []  # extra overrides for every run (--set), e.g. a smaller task


def pretrain(seed: int, steps: int, out: Path) -> Path:
    run_dir = out / f"seed{seed}" / "pretrain"
    run(["recipe=mdlm_baseline", f"seed={seed}", f"trainer.max_steps={steps}", "module.extra_loss_after=0", *SET],
        run_dir)
    return run_dir


def finetune(seed: int, arm: str, pre: Path, steps: int, lr: float, out: Path) -> dict:
    recipe = ["recipe=mdlm_baseline"] if arm == "mdlm_only" else ["recipe=mdlm_mask_agnostic", f"loss={arm}"]
    args = [*recipe, f"seed={seed}", f"init_from={pre}", "module.extra_loss_after=0", f"trainer.max_steps={steps}",
            f"optimizer.lr={lr}", "scheduler.warmup_steps=0", "scheduler.min_lr_ratio=1.0",  # constant lr
            "trainer.val_check_interval=null",
            "trainer.limit_val_batches=0", "validate_before_fit=false", *SET]
    return run(args, out / f"seed{seed}" / arm)


def at(table: dict, key: str, m: int) -> float:
    return table[key][table["m"].index(m)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--pretrain-steps", type=int, default=2000)
    ap.add_argument("--ft-steps", type=int, default=200)
    ap.add_argument("--ft-lr", type=float, default=6e-4)
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel, one torch thread each")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "experiments" / "mask_agnostic")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every run, e.g. data.context_len=8")
    args = ap.parse_args()
    SET[:] = args.set

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        pres = dict(zip(args.seeds, pool.map(lambda s: pretrain(s, args.pretrain_steps, args.out), args.seeds),
                        strict=True))
        jobs = [(s, arm) for s in args.seeds for arm in ARMS]
        tables = dict(zip(jobs, pool.map(
            lambda j: finetune(j[0], j[1], pres[j[0]], args.ft_steps, args.ft_lr, args.out), jobs), strict=True))
    pre_tables = {s: json.loads((p / "mask_sweep.json").read_text()) for s, p in pres.items()}

    ms = (2, 16, 32, 48, 64)
    lines = ["| seed | model | " + " | ".join(f"acc m={m}" for m in ms) + " | TV m=48 | TV m=64 |",
             "|---|---|" + "---|" * (len(ms) + 2)]
    checks = {"inverse_scaling": [], "ma_acc": [], "ma_tv": [], "ma_beats_ce_both": []}
    for s in args.seeds:
        rows = {"pretrained": pre_tables[s], **{arm: tables[(s, arm)] for arm in ARMS}}
        for name, t in rows.items():
            lines.append(f"| {s} | {name} | " + " | ".join(f"{at(t, 'acc', m):.3f}" for m in ms)
                         + f" | {at(t, 'tv', 48):.3f} | {at(t, 'tv', 64):.3f} |")
        p, ma, cb = rows["pretrained"], rows["mask_agnostic"], rows["ce_both"]
        checks["inverse_scaling"].append(at(p, "acc", 48) <= at(p, "acc", 16) - 0.05)
        checks["ma_acc"].append(all(at(ma, "acc", m) >= 0.99 for m in (48, 64)))
        checks["ma_tv"].append(all(at(ma, "tv", m) <= 0.01 for m in (48, 64)))
        checks["ma_beats_ce_both"].append(all(
            at(ma, "acc", m) >= at(cb, "acc", m) and at(ma, "tv", m) < at(cb, "tv", m) for m in (48, 64)))
    table = "\n".join(lines)
    verdict = "\n".join(f"- {k}: {v} ({'holds' if all(v) else 'does NOT hold'} for every seed)"
                        for k, v in checks.items())
    print(table + "\n\n" + verdict)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n\n" + verdict + "\n")
    (args.out / "summary.json").write_text(json.dumps(
        {"pretrained": {str(s): t for s, t in pre_tables.items()},
         "arms": {f"{s}/{a}": t for (s, a), t in tables.items()}, "checks": checks, "args": vars(args)},
        indent=2, default=str))
    plot(pre_tables, tables, args.seeds, args.out / "effect.png")


def plot(pre: dict, tables: dict, seeds: list[int], png: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    for name, get in [("pretrained", lambda s: pre[s])] + [(a, lambda s, a=a: tables[(s, a)]) for a in ARMS]:
        ms = get(seeds[0])["m"]
        for key, ax in (("acc", ax1), ("tv", ax2)):
            mean = [sum(at(get(s), key, m) for s in seeds) / len(seeds) for m in ms]
            ax.plot(ms, mean, marker="o", label=name)
    ax1.set(xlabel="appended masks m", ylabel=f"accuracy (mean of {len(seeds)} seeds)")
    ax2.set(xlabel="appended masks m", ylabel="TV to m=2")
    for ax in (ax1, ax2):
        ax.axvline(16, color="grey", ls=":", lw=1)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
