"""Section (f) of tools/bench/data.py: one big text file, its peak memory at 10x the size.

A single `.txt` file of generated prose (a 10 MB block of pseudo-words with line and paragraph breaks, written again
until the size is reached) of 100 MB and of 1 GB (`--quick`: 10 MB and 100 MB), read by `data=text` at its
defaults (the file one document, read in pieces), byte-level (vocabulary 256, the `char_lm` recipe's: the tokenizer
is not what is measured), seq_len 512, batch 16. Three fresh processes per size, each printing its peak RSS
(VmHWM): `prepare` (the packed cache built: digest, UTF-8 check, read, pack), `cached` (the cache opened as a run
opens it, and 2,000 training batches read: the epoch's order is made on the first) and `streamed` (one whole epoch
of `data.streaming=true`, the validation rows read first). Goal: each 1 GB peak <= 1.1x the 100 MB one.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("prepare", "cached", "streamed")


def write_corpus(path: Path, mb: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "sor", "tu", "vi", "an", "el", "or", "is", "un"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(5000)]
    parts, size = [], 0
    while size < 10_000_000:
        sentence = " ".join(rng.choices(words, k=rng.randint(5, 30))) + "."
        sentence += "\n\n" if rng.random() < 0.1 else ("\n" if rng.random() < 0.3 else " ")
        parts.append(sentence)
        size += len(sentence)
    block = "".join(parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(max(1, round(mb * 1e6 / len(block)))):
            f.write(block)
    return path


def child(path: str, mode: str, cache: str) -> None:
    """In a fresh process: one mode on `path`; prints peak RSS, rows and seconds as JSON."""
    import torch

    from framework.data import streaming
    from framework.data.user_text import TextData

    torch.set_num_threads(1)
    start = time.perf_counter()
    data = TextData(source=path, seq_len=512, batch_size=16, cache_dir=cache, streaming=mode == "streamed")
    rows = 0
    if mode == "prepare":
        data.build()
    elif mode == "cached":
        data.setup()
        for i, batch in enumerate(data.train_dataloader()):
            rows += len(batch["input_ids"])
            if i == 1999:
                break
    else:
        data.setup()
        for batch in streaming.train_loader(data):
            rows += len(batch["input_ids"])
    print(json.dumps({"peak_mb": vm_hwm(), "rows": rows, "seconds": time.perf_counter() - start}))


def vm_hwm() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run(tmp: Path, sizes_mb: tuple[int, int], script: str) -> dict[tuple[int, str], dict[str, Any]]:
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for mb in sizes_mb:
        path = write_corpus(tmp / f"big_{mb}" / "corpus.txt", mb)
        cache = tmp / f"big_cache_{mb}"
        for mode in MODES:  # prepare first: the cached run reads what it built
            cmd = [sys.executable, script, "--big-child", str(path), mode, str(cache)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            out[(mb, mode)] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "mb": path.stat().st_size / 1e6}
        path.unlink()
    return out


def print_results(res: dict[tuple[int, str], dict[str, Any]], sizes_mb: tuple[int, int]) -> None:
    small, large = sizes_mb
    print("(f) one big text file: peak RSS (VmHWM) of a fresh process, the file at two sizes (byte-level, seq_len "
          "512, batch 16; `cached`: 2,000 training batches read from the packed cache; `streamed`: one whole epoch)\n")
    print("| mode | file MB | rows | seconds | peak RSS (MB) | x the smaller file | goal |")
    print("|---|---|---|---|---|---|---|")
    for mode in MODES:
        base = res[(small, mode)]["peak_mb"]
        for mb in sizes_mb:
            r = res[(mb, mode)]
            goal = "<= 1.1" if mb == large else ""
            print(f"| {mode} | {r['mb']:,.0f} | {r['rows']:,} | {r['seconds']:.1f} | {r['peak_mb']:.0f} | "
                  f"{r['peak_mb'] / base:.3f} | {goal} |")
    print()


__all__ = ["child", "print_results", "run", "write_corpus"]
