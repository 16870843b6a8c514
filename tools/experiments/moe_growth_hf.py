"""Orthogonal growth of a transformers MoE vs the grown size trained from scratch at equal training compute
(issue 37; docs/growth.md). The recipe `moe_growth` with `model=hf_causal_lm` and an OLMoE config: byte-level LM on
CPython's pydoc text, AdamW, warmup-cosine. Per seed and arm, the small OLMoE (hidden 64, 2 layers, 4 experts,
top-1) trains S steps, grows at step S through the `orthogonal_growth` callback (zero-initialised interposed
copies, noisy expert copies with α = 0.01) and continues X steps; the control trains the grown size from scratch
for X + S·c_small/c_big steps, so both spend the same training compute (c: active parameters per token outside the
embedding table, the 6·N·tokens rule; attention's sequence term is left out). Arms: depth (4 layers, 4 experts
top-1), width (2 layers, 8 experts top-2), both (4 layers, 8 experts top-2).

Writes runs/experiments/moe_growth_hf/{table.md, summary.json}; docs/growth.md quotes table.md.

    python tools/experiments/moe_growth_hf.py [--seeds 0 1 2] [--grow-at 200] [--extra 200] [--jobs 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_growth import GROW, REPO, run  # noqa: E402

SMALL = dict(model_type="olmoe", hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, num_experts=4, num_experts_per_tok=1)
ARMS = {"depth": ({"depth_factor": 2, "width_factor": 1}, dict(num_hidden_layers=4)),
        "width": ({"depth_factor": 1, "width_factor": 2}, dict(num_experts=8, num_experts_per_tok=2)),
        "both": ({"depth_factor": 2, "width_factor": 2}, dict(num_hidden_layers=4, num_experts=8,
                                                              num_experts_per_tok=2))}
VOCAB = 256  # the byte corpus


def model_args(config: dict) -> list[str]:
    return ["model=hf_causal_lm", "model.config={" + ", ".join(f"{k}: {v}" for k, v in config.items()) + "}"]


def compute_per_token(config: dict) -> int:
    """Active parameters per token outside the embedding table (the LM head included)."""
    keys = ("hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok")
    h, layers, e, k = (config[key] for key in keys)
    attention = 4 * h * h  # q, k, v, o with as many KV heads as query heads
    expert = 3 * h * config["intermediate_size"]
    return layers * (attention + k * expert + h * e) + h * VOCAB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--grow-at", type=int, default=200, help="S: steps before growth")
    ap.add_argument("--extra", type=int, default=200, help="X: steps after growth")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "experiments" / "moe_growth_hf")
    args = ap.parse_args()
    s, x = args.grow_at, args.extra
    jobs, budget = [], {}
    for arm, (event, grown) in ARMS.items():
        big = {**SMALL, **grown}
        budget[arm] = x + round(s * compute_per_token(SMALL) / compute_per_token(big))
        for seed in args.seeds:
            jobs.append((seed, arm, ["recipe=moe_growth", *model_args(SMALL), f"seed={seed}", f"{GROW}at_step={s}",
                                     *(f"{GROW}{k}={v}" for k, v in event.items()), f"trainer.max_steps={s + x}",
                                     f"trainer.val_check_interval={s + x}", "trainer.check_val_every_n_epoch=null"]))
            jobs.append((seed, f"scratch_{arm}", ["recipe=moe_growth_scratch", *model_args(big), f"seed={seed}",
                                                  f"trainer.max_steps={budget[arm]}",
                                                  f"trainer.val_check_interval={budget[arm]}",
                                                  "trainer.check_val_every_n_epoch=null"]))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(zip([(j[0], j[1]) for j in jobs],
                           pool.map(lambda j: run(j[2], args.out / f"seed{j[0]}" / j[1]), jobs), strict=True))
    lines = ["| arm | seed | params (active) after | val loss before → after growth | final val loss, grown "
             "(S + X steps) | from scratch (steps) | grown − scratch |", "|---|---|---|---|---|---|---|"]
    wins, summary = [], {"args": {k: str(v) for k, v in vars(args).items()}, "scratch_steps": budget, "runs": {}}
    for arm in ARMS:
        for seed in args.seeds:
            r, sc = results[(seed, arm)]["metrics"], results[(seed, f"scratch_{arm}")]["metrics"]
            summary["runs"][f"{seed}/{arm}"], summary["runs"][f"{seed}/scratch_{arm}"] = r, sc
            wins.append(r["val/loss"] < sc["val/loss"])
            lines.append(f"| {arm} | {seed} | {int(r['growth/params_after']):,} ({int(r['growth/active_after']):,}) |"
                         f" {r['growth/val_loss_before']:.4f} → {r['growth/val_loss_after']:.4f} |"
                         f" {r['val/loss']:.4f} | {sc['val/loss']:.4f} ({budget[arm]}) |"
                         f" {r['val/loss'] - sc['val/loss']:+.4f} |")
    table = "\n".join(lines) + (
        f"\n\nOLMoE (transformers), S = {s} steps before growth, X = {x} after; each control trains the grown size for"
        f" the same compute; grown beats scratch in {sum(wins)}/{len(wins)} arm×seed pairs.")
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
