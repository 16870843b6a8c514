"""Decode speed and KV bytes of the mixed per-head cache vs the full cache, next to the theory.

For each context length L the cache is preloaded with L positions of random keys/values (decode speed does not
depend on their values; a real prefill of 16k tokens would dominate the run), then `--steps` tokens are decoded
one at a time, full cache vs mixed caches at sparsity s (a fraction s of KV heads keep 16 sink + 64 recent
entries, RLKV's evaluation window W = 80). Tokens/s is the median of `--repeats` runs, interleaved so machine
load hits every configuration alike. Theory: memory-bound decode speed-up 1 / ((1 - s) + s · W / L).

    python tools/bench/kv_cache.py [--quick] [--lengths 1024 4096 16384] [--batches 1 4]

With batch 1 a tiny model's decode step is dominated by its fixed cost (weights, Python, kernel launches), so the
cache saves less time than bytes; batch 4 makes the cache the larger share of memory traffic, as in serving.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from framework.models.transformer import TransformerLM  # noqa: E402
from framework.probes.allocation import select_full_heads  # noqa: E402
from framework.probes.kv_cache import MixedKVCache, kv_fraction, theoretical_speedup  # noqa: E402

SINK, RECENT = 16, 64
MODEL = dict(vocab_size=256, dim=256, depth=4, heads=4, kv_heads=4)  # MHA, head_dim 64: the KV cache dominates


def decode_rate(model: TransformerLM, full_heads: torch.Tensor, length: int, steps: int, batch: int,
                kv: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
    """Tokens/s of `steps` single-token decode steps after `length` preloaded positions, and the KV bytes held."""
    cache = MixedKVCache(model, full_heads, (SINK, RECENT), capacity=length + steps + 1)
    cache.preload(kv)
    token = torch.randint(0, MODEL["vocab_size"], (batch, 1), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(token, cache=cache)  # warm-up step
        start = time.perf_counter()
        for _ in range(steps):
            model(token, cache=cache)
        seconds = time.perf_counter() - start
    return batch * steps / seconds, cache.nbytes()


def measure(lengths: list[int], sparsities: list[float], steps: int, repeats: int, batch: int) -> list[dict]:
    torch.manual_seed(0)
    model = TransformerLM(**MODEL, max_seq_len=max(lengths) + steps + 8).eval()
    shape = (MODEL["depth"], MODEL["kv_heads"])
    allocations = {s: select_full_heads(torch.rand(shape, generator=torch.Generator().manual_seed(1)), s)
                   for s in [0.0, *sparsities]}
    rows = []
    head_dim = MODEL["dim"] // MODEL["heads"]
    for length in lengths:
        g = torch.Generator().manual_seed(length)
        kv = [(torch.randn(batch, MODEL["kv_heads"], length, head_dim, generator=g),
               torch.randn(batch, MODEL["kv_heads"], length, head_dim, generator=g)) for _ in range(MODEL["depth"])]
        rates: dict[float, list[float]] = {s: [] for s in allocations}
        nbytes: dict[float, int] = {}
        for _ in range(repeats):
            for s, full in allocations.items():
                rate, nbytes[s] = decode_rate(model, full, length, steps, batch, kv)
                rates[s].append(rate)
        base = statistics.median(rates[0.0])
        for s in allocations:
            rate = statistics.median(rates[s])
            rows.append(dict(batch=batch, length=length, sparsity=s, tokens_per_s=rate, kv_bytes=nbytes[s],
                             kv_ratio=nbytes[s] / nbytes[0.0], speedup=rate / base,
                             kv_theory=kv_fraction(s, length + steps + 1, SINK + RECENT),
                             theory=theoretical_speedup(s, length, SINK + RECENT)))
    return rows


def table(rows: list[dict], steps: int) -> str:
    lines = [
        f"KV cache decode, TransformerLM dim {MODEL['dim']} × {MODEL['depth']} layers × {MODEL['kv_heads']} KV heads "
        f"(random weights, fp32), {steps} decode steps after L preloaded positions, window "
        f"{SINK}+{RECENT}, torch threads {torch.get_num_threads()}. Speed-ups are against the full cache measured in "
        "the same run.",
        "",
        "| batch | context L | cache | tokens/s | speed-up vs full | theory 1/((1-s)+sW/L) | KV MiB | KV vs full | "
        "theory KV fraction |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "full" if r["sparsity"] == 0 else f"mixed s={r['sparsity']:g}"
        lines.append(
            f"| {r['batch']} | {r['length']} | {name} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
            f"{r['theory']:.2f}x | {r['kv_bytes'] / 2**20:.1f} | {r['kv_ratio']:.3f} | {r['kv_theory']:.3f} |")
    return "\n".join(lines)


def main(quick: bool = False, lengths: list[int] | None = None, batches: list[int] | None = None) -> str:
    """Run the benchmark and return the markdown table (`quick`: 1k and 4k only, fewer steps)."""
    torch.set_num_threads(1)
    lengths = lengths or ([1024, 4096] if quick else [1024, 4096, 16384])
    steps, repeats = (8, 3) if quick else (32, 5)
    rows = [r for b in (batches or [1, 4]) for r in measure(lengths, [0.5, 0.75], steps, repeats, b)]
    return table(rows, steps)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 4k only, fewer steps (under a minute)")
    parser.add_argument("--lengths", type=int, nargs="+", help="context lengths (default 1024 4096 16384)")
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 4)")
    args = parser.parse_args()
    print(main(args.quick, args.lengths, args.batches))
