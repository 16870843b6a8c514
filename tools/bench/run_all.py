"""`make bench`: run every benchmark in tools/bench/ and write BENCHMARKS.md from what they print.

Each benchmark prints its own tables (ratios against the peers its issue names, measured side by side in one run)
and the paths of the PNGs it wrote. This runner streams that output to the terminal, copies each PNG into
docs/bench/, and writes BENCHMARKS.md: the machine, the date, every command, its output verbatim, its plots.
Every number in BENCHMARKS.md is therefore produced by this one command.

    python tools/bench/run_all.py [--quick] [--only NAME ...] [--args "..."] [--out BENCHMARKS.md]

With `--only`, an existing output file keeps its other sections: only the named `## NAME` sections are replaced
(each then says when and at which commit it was measured, since the file's header describes the full run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# extra arguments of the full (not --quick) run: the sizes an issue asks about beyond a benchmark's defaults
FULL_ARGS = {"gicdm": ["--big", "50000", "--big-gicdm"]}
PNG = re.compile(r"(?:^|[\s(:=])([^\s()'\"]+\.png)\b")


def machine() -> str:
    """One paragraph describing where the numbers were measured."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = ""
    try:
        kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal")))
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return (f"{cpu}, {os.cpu_count()} logical cores{mem}{gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}, {platform.system()} {platform.release()}")


def run_one(script: Path, extra: list[str], assets: Path) -> tuple[int, str, list[Path], float]:
    """Run one benchmark, echoing its output; return exit code, output, the PNGs it mentions, seconds."""
    cmd = [sys.executable, str(script), *extra]
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # stream: long benchmarks show progress as they go
        sys.stdout.write(line)
        lines.append(line)
    code = proc.wait()
    out = "".join(lines)
    pngs = []
    for match in PNG.findall(out):
        src = (REPO / match).resolve() if not Path(match).is_absolute() else Path(match)
        if src.is_file() and src not in pngs:
            pngs.append(src)
    copies = []
    for src in pngs:
        dst = assets / f"{script.stem}_{src.name}" if not src.name.startswith(script.stem) else assets / src.name
        if src.resolve() != dst.resolve():
            shutil.copyfile(src, dst)
        copies.append(dst)
    return code, out, copies, time.time() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (smaller, faster)")
    ap.add_argument("--only", nargs="*", default=None, help="benchmark names (file stems) to run")
    ap.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    ap.add_argument("--args", default=None, help="arguments for the benchmark(s) instead of the defaults, "
                    "e.g. --only selection --args '--seeds 3'")
    args = ap.parse_args()

    scripts = [s for s in sorted(HERE.glob("*.py")) if s.name != Path(__file__).name and not s.name.startswith("_")]
    if args.only:
        unknown = sorted(set(args.only) - {s.stem for s in scripts})
        if unknown:
            print(f"error: unknown benchmark(s) {unknown}; valid: {[s.stem for s in scripts]}", file=sys.stderr)
            return 2
        scripts = [s for s in scripts if s.stem in args.only]
    assets = REPO / "docs" / "bench"
    assets.mkdir(parents=True, exist_ok=True)
    extra = ["--quick"] if args.quick else []
    if args.args is not None:
        extra += args.args.split()

    started = dt.datetime.now(dt.timezone.utc)
    commit = _git_head(args.out, assets)  # before the run: the code measured, not the files it writes
    sections, failed = [], []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        args_here = extra or FULL_ARGS.get(script.stem, [])
        code, out, pngs, secs = run_one(script, args_here, assets)
        if code:
            failed.append(script.name)
        rel = os.path.relpath(script, REPO)
        body = [f"## {script.stem}", "", f"`python {' '.join([rel, *args_here])}` — {secs / 60:.1f} min"
                + ("" if not code else f", **exit code {code}: this benchmark failed**"), "",
                "```text", out.rstrip(), "```", ""]
        if args.only and args.out.is_file():  # spliced into a file whose header describes another run
            body[4:4] = [f"(this section alone: {started:%Y-%m-%d %H:%M} UTC, commit {commit}, {machine()})", ""]
        body += [f"![{p.stem}]({os.path.relpath(p, args.out.parent)})\n" for p in pngs]
        sections.append("\n".join(body))

    header = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python tools/bench/run_all.py"
        + (" --quick" if args.quick else "") + "`); do not edit by hand — every number below is printed by",
        "the benchmark named above it, measured side by side with its peers in the same run.",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}",
        f"- commit: {commit}",
        "",
    ]
    if args.only and args.out.is_file():
        args.out.write_text(splice(args.out.read_text(), dict(zip([s.stem for s in scripts], sections, strict=True))))
    else:
        args.out.write_text("\n".join(header) + "\n" + "\n".join(sections))
    print(f"\nwrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


def splice(text: str, sections: dict[str, str]) -> str:
    """`text` with each `## name` section (up to the next `## ` heading) replaced; new names are appended."""
    for name, body in sections.items():
        pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
        if pattern.search(text):
            new = body.rstrip("\n") + "\n\n"
            text = pattern.sub(lambda _, new=new: new, text, count=1)
        else:
            text = text.rstrip("\n") + "\n\n" + body
    return text


def _git_head(*outputs: Path) -> str:
    """The commit, marked when the tree differs from it (the benchmark outputs themselves aside)."""
    skip = [f":(exclude){os.path.relpath(p, REPO)}" for p in outputs if REPO in p.resolve().parents]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ".", *skip], cwd=REPO, capture_output=True,
                               text=True).stdout
        return head.stdout.strip() + (" (with uncommitted changes)" if dirty.strip() else "")
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
