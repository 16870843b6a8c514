"""`make bench`: run every benchmark in tools/bench/ in turn (each prints its own table of ratios)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("*.py")):
        if script.name == Path(__file__).name or script.name.startswith("_"):
            continue
        print(f"\n=== {script.name} ===", flush=True)
        if subprocess.run([sys.executable, str(script), *sys.argv[1:]]).returncode:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
