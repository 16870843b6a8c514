"""`python -m framework.ls [kind] [pattern]`: what is registered, one kind per line (`-v`: one name per line)."""

from __future__ import annotations

import argparse
import sys

from framework.registry import KINDS, UnknownNameError, load_catalog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.ls", description=__doc__)
    parser.add_argument("kind", nargs="?", help=f"one of: {', '.join(KINDS)}")
    parser.add_argument("pattern", nargs="?", default="*", help="shell wildcard, e.g. 'mdlm_*'")
    parser.add_argument("-v", "--verbose", action="store_true", help="one name per line, with its description")
    args = parser.parse_args(argv)
    load_catalog()
    if args.kind and args.kind not in KINDS:
        print(f"error: {UnknownNameError('kind', args.kind, list(KINDS))}", file=sys.stderr)
        return 2
    for kind in [args.kind] if args.kind else KINDS:
        registry = KINDS[kind]
        names = registry.names(args.pattern)
        if args.verbose:
            for name in names:
                entry = registry.entry(name)
                alias = f" (alias: {', '.join(entry.aliases)})" if entry.aliases else ""
                print(f"{kind:10s} {name:24s} {entry.description}{alias}")
        elif names or args.kind:
            print(f"{kind}: {' '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
