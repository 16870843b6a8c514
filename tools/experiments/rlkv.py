"""RLKV vs DuoAttention vs random head allocation on pointer chasing (docs/rlkv.md).

1. Pretrain the base (`recipe=pointer_chase_lm`), or reuse `--base RUN_DIR`.
2. Probe it through the real CLI, each arm from the same base (`init_from=`):
     rlkv          GRPO on the deployment task (the chain with its stopping rule), reward = exact match
     duo_lookup    DuoAttention's distillation on a retrieval proxy (one hop: `data.train_task=lookup`), as in the paper
     duo_chain     the same distillation on the deployment task (an ablation the paper does not run)
     random        uniform random gates, `--random-seeds` draws
3. Evaluate every allocation with the real mixed KV cache (greedy, 1 sink + 4 recent) on held-out chains at
   every sparsity k/8, plus single-head knock-outs (how much compressing one head alone costs).

Writes OUT/{summary.json, table.md} and docs/img/rlkv_gates.png, docs/img/rlkv_accuracy.png.

    python tools/experiments/rlkv.py [--base RUN_DIR] [--steps 150] [--n-eval 1000] [--out runs/experiments/rlkv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from framework.data.pointer_chase import EOS, PAD, chase_rows, prompt_length  # noqa: E402
from framework.hub import load_weights_into  # noqa: E402
from framework.models.transformer import TransformerLM  # noqa: E402
from framework.probes.allocation import HeadAllocation, select_full_heads  # noqa: E402
from framework.probes.base import accuracy_at  # noqa: E402

ARMS = {
    "rlkv": ["module=rlkv"],
    "duo_lookup": ["module=duo_attention", "data.train_task=lookup", "optimizer.lr=0.02"],
    "duo_chain": ["module=duo_attention", "optimizer.lr=0.02"],
}
WINDOW = (1, 4)


def cli(args: list[str], run_dir: Path) -> Path:
    """`python -m framework.train ARGS` into `run_dir`, unless it already finished there."""
    if not (run_dir / "results.json").exists():
        cmd = [sys.executable, "-m", "framework.train", *args, "threads=1", "trainer.enable_progress_bar=false",
               f"hydra.run.dir={run_dir}"]
        print("+", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return run_dir


def load_base(run_dir: Path) -> TransformerLM:
    spec = json.loads((run_dir / "model_config.json").read_text())
    return load_weights_into(TransformerLM(**spec["config"]), run_dir).eval()


def evaluate(model: TransformerLM, gates: torch.Tensor, prompt: torch.Tensor, answer: torch.Tensor,
             sparsities: list[float], seed: int = 0) -> list[float]:
    return [float(accuracy_at(model, prompt, answer, select_full_heads(gates, s, seed), WINDOW, EOS, PAD).mean())
            for s in sparsities]


def knockouts(model: TransformerLM, prompt: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Accuracy drop when only head (l, h) is compressed: a ground-truth importance map for the gates."""
    depth, heads = len(model.blocks), model.blocks[0].attn.kv_heads
    full = float(accuracy_at(model, prompt, answer, None, WINDOW, EOS, PAD).mean())
    drop = torch.zeros(depth, heads)
    for layer in range(depth):
        for head in range(heads):
            keep = torch.ones(depth, heads, dtype=torch.bool)
            keep[layer, head] = False
            drop[layer, head] = full - float(accuracy_at(model, prompt, answer, keep, WINDOW, EOS, PAD).mean())
    return drop


def plots(summary: dict, img: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    maps = {name: torch.tensor(summary["gates"][name]) for name in ARMS}
    maps["knock-out drop"] = torch.tensor(summary["knockout_drop"])
    fig, axes = plt.subplots(1, len(maps), figsize=(3.2 * len(maps), 2.6))
    for k, (ax, (name, values)) in enumerate(zip(axes, maps.items(), strict=True)):
        im = ax.imshow(values.numpy(), vmin=0, vmax=1, cmap="viridis")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("KV head")
        if k == 0:
            ax.set_ylabel("layer")
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        for (i, j), v in ((ij, float(values[ij])) for ij in [(i, j) for i in range(values.shape[0])
                                                             for j in range(values.shape[1])]):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.5 else "k")
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    fig.savefig(img / "rlkv_gates.png", dpi=120, bbox_inches="tight")
    plt.close(fig)

    s = summary["sparsities"]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name in ARMS:
        ax.plot(s, summary["accuracy"][name], marker="o", label=name)
    rnd = torch.tensor(summary["accuracy"]["random_runs"])
    ax.plot(s, rnd.mean(0).numpy(), marker="s", color="gray", label=f"random (mean of {rnd.shape[0]})")
    ax.fill_between(s, rnd.min(0).values.numpy(), rnd.max(0).values.numpy(), color="gray", alpha=0.2)
    ax.axhline(summary["full_cache"], color="k", ls=":", lw=1, label="full cache")
    ax.set_xlabel("sparsity s (fraction of KV heads compressed to 1 sink + 4 recent)")
    ax.set_ylabel("exact match (held-out chains)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8, loc="lower left")
    fig.savefig(img / "rlkv_accuracy.png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def markdown(summary: dict) -> str:
    s = summary["sparsities"]
    head = "| arm | " + " | ".join(f"s={x:g}" for x in s) + " |"
    lines = [head, "|---" * (len(s) + 1) + "|"]
    rows = {**{k: summary["accuracy"][k] for k in ARMS}, "random (mean)": summary["accuracy"]["random_mean"]}
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    lines.append(f"\nfull cache: {summary['full_cache']:.3f}; n = {summary['n_eval']} held-out chains")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, help="a finished pointer_chase_lm run dir (default: train one in OUT)")
    parser.add_argument("--steps", type=int, default=150, help="RLKV probe steps")
    parser.add_argument("--duo-steps", type=int, default=600,
                        help="DuoAttention steps (a distillation step costs about a tenth of an RLKV step)")
    parser.add_argument("--random-seeds", type=int, default=5)
    parser.add_argument("--n-eval", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "experiments" / "rlkv")
    parser.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every probe run")
    parser.add_argument("--plots-only", action="store_true", help="redraw the PNGs from OUT/summary.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.plots_only:
        plots(json.loads((args.out / "summary.json").read_text()), args.img)
        return
    base = args.base or cli(["recipe=pointer_chase_lm"], args.out / "base")
    common = ["recipe=rlkv_probe", f"init_from={base}", "trainer.val_check_interval=null",
              "trainer.limit_val_batches=1", *args.set]
    steps = {"rlkv": args.steps, "duo_lookup": args.duo_steps, "duo_chain": args.duo_steps}
    runs = {name: cli([*common, *extra, f"trainer.max_steps={steps[name]}"], args.out / name)
            for name, extra in ARMS.items()}

    model = load_base(base)
    rows = chase_rows(args.n_eval, torch.Generator().manual_seed(20_261_202))
    p = prompt_length(8)
    prompt, answer = rows[:, :p], rows[:, p:]
    depth, heads = len(model.blocks), model.blocks[0].attn.kv_heads
    sparsities = [k / (depth * heads) for k in range(depth * heads + 1)]
    gates = {name: HeadAllocation.load(run).tensor() for name, run in runs.items()}
    accuracy = {name: evaluate(model, g, prompt, answer, sparsities) for name, g in gates.items()}
    random_runs = [evaluate(model, torch.rand(depth, heads, generator=torch.Generator().manual_seed(k)), prompt,
                            answer, sparsities) for k in range(args.random_seeds)]
    accuracy["random_runs"] = random_runs
    accuracy["random_mean"] = torch.tensor(random_runs).mean(0).tolist()
    summary = {
        "sparsities": sparsities, "n_eval": args.n_eval, "window": WINDOW,
        "full_cache": float(accuracy_at(model, prompt, answer, None, WINDOW, EOS, PAD).mean()),
        "accuracy": accuracy, "gates": {k: v.tolist() for k, v in gates.items()},
        "knockout_drop": knockouts(model, prompt, answer).tolist(),
        "probe_results": {k: json.loads((r / "results.json").read_text())["metrics"] for k, r in runs.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    (args.out / "table.md").write_text(markdown(summary) + "\n")
    args.img.mkdir(parents=True, exist_ok=True)
    plots(summary, args.img)
    print(markdown(summary))


if __name__ == "__main__":
    main()
