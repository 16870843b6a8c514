"""`python -m framework.ls [kind] [name or pattern] [hydra.searchpath=[file://FOLDER]]`: what is registered.

  python -m framework.ls                      every kind, one line each (`-v`: one name per line, with its summary)
  python -m framework.ls optimizer            one kind
  python -m framework.ls recipe 'mdlm_*' -v   a shell wildcard
  python -m framework.ls optimizer olion      one name (or alias): its summary, target, guide, and every key of its
                                              config with the default `optimizer=olion` gives and what it means
  python -m framework.ls recipe sft           a recipe: its choices, the values it sets, its lr per optimizer
  python -m framework.ls --markdown docs/reference/config.md   write the configuration reference (every group)

YAML recipes count: conf/recipe/, and FOLDER/recipe/ as `framework.train` reads them. A kind can be named as the
registry calls it (`callback`), as its Hydra group does (`callbacks`), or in the plural (`samplers`). An unknown
name exits 2 with the close matches."""

from __future__ import annotations

import argparse
import sys

from framework.config_reference import find_kind, registered, render
from framework.errors import run_cli
from framework.recipe import CONF_DIR, load_conf, searchpath_folders
from framework.registry import KINDS, load_catalog

__all__ = ["find_kind", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.ls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    names = ", ".join(k if r.group == k else f"{k} ({r.group})" for k, r in KINDS.items())
    parser.add_argument("kind", nargs="?", help=f"one of: {names}")
    parser.add_argument("pattern", nargs="?", default="*",
                        help="a registered name or alias (shows its config), or a shell wildcard, e.g. 'mdlm_*'")
    parser.add_argument("-v", "--verbose", action="store_true", help="one name per line, with its description")
    parser.add_argument("--markdown", metavar="FILE",
                        help="write the configuration reference (Markdown) to FILE ('-': standard output)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args([a for a in argv if not a.lstrip("+").startswith("hydra.searchpath=")])
    return run_cli(lambda: _run(args, searchpath_folders(argv)), plain=False)


def _run(args: argparse.Namespace, conf_folders: list) -> None:
    """Load the catalog and the YAML recipes, then print what `args` asks for."""
    load_catalog()
    load_conf(CONF_DIR)
    for folder in conf_folders:
        load_conf(folder, store=False)
    if args.markdown:
        from framework.config_markdown import write_reference

        write_reference(args.markdown)
    elif args.kind and not any(c in args.pattern for c in "*?["):
        find_kind(args.kind).resolve(args.pattern)  # UnknownNameError, with the close matches, for a bad name
        print(render(registered(args.kind, args.pattern)))
    else:
        _list(args)


def _list(args: argparse.Namespace) -> None:
    """Print the registries `args` asks for: one line per kind, or (`-v`) one per name with its description."""
    registries = [find_kind(args.kind)] if args.kind else list(KINDS.values())
    for registry in registries:
        kind = registry.kind
        names = registry.names(args.pattern)
        if args.verbose:
            for name in names:
                entry = registry.entry(name)
                alias = f" (alias: {', '.join(entry.aliases)})" if entry.aliases else ""
                print(f"{kind:10s} {name:24s} {entry.description}{alias}")
        elif names or args.kind:
            print(f"{kind}: {' '.join(names)}")


if __name__ == "__main__":
    raise SystemExit(main())
