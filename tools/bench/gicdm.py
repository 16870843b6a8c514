"""P/R/D/C: `framework.metrics.prdc` (raw, and with our GICDM reconstruction) vs `prdc.compute_prdc`, side by side.

Every measurement runs in a fresh subprocess on the same data (N = M points of N(0, I_768), float32, fixed
seed) with the same BLAS/torch thread count, by default every core up to 8: prdc runs its pairwise distances in
8 joblib threads as shipped, so it uses up to 8 cores, and ours gets as many torch threads. Run it on a quiet
machine: torch's OpenMP threads stall whenever another process holds one of their cores (on a loaded 2-core
machine 2 threads ran 4x slower than 1); `--threads 1` is the robust choice there. Peak memory is the process's
peak resident set size (`ru_maxrss`) minus its value just before the call (after imports, data and a small
warm-up call), so numpy/sklearn and torch are measured the same way; for prdc, tracemalloc's peak of the numpy
allocations is shown too (a cross-check). The reconstruction runs with exact ICDM neighbours unless
`--big-neighbours approx_graph` (the candidate graph, at the --big sizes only). Every row's P/R/D/C is printed.

`--ladder` instead writes the separation ladder (docs/gicdm_eval/gicdm_ladder.md, .json; deterministic, untimed):
raw, icdm and reconstructed P/R/D/C for N(0, I_d) vs N(shift·e1, I_d), and the over-correction guard's verdict.

    python tools/bench/gicdm.py [--quick] [--sizes 2000 5000 10000] [--big 50000 [--big-gicdm]] [--threads N]
    python tools/bench/gicdm.py --ladder
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIM = 768


def _data(n: int, d: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.standard_normal((n, d), dtype=np.float32), rng.standard_normal((n, d), dtype=np.float32)


def worker(method: str, n: int, d: int, threads: int, neighbours: str = "exact") -> dict:
    """One measurement (run inside a fresh process): seconds, peak RSS increase (MiB), the metrics."""
    import tracemalloc

    import numpy as np

    if method == "prdc":
        import prdc as prdc_pkg
        from threadpoolctl import threadpool_limits

        def call(a, b):
            with threadpool_limits(threads), contextlib.redirect_stdout(io.StringIO()):
                return {k: float(v) for k, v in prdc_pkg.compute_prdc(a, b, nearest_k=5).items()}
    else:
        import torch

        sys.path.insert(0, str(REPO))
        from framework.metrics import prdc

        torch.set_num_threads(threads)
        correction = "gicdm_reconstructed" if method == "ours_recon" else "none"
        options = {"neighbours": neighbours} if correction != "none" else {}

        def call(a, b):
            out = prdc(torch.from_numpy(a), torch.from_numpy(b), 5, correction, **options)
            return {k: out[k] for k in ("precision", "recall", "density", "coverage")}

    real, fake = _data(n, d)
    call(real[:64].copy(), fake[:64].copy())  # warm-up: lazily loaded libraries and BLAS buffers
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if method == "prdc":
        tracemalloc.start()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    metrics = call(real, fake)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime  # all threads: the work done
    traced = tracemalloc.get_traced_memory()[1] / 2**20 if method == "prdc" else None
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024  # KiB on Linux
    del np
    return {"method": method, "n": n, "d": d, "threads": threads, "seconds": seconds, "cpu_seconds": cpu,
            "peak_mib": peak, "traced_mib": traced, "metrics": metrics,
            "neighbours": neighbours if method == "ours_recon" else None}


def measure(method: str, n: int, d: int, threads: int, neighbours: str = "exact") -> dict:
    env = {**os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}
    proc = subprocess.run([sys.executable, __file__, "--worker", method, str(n), str(d), str(threads), neighbours],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise RuntimeError(f"{method} at N={n} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _prdc4(m: dict | None) -> str:
    return " / ".join(f"{m[k]:.3f}" for k in ("precision", "recall", "density", "coverage")) if m else "-"


def table(rows: list[dict], big: list[dict]) -> str:
    lines = [
        f"P/R/D/C, N = M points of N(0, I_{DIM}) float32, k = 5, {rows[0]['threads'] if rows else '-'} thread(s);"
        " wall seconds (CPU seconds of all threads); peak = increase of the process's peak RSS during the call;"
        " recon = correction='gicdm_reconstructed' (ICDM neighbours in brackets)",
        "",
        "| N = M | prdc s | prdc peak MiB (numpy traced) | ours raw s | ours raw peak MiB | speed-up raw wall (CPU) |"
        " memory ratio raw | ours recon s | ours recon peak MiB | metrics equal prdc |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["method"], r["n"]): r for r in rows}
    for n in sorted({r["n"] for r in rows}):
        p, o, g = by[("prdc", n)], by[("ours_raw", n)], by[("ours_recon", n)]
        lines.append(
            f"| {n} | {p['seconds']:.1f} ({p['cpu_seconds']:.1f}) | {p['peak_mib']:.0f} ({p['traced_mib']:.0f}) |"
            f" {o['seconds']:.1f} ({o['cpu_seconds']:.1f}) | {o['peak_mib']:.0f} | {p['seconds'] / o['seconds']:.1f}x"
            f" ({p['cpu_seconds'] / o['cpu_seconds']:.1f}x) | 1/{p['peak_mib'] / max(o['peak_mib'], 1):.0f}"
            f" | {g['seconds']:.1f} ({g['cpu_seconds']:.1f}) [{g['neighbours']}] | {g['peak_mib']:.0f}"
            f" | {o['metrics'] == p['metrics']} |"
        )
    for r in big:
        g = r.get("recon") or {}
        lines.append(f"| {r['n']} (ours only) | - | - | {r['seconds']:.1f} | {r['peak_mib']:.0f} | - | - |"
                     f" {g.get('seconds', float('nan')):.1f} [{g.get('neighbours', '-')}]"
                     f" | {g.get('peak_mib', float('nan')):.0f} | - |")
    lines += ["", "| N = M | prdc P / R / D / C | ours raw P / R / D / C | ours recon P / R / D / C |",
              "|---|---|---|---|"]
    for n in sorted({r["n"] for r in rows}):
        lines.append(f"| {n} | {_prdc4(by[('prdc', n)]['metrics'])} | {_prdc4(by[('ours_raw', n)]['metrics'])} |"
                     f" {_prdc4(by[('ours_recon', n)]['metrics'])} |")
    for r in big:
        lines.append(f"| {r['n']} | - | {_prdc4(r['metrics'])} | {_prdc4((r.get('recon') or {}).get('metrics'))} |")
    return "\n".join(lines)


def main(quick: bool = False, sizes: list[int] | None = None, big: list[int] | None = None, threads: int = 1,
         big_gicdm: bool = False, big_neighbours: str = "exact") -> str:
    """Run the side-by-side measurements and return the markdown tables."""
    sizes = sizes or ([1000, 2000] if quick else [2000, 5000, 10000])
    rows = []
    for n in sizes:
        for method in ("prdc", "ours_raw", "ours_recon"):
            rows.append(measure(method, n, DIM, threads))
            print(f"  {method:10s} N={n:6d}: {rows[-1]['seconds']:7.1f} s ({rows[-1]['cpu_seconds']:.1f} CPU s),"
                  f" {rows[-1]['peak_mib']:7.0f} MiB",
                  file=sys.stderr, flush=True)
    big_rows = []
    for n in [] if quick else (big or []):
        r = measure("ours_raw", n, DIM, threads)
        if big_gicdm:
            r["recon"] = measure("ours_recon", n, DIM, threads, big_neighbours)
        big_rows.append(r)
    return table(rows, big_rows)


def write_ladder(out: Path = REPO / "docs" / "gicdm_eval" / "gicdm_ladder") -> str:
    """Compute the separation ladder, write `out`.json (rows) and `out`.md (table + guard); return the table."""
    sys.path.insert(0, str(REPO))
    import torch

    from framework.metrics.report import LADDER_N, ladder, ladder_markdown

    torch.set_num_threads(1)
    rows = ladder()
    text = (f"Written by `python tools/bench/gicdm.py --ladder`: real N(0, I_d) vs generated N(shift·e1, I_d), "
            f"N = M = {LADDER_N}, k = 5, seed 0 (`framework.data.hubness.shifted_pair`).\n\n" + ladder_markdown(rows))
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    out.with_suffix(".md").write_text(text + "\n")
    return text


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])))
        raise SystemExit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1000, 2000 only (about a minute)")
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--big", type=int, nargs="*", default=[], help="ours only, e.g. --big 50000 (minutes)")
    parser.add_argument("--big-gicdm", action="store_true", help="also time the reconstruction at the --big sizes")
    parser.add_argument("--big-neighbours", choices=("exact", "approx_graph"), default="exact",
                        help="ICDM neighbours of the reconstruction at the --big sizes (exact: a tiled pass per"
                             " iteration beyond 4096 points; approx_graph: the candidate graph)")
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1),
                        help="torch and BLAS threads for both (default: the cores, at most 8, as prdc's joblib)")
    parser.add_argument("--ladder", action="store_true", help="write docs/gicdm_eval/gicdm_ladder.{md,json} instead")
    args = parser.parse_args()
    if args.ladder:
        print(write_ladder())
        raise SystemExit(0)
    print(main(args.quick, args.sizes, args.big, args.threads, args.big_gicdm, args.big_neighbours))
