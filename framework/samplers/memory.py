"""What dynamic data selection keeps on each rank, in bytes: the formulas docs/data_agent.md states, checked against the
tensors a run holds (tests/samplers/test_memory.py).

`python -m framework.samplers.memory --out docs/bench/selection_memory.md` writes the table the docs quote (an
ImageNet-sized fit); `--n --dim --classes --ranks --batch` size another.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

# the rows of the table, in order: (key, what it is)
PARTS = (
    ("table", "score table: scores, running mean and variance (float64), last seen and count (int64)"),
    ("sampler", "the epoch's selection (int64, padded to the ranks) and loss weights (float32)"),
    ("amortised", "`data_agent_amortised`: the epoch's index, α, β, CE and uncertainty per sample"),
    ("amortised_keys", "`data_agent_amortised`: the update subsample's key per sample (a learning epoch)"),
    ("amortised_subsample", "`data_agent_amortised`: the update subsample's features and index"),
    ("amortised_before", "`data_agent_amortised` before issue 34: the epoch's gathered index, features, logits "
                         "and targets (also in every mid-epoch checkpoint)"),
    ("agent_rollout", "`data_agent`: PPO's rollout of `update_every` gathered steps (float32 states)"),
    ("step_gather", "every policy that reads features: one gathered step (index, targets, features, logits)"),
    ("step_gather_before", "the same before issue 34 (every field as float64)"),
)


def selection_memory(n: int, dim: int, classes: int, *, ratio: float = 0.5, ranks: int = 1, batch: int = 64,
                     feature_bytes: int = 4, logit_bytes: int = 4, update_size: int | None = 256,
                     update_every: int = 10) -> dict[str, int]:
    """Bytes held on every rank by each part of a selection over `n` samples (feature width `dim`, `classes` logits,
    `ranks` ranks of `batch` samples a step); the sampler's padding at most `ranks` − 1 samples."""
    kept = max(1, math.floor(ratio * n))  # samples a pruned epoch trains on: the epochs whose end scores
    padded = kept + ranks - 1  # with the sampler's padding, each rank's shard equally long
    step = ranks * batch  # one gathered step
    sample = dim * feature_bytes + classes * logit_bytes
    subsample = padded if update_size is None else min(update_size, kept)
    return {
        "table": 40 * n,
        "sampler": 8 * (n + ranks - 1) + 4 * n,
        "amortised": padded * (8 + 4 * 4),
        "amortised_keys": 8 * n,
        "amortised_subsample": subsample * (dim * feature_bytes + 8),
        "amortised_before": padded * (16 + sample),
        "agent_rollout": update_every * step * (4 * dim + 4 * 4),
        "step_gather": step * (16 + sample),
        "step_gather_before": step * 8 * (2 + dim + classes),
    }


def _size(b: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b} B"


def table(n: int, dim: int, classes: int, ranks: int, batch: int, ratio: float = 0.5) -> str:
    """The markdown table: every part in float32 and in bf16-mixed (features and logits in bfloat16)."""
    fp32 = selection_memory(n, dim, classes, ratio=ratio, ranks=ranks, batch=batch)
    bf16 = selection_memory(n, dim, classes, ratio=ratio, ranks=ranks, batch=batch, feature_bytes=2, logit_bytes=2)
    lines = [f"N = {n:,} samples, D = {dim}, C = {classes}, ρ = {ratio}, {ranks} ranks × batch {batch}; per rank:", "",
             "| part | float32 | bf16-mixed |", "|---|---|---|"]
    lines += [f"| {what} | {_size(fp32[key])} | {_size(bf16[key])} |" for key, what in PARTS]
    now = ("table", "sampler", "amortised", "amortised_keys", "amortised_subsample")
    lines.append(f"| `data_agent_amortised` in all: the first five rows | {_size(sum(fp32[k] for k in now))} | "
                 f"{_size(sum(bf16[k] for k in now))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Print (or write with --out) the table for a fit's sizes; the defaults are ImageNet-1k with a ResNet-50."""
    parser = argparse.ArgumentParser(prog="python -m framework.samplers.memory", description=__doc__)
    parser.add_argument("--n", type=int, default=1_281_167, help="training samples (ImageNet-1k)")
    parser.add_argument("--dim", type=int, default=2048, help="feature width (ResNet-50's pooled features)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256, help="samples per rank and step")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    text = table(args.n, args.dim, args.classes, args.ranks, args.batch, args.ratio)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"<!-- written by `python -m framework.samplers.memory --out {args.out}` -->\n\n{text}")
    print(text, end="")


if __name__ == "__main__":
    main()
