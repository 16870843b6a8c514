"""Decode speed and KV bytes of the mixed per-head cache vs the full cache, next to the theory.

For each context length L the cache is preloaded with L positions of random keys/values (decode speed does not
depend on their values; a real prefill of 16k tokens would dominate the run), then `--steps` tokens are decoded
one at a time, full cache vs mixed caches at sparsity s (a fraction s of KV heads keep 16 sink + 64 recent
entries, RLKV's evaluation window W = 80). Tokens/s is the median of `--repeats` runs, interleaved so machine
load hits every configuration alike. Theory: memory-bound decode speed-up 1 / ((1 - s) + s · W / L).

    python tools/bench/kv_cache.py [--quick] [--lengths 1024 4096 16384] [--batches 1 4] [--steps 32] [--repeats 11]

With batch 1 a tiny model's decode step is dominated by its fixed cost (weights, Python, kernel launches), so the
cache saves less time than bytes; batch 4 makes the cache the larger share of memory traffic, as in serving. The
column "bound" measures what any mixed cache could reach with this model: the full cache preloaded with only as many
positions as the mixed one holds ((1-s)·L + s·W per head), so the same fixed cost and the same KV bytes per step.
Both caches are the same class with buffers preallocated for the whole run (`capacity`): the full cache is the
mixed one with every head full, so it pays no growth and no head reordering.

Memory over a long decode (second table): after `--memory-steps` (1000) one-token steps at a fixed preloaded
context, is anything left allocated that was not there before, and did a step ever need more? Python's tracemalloc
does not see torch's storages, so the bench reads the process itself (Linux /proc): it resets the peak resident set
(`/proc/self/clear_refs` ← 5), notes the resident set (VmRSS) before the loop, and reads the peak (VmHWM) and the
resident set after it. Every step allocates its small activations (kilobytes, freed and reused by the allocator);
a cache that grew its buffers or concatenated keys per step would show megabytes here. It also checks that each
cache buffer is still the same storage (data pointer) after the loop: keys are written in place.
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
from framework.serving.kv_cache import MixedKVCache, kv_fraction, theoretical_speedup  # noqa: E402

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


def _proc_kib(field: str) -> int | None:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM); None off Linux."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith(field + ":")), None)


def _buffers(cache: MixedKVCache) -> list[tuple[int, tuple[int, ...]]]:
    return [(x.data_ptr(), tuple(x.shape)) for layer in cache.layers
            for x in (layer.k_full, layer.v_full, layer.k_stream, layer.v_stream) if x is not None]


def memory_over_decode(model: TransformerLM, full_heads: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]],
                       steps: int) -> dict:
    """Resident memory around `steps` one-token decode steps after the preloaded `kv` (see the module docstring)."""
    batch, length = kv[0][0].shape[0], kv[0][0].shape[2]
    cache = MixedKVCache(model, full_heads, (SINK, RECENT), capacity=length + steps + 1)
    cache.preload(kv)
    token = torch.zeros(batch, 1, dtype=torch.long)
    with torch.no_grad():
        model(token, cache=cache)  # the first step sizes the allocator's free lists
        before = _buffers(cache)
        try:
            Path("/proc/self/clear_refs").write_text("5")  # peak resident set := current
        except OSError:
            pass
        rss = _proc_kib("VmRSS")
        for _ in range(steps):
            model(token, cache=cache)
        peak, after = _proc_kib("VmHWM"), _proc_kib("VmRSS")
    same = _buffers(cache) == before
    return dict(batch=batch, length=length, steps=steps, rss=rss, peak=peak, after=after, same_buffers=same)


def _mib(kib: int | None, minus: int | None = 0) -> str:
    return "n/a" if kib is None or minus is None else f"{(kib - minus) / 1024:{'+.2f' if minus else '.1f'}}"


def memory_table(rows: list[dict]) -> str:
    lines = ["| batch | context L | cache | decode steps | RSS before MiB | peak RSS − before MiB | "
             "RSS after − before MiB | cache buffers kept |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = "full" if r["sparsity"] == 0 else f"mixed s={r['sparsity']:g}"
        lines.append(f"| {r['batch']} | {r['length']} | {name} | {r['steps']} | {_mib(r['rss'])} | "
                     f"{_mib(r['peak'], r['rss'])} | {_mib(r['after'], r['rss'])} | "
                     f"{'yes' if r['same_buffers'] else 'no'} |")
    return "\n".join(lines)


def random_kv(batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(length)
    shape = (batch, MODEL["kv_heads"], length, MODEL["dim"] // MODEL["heads"])
    return [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(MODEL["depth"])]


def setup(max_seq_len: int, sparsities: list[float]) -> tuple[TransformerLM, dict[float, torch.Tensor]]:
    """The random model and one allocation per sparsity (0 first: the full cache)."""
    torch.manual_seed(0)
    model = TransformerLM(**MODEL, max_seq_len=max_seq_len).eval()
    shape = (MODEL["depth"], MODEL["kv_heads"])
    allocations = {s: select_full_heads(torch.rand(shape, generator=torch.Generator().manual_seed(1)), s)
                   for s in [0.0, *sparsities]}
    return model, allocations


def measure(lengths: list[int], sparsities: list[float], steps: int, repeats: int, batch: int) -> list[dict]:
    model, allocations = setup(max(lengths) + steps + 8, sparsities)
    rows = []
    for length in lengths:
        kv = random_kv(batch, length)
        # the bound for sparsity s: the full cache holding as many entries as the mixed one, (1 - s)·L + s·W
        bound = {s: round((1 - s) * length + s * (SINK + RECENT)) for s in sparsities}
        runs = [(s, allocations[s], length, kv) for s in allocations]
        runs += [(-s, allocations[0.0], n, [(k[:, :, :n], v[:, :, :n]) for k, v in kv]) for s, n in bound.items()]
        rates: dict[float, list[float]] = {key: [] for key, *_ in runs}
        nbytes: dict[float, int] = {}
        for _ in range(repeats):
            for key, full, n, pairs in runs:
                rate, nbytes[key] = decode_rate(model, full, n, steps, batch, pairs)
                rates[key].append(rate)
        base = statistics.median(rates[0.0])
        for s in allocations:
            rate = statistics.median(rates[s])
            rows.append(dict(batch=batch, length=length, sparsity=s, tokens_per_s=rate, kv_bytes=nbytes[s],
                             kv_ratio=nbytes[s] / nbytes[0.0], speedup=rate / base,
                             bound=statistics.median(rates[-s]) / base if s else None,
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
        "| batch | context L | cache | tokens/s | speed-up vs full | bound: full cache at (1-s)L+sW | "
        "theory 1/((1-s)+sW/L) | KV MiB | KV vs full | theory KV fraction |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "full" if r["sparsity"] == 0 else f"mixed s={r['sparsity']:g}"
        bound = "–" if r.get("bound") is None else f"{r['bound']:.2f}x"
        lines.append(
            f"| {r['batch']} | {r['length']} | {name} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {bound} | "
            f"{r['theory']:.2f}x | {r['kv_bytes'] / 2**20:.1f} | {r['kv_ratio']:.3f} | {r['kv_theory']:.3f} |")
    return "\n".join(lines)


def memory(batches: list[int], length: int, steps: int) -> list[dict]:
    rows = []
    for batch in batches:
        model, allocations = setup(length + steps + 8, [0.5, 0.75])
        kv = random_kv(batch, length)
        rows += [dict(memory_over_decode(model, full, kv, steps), sparsity=s) for s, full in allocations.items()]
    return rows


def main(quick: bool = False, lengths: list[int] | None = None, batches: list[int] | None = None,
         memory_steps: int | None = None, steps: int | None = None, repeats: int | None = None) -> str:
    """Run the benchmark and return the markdown tables (`quick`: 1k and 4k only, fewer steps)."""
    torch.set_num_threads(1)
    lengths = lengths or ([1024, 4096] if quick else [1024, 4096, 16384])
    batches = batches or [1, 4]
    steps = steps or (8 if quick else 32)
    repeats = repeats or (3 if quick else 11)
    memory_steps = memory_steps or (200 if quick else 1000)
    memory_rows = memory(batches, 1024, memory_steps)  # first: nothing else has touched the allocator yet
    rows = [r for b in batches for r in measure(lengths, [0.5, 0.75], steps, repeats, b)]
    return (table(rows, steps) + f"\n\nMemory over {memory_steps} decode steps after 1024 preloaded positions "
            "(Linux resident set; see the docstring):\n\n" + memory_table(memory_rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 4k only, fewer steps (under a minute)")
    parser.add_argument("--lengths", type=int, nargs="+", help="context lengths (default 1024 4096 16384)")
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 4)")
    parser.add_argument("--memory-steps", type=int, help="decode steps of the memory check (default 1000)")
    parser.add_argument("--steps", type=int, help="decode steps per timed run (default 32)")
    parser.add_argument("--repeats", type=int, help="interleaved timed runs per configuration, median (default 11)")
    args = parser.parse_args()
    print(main(args.quick, args.lengths, args.batches, args.memory_steps, args.steps, args.repeats))
