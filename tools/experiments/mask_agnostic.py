"""When do appended masks hurt a masked diffusion LM, and does the mask-agnostic loss help? A map over seeds.

Per training tail length `max_eos` and seed: pretrain the needle MDLM (`recipe=mdlm_baseline`, MDLM loss only,
on rows with up to `max_eos` trailing EOS), then fine-tune every arm from that checkpoint at equal compute (same
steps, batch and constant lr; every arm keeps the MDLM loss; k1 = 2 and k2 ≤ 16 in fine-tuning):
  mdlm_only          no fine-tuning loss (the MDLM loss alone, continued)
  ce_many            CE on the many-mask view only
  ce_both            ½[CE(k1) + CE(k2)] without alignment
  mask_agnostic      ½[CE(k1) + CE(k2)] + λ·TV, stop-gradient anchor (the paper's form)
  mask_agnostic_sym  the same with the TV gradient through both views
Each model is evaluated on held-out prompts followed by m appended masks. A cell whose input is longer than every
row of the training data (prompt + answer + EOS tail) is marked `*`: there accuracy can fall for a second reason,
length extrapolation, besides the appended masks themselves. (The fine-tuning arms with a loss also see their
many-mask view, up to 16 appended masks, which reaches a little further for the shortest tails.)

Writes to --out: table.md (every cell, every seed), summary.json (the raw sweeps), map.png; run dirs go to --work.

    python tools/experiments/mask_agnostic.py                       # the CPU map (--size cpu)
    python tools/experiments/mask_agnostic.py --size demo           # one seed, ce_both vs mask_agnostic (make demo)
    python tools/experiments/mask_agnostic.py --size gpu            # key-value recall on one large GPU (bf16)
    [--seeds 0 1 2] [--tails 8 16 32] [--arms ...] [--pretrain-steps N] [--ft-steps N] [--jobs 2] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: fine-tuning arms: the overrides each adds to the base recipe (k1 = 2, k2 ≤ 16 for all that take a loss)
ARMS: dict[str, list[str]] = {
    "mdlm_only": [],
    "ce_many": ["loss=ce_many"],
    "ce_both": ["loss=ce_both"],
    "mask_agnostic": ["loss=mask_agnostic"],
    "mask_agnostic_sym": ["loss=mask_agnostic", "loss.divergence=tv_symmetric", "loss.stopgrad_anchor=false"],
}
LOSS_VIEWS = ["loss.k1=2", "loss.k_max=16"]

#: named sizes. `set` is added to every run; `smoke` shrinks a size to seconds (for tests on the CPU).
SIZES: dict[str, dict] = {
    "cpu": dict(recipe="mdlm_baseline", tails=[8, 16, 32], seeds=[0, 1, 2], arms=list(ARMS),
                ms=[0, 2, 4, 8, 16, 32, 48, 64, 96, 128], pretrain_steps=1000, ft_steps=200, ft_lr=6e-4, jobs=2,
                set=[], gpt2_control=[32]),
    # `make demo`: the small task (8 context slots, 8 symbols, 2 layers), one pretrained model, two arms
    "demo": dict(recipe="mdlm_baseline", tails=[8], seeds=[0], arms=["ce_both", "mask_agnostic"],
                 ms=[0, 2, 4, 8, 16, 32, 48, 64], pretrain_steps=700, ft_steps=200, ft_lr=6e-4, jobs=2,
                 set=["data.context_len=8", "data.n_symbols=8", "model.depth=2", "scheduler.warmup_steps=100"]),
    # key-value recall with a model wide and deep enough to learn it (conf/preset/mdlm_kv_recall/gpu.yaml), bf16
    # autocast on CUDA; one GPU, jobs run one after another. Budget: ≤ 8 minutes on one large GPU (not yet run).
    "gpu": dict(recipe="mdlm_kv_recall", tails=[32], seeds=[0], arms=["ce_both", "mask_agnostic"],
                ms=[0, 2, 4, 8, 16, 32, 48, 64, 96, 128], pretrain_steps=6000, ft_steps=500, ft_lr=3e-4, jobs=1,
                set=["size=gpu", "model.max_seq_len=192", "trainer.accelerator=auto", "trainer.precision=bf16-mixed",
                     "data.num_workers=4"]),
}
SMOKE = ["size=smoke", "trainer.val_check_interval=null", "trainer.limit_val_batches=0"]


def merge(overrides: list[str]) -> list[str]:
    """Overrides with one value per key, the later one winning (Hydra refuses a key given twice)."""
    by_key: dict[str, str] = {}
    for item in overrides:
        by_key[item.split("=", 1)[0]] = item
    return list(by_key.values())


def run(args: list[str], run_dir: Path, threads: int) -> dict:
    """One `framework.train` run into `run_dir` (skipped when it already finished); its mask sweep."""
    if not (run_dir / "mask_sweep.json").exists():
        cmd = [sys.executable, "-m", "framework.train", *args, f"threads={threads}", f"hydra.run.dir={run_dir}"]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "mask_sweep.json").read_text())


class Plan:
    """The runs of one size: who pretrains what, which arm fine-tunes which checkpoint, and their overrides."""

    def __init__(self, size: dict, work: Path, extra: list[str]):
        self.size, self.work, self.threads = size, work, 1
        sweep = "[" + ",".join(str(m) for m in size["ms"]) + "]"
        self.common = merge([f"recipe={size['recipe']}", f"callbacks.mask_sweep.ms={sweep}", *size["set"], *extra])

    def pretrain(self, tail: int, seed: int, init: str | None = None) -> dict:
        """The pretrained model; `init="gpt2"` is the control: the same run under GPT-2's N(0, 0.02) init."""
        args = [*self.common, f"data.max_eos={tail}", f"seed={seed}",
                f"trainer.max_steps={self.size['pretrain_steps']}", "module.extra_loss_after=0"]
        name = "pretrained" if init is None else f"pretrained_init_{init}"
        return run(args + ([f"model.init={init}"] if init else []), self.dir(tail, seed, name), self.threads)

    def finetune(self, tail: int, seed: int, arm: str) -> dict:
        loss = [*ARMS[arm], *LOSS_VIEWS] if ARMS[arm] else []
        args = [*self.common, *loss, f"data.max_eos={tail}", f"seed={seed}",
                f"init_from={self.dir(tail, seed, 'pretrained')}", "module.extra_loss_after=0",
                f"trainer.max_steps={self.size['ft_steps']}", f"optimizer.lr={self.size['ft_lr']}",
                "scheduler.warmup_steps=0", "scheduler.min_lr_ratio=1.0",  # a constant lr
                "trainer.val_check_interval=null", "trainer.limit_val_batches=0", "validate_before_fit=false"]
        return run(args, self.dir(tail, seed, arm), self.threads)

    def dir(self, tail: int, seed: int, name: str) -> Path:
        return self.work / f"tail{tail}" / f"seed{seed}" / name


def at(table: dict, key: str, m: int) -> float:
    return table[key][table["m"].index(m)]


def beyond(table: dict, m: int) -> bool:
    """True when the input with m appended masks is longer than every training row."""
    return at(table, "eval_len", m) > table["train_max_len"]


def markdown(sweeps: dict, size: dict) -> str:
    """Every cell: accuracy and TV to m = 2 by model, seed and training tail; `*` marks inputs beyond training."""
    ms, models = size["ms"], ["pretrained", *size["arms"]]
    lines = []
    for key, label in (("acc", "accuracy"), ("tv", "TV to m=2")):
        lines += [f"**{label}** (`*`: longer than every row of the training data)", "",
                  "| max_eos | seed | model | " + " | ".join(f"m={m}" for m in ms) + " |",
                  "|---|---|---|" + "---|" * len(ms)]
        for tail in size["tails"]:
            for seed in size["seeds"]:
                for model in models:
                    t = sweeps[(tail, seed, model)]
                    cells = [f"{at(t, key, m):.3f}{'*' if beyond(t, m) else ''}" for m in ms]
                    lines.append(f"| {tail} | {seed} | {model} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def verdicts(sweeps: dict, size: dict) -> str:
    """The reading, computed: where accuracy falls inside / beyond the training lengths, and TV vs equal CE."""
    out = []
    for tail in size["tails"]:
        for seed in size["seeds"]:
            p = sweeps[(tail, seed, "pretrained")]
            inside = [m for m in size["ms"] if not beyond(p, m)]
            outside = [m for m in size["ms"] if beyond(p, m)]
            ref = at(p, "acc", 2) if 2 in size["ms"] else max(p["acc"])
            fall_in = [m for m in inside if at(p, "acc", m) < ref - 0.05]
            fall_out = [m for m in outside if at(p, "acc", m) < ref - 0.05]
            line = (f"- max_eos={tail}, seed {seed}: pretrained acc at m=2 {ref:.3f}; falls by > 0.05 inside the "
                    f"training lengths at m = {fall_in or 'none'}; beyond them at m = {fall_out or 'none'}")
            if "mask_agnostic" in size["arms"] and "ce_both" in size["arms"]:
                ma, cb = sweeps[(tail, seed, "mask_agnostic")], sweeps[(tail, seed, "ce_both")]
                gap = {m: at(ma, "acc", m) - at(cb, "acc", m) for m in size["ms"]}
                wins = [m for m in size["ms"] if gap[m] > 0.01
                        or (abs(gap[m]) <= 0.01 and at(ma, "tv", m) < at(cb, "tv", m) - 0.01)]
                losses = [m for m in size["ms"] if at(cb, "acc", m) > at(ma, "acc", m) + 0.01]
                line += ("; mask_agnostic beats ce_both (acc +0.01, or equal acc and TV −0.01) at m = "
                         f"{wins or 'none'}, loses at m = {losses or 'none'}")
            out.append(line)
    for arm in [a for a in ("mask_agnostic", "mask_agnostic_sym") if a in size["arms"] and "ce_both" in size["arms"]]:
        for tail in size["tails"]:
            tally = {"wins": 0, "losses": 0, "ties": 0}  # beyond-training cells, accuracy ±0.01, over the seeds
            for seed in size["seeds"]:
                a, c = sweeps[(tail, seed, arm)], sweeps[(tail, seed, "ce_both")]
                for m in (m for m in size["ms"] if beyond(a, m)):
                    diff = at(a, "acc", m) - at(c, "acc", m)
                    tally["wins" if diff > 0.01 else "losses" if diff < -0.01 else "ties"] += 1
            out.append(f"- {arm} vs ce_both beyond the training lengths, max_eos={tail}, {len(size['seeds'])} seeds: "
                       f"higher accuracy (> +0.01) in {tally['wins']} cells, lower in {tally['losses']}, "
                       f"within ±0.01 in {tally['ties']}")
    return "\n".join(out)


def init_control(sweeps: dict, control: dict, size: dict) -> str:
    """The same pretraining under the recipe's init and under GPT-2's N(0, 0.02): accuracy by m."""
    ms = size["ms"]
    lines = ["**Initialisation control** (pretraining only, same seed, data and steps; chance is 1/n_symbols)", "",
             "| max_eos | seed | init | " + " | ".join(f"m={m}" for m in ms) + " |", "|---|---|---|" + "---|" * len(ms)]
    for (tail, seed, init), t in control.items():
        for name, table in (("recipe's", sweeps[(tail, seed, "pretrained")]), (init, t)):
            lines.append(f"| {tail} | {seed} | {name} | " + " | ".join(f"{at(table, 'acc', m):.3f}" for m in ms) + " |")
    return "\n".join(lines)


def side_by_side(sweeps: dict, size: dict) -> str:
    """The demo's table: one pretrained model and each arm, by m, with the training-length boundary marked."""
    tail, seed = size["tails"][0], size["seeds"][0]
    models = ["pretrained", *size["arms"]]
    p = sweeps[(tail, seed, "pretrained")]
    lines = ["| m | " + " | ".join(f"acc {n}" for n in models) + " | " + " | ".join(f"TV {n}" for n in models[1:])
             + " |", "|---|" + "---|" * (2 * len(models) - 1)]
    for m in size["ms"]:
        mark = " *" if beyond(p, m) else ""
        lines.append(f"| {m}{mark} | " + " | ".join(f"{at(sweeps[(tail, seed, n)], 'acc', m):.3f}" for n in models)
                     + " | " + " | ".join(f"{at(sweeps[(tail, seed, n)], 'tv', m):.3f}" for n in models[1:]) + " |")
    longest = p["train_max_len"]
    lines.append(f"\n`*`: the input (prompt + m masks) is longer than every row of the training data ({longest} "
                 "tokens). The arms' many-mask views also saw up to 16 appended masks in fine-tuning.")
    return "\n".join(lines)


def plot(sweeps: dict, size: dict, png: Path) -> None:
    from matplotlib.figure import Figure

    tails, models = size["tails"], ["pretrained", *size["arms"]]
    fig = Figure(figsize=(4.2 * len(tails), 3.6))
    axes = fig.subplots(1, len(tails), squeeze=False)[0]
    for ax, tail in zip(axes, tails, strict=True):
        for model in models:
            tables = [sweeps[(tail, s, model)] for s in size["seeds"]]
            mean = [sum(at(t, "acc", m) for t in tables) / len(tables) for m in size["ms"]]
            ax.plot(size["ms"], mean, marker="o", label=model)
        first_beyond = [m for m in size["ms"] if beyond(sweeps[(tail, size["seeds"][0], "pretrained")], m)]
        if first_beyond:
            ax.axvline(first_beyond[0], color="grey", ls=":", lw=1)
        ax.set(xlabel="appended masks m", ylabel=f"accuracy (mean of {len(size['seeds'])} seeds)",
               title=f"training tails ≤ {tail} (dotted: beyond training)", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="cpu")
    ap.add_argument("--smoke", action="store_true", help="the size's plan at the recipe's smoke size (seconds)")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--tails", type=int, nargs="+", help="training EOS tail lengths max_eos")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS))
    ap.add_argument("--pretrain-steps", type=int)
    ap.add_argument("--ft-steps", type=int)
    ap.add_argument("--jobs", type=int, help="runs in parallel (each gets threads = cores // jobs, at least 1)")
    ap.add_argument("--out", type=Path, help="where table.md, summary.json and map.png go")
    ap.add_argument("--work", type=Path, help="where the run dirs go (default: --out/runs)")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every run, e.g. data.context_len=8")
    args = ap.parse_args(argv)
    size = dict(SIZES[args.size])
    for key in ("seeds", "tails", "arms", "pretrain_steps", "ft_steps", "jobs"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    extra = list(args.set)
    if args.smoke:
        size.update(pretrain_steps=min(size["pretrain_steps"], 6), ft_steps=min(size["ft_steps"], 4))
        extra = [*SMOKE, "trainer.accelerator=cpu", "data.num_workers=0", *extra]
    out = args.out or REPO / "runs" / "experiments" / f"mask_agnostic_{args.size}"
    work = args.work or out / "runs"
    jobs = max(1, size["jobs"])
    plan = Plan(size, work, extra)

    start = time.time()
    cells = [(t, s) for t in size["tails"] for s in size["seeds"]]
    controls = [(t, size["seeds"][0], "gpt2") for t in size.get("gpt2_control", [])]
    runs = [(t, s, arm) for t, s in cells for arm in size["arms"]]
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # the cores are shared by the runs going at once
        plan.threads = max(1, (os.cpu_count() or 1) // min(jobs, len(cells)))
        pretrained = pool.map(lambda c: plan.pretrain(*c), cells)
        sweeps = {(t, s, "pretrained"): table for (t, s), table in zip(cells, pretrained, strict=True)}
        control = dict(zip(controls, pool.map(lambda c: plan.pretrain(*c), controls), strict=True))
        plan.threads = max(1, (os.cpu_count() or 1) // min(jobs, len(runs)))
        sweeps.update(zip(runs, pool.map(lambda r: plan.finetune(*r), runs), strict=True))
    minutes = (time.time() - start) / 60
    if minutes < 0.5 and (out / "summary.json").exists():  # every run was reused: keep the time they took
        minutes = json.loads((out / "summary.json").read_text()).get("minutes", minutes)

    command = "python tools/experiments/mask_agnostic.py " + " ".join(argv if argv is not None else sys.argv[1:])
    table = markdown(sweeps, size)
    reading = verdicts(sweeps, size)
    header = (f"Written by `{command.strip()}` in {minutes:.1f} min ({jobs} run(s) at a time on "
              f"{os.cpu_count()} cores); pretrain {size['pretrain_steps']} steps, "
              f"each arm {size['ft_steps']} fine-tuning steps.\n")
    text = header + "\n" + (side_by_side(sweeps, size) + "\n\n" if args.size == "demo" else "") + table + "\n" + reading
    if control:
        text += "\n\n" + init_control(sweeps, control, size)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(
        {"size": args.size, "smoke": args.smoke, "plan": size, "minutes": round(minutes, 2), "command": command.strip(),
         "sweeps": {f"tail{t}/seed{s}/{n}": v for (t, s, n), v in sweeps.items()},
         "init_control": {f"tail{t}/seed{s}/pretrained_init_{i}": v for (t, s, i), v in control.items()}}, indent=1))
    plot(sweeps, size, out / "map.png")


if __name__ == "__main__":
    main()
