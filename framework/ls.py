"""`python -m framework.ls [kind] [pattern] [hydra.searchpath=[file://FOLDER]]`: what is registered, one kind per
line (`-v`: one name per line). YAML recipes count: conf/recipe/, and FOLDER/recipe/ as `framework.train` reads them.

A kind can be named as the registry calls it (`callback`), as its Hydra group does (`callbacks`), or in the plural
(`samplers`)."""

from __future__ import annotations

import argparse
import sys

from framework.errors import run_cli
from framework.recipe import CONF_DIR, load_conf, searchpath_folders
from framework.registry import GROUPS, KINDS, Registry, UnknownNameError, load_catalog


def find_kind(name: str) -> Registry:
    """The registry for a kind or Hydra group name (`callback` or `callbacks`); UnknownNameError otherwise."""
    registry = KINDS.get(name) or GROUPS.get(name) or KINDS.get(name.removesuffix("s"))  # `samplers`, `models`
    if registry is None:
        raise UnknownNameError("kind", name, sorted(set(KINDS) | set(GROUPS)))
    return registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.ls", description=__doc__)
    names = ", ".join(k if r.group == k else f"{k} ({r.group})" for k, r in KINDS.items())
    parser.add_argument("kind", nargs="?", help=f"one of: {names}")
    parser.add_argument("pattern", nargs="?", default="*", help="shell wildcard, e.g. 'mdlm_*'")
    parser.add_argument("-v", "--verbose", action="store_true", help="one name per line, with its description")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args([a for a in argv if not a.lstrip("+").startswith("hydra.searchpath=")])
    return run_cli(lambda: _list(args, searchpath_folders(argv)), plain=False)


def _list(args: argparse.Namespace, conf_folders: list) -> None:
    """Load the catalog and the YAML recipes, then print the registries `args` asks for."""
    load_catalog()
    load_conf(CONF_DIR)
    for folder in conf_folders:
        load_conf(folder, store=False)
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
