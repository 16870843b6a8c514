"""`python -m framework.data prepare recipe=NAME data=text data.source=... [model=...] [key=value ...]`

Tokenize and pack, ahead of a (multi-node) job, the data that `python -m framework.train` with the same overrides
will read: the same config is composed and checked, the data module is built, the model's tokenizer (if it brings
one) handed to it, and its packed arrays written to the cache (`FRAMEWORK_DATA_CACHE`, on each node's disk or a
shared one). The run then finds them by fingerprint and reads no source. Prints the data's record as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from framework.errors import InputError, run_cli

USAGE = ("usage: python -m framework.data prepare recipe=NAME data=text data.source=PATH_OR_HUB_ID [key=value ...]\n"
         "       python -m framework.data cache ls | rm KEY... | rm --all")


def prepare(argv: list[str]) -> dict[str, Any]:
    """Build the cache of the data `python -m framework.train ARGV` would read; returns its record and folder."""
    from hydra.core.hydra_config import HydraConfig
    from hydra_zen import instantiate

    from framework.app import register_app
    from framework.assembly import hand_tokenizer
    from framework.cli import check_command_line
    from framework.compose import compose_job
    from framework.recipe import searchpath_folders

    register_app(searchpath_folders(argv))
    argv = check_command_line(argv)
    cfg = compose_job([a for a in argv if "=" in a and not a.startswith("-")])
    HydraConfig.instance().cfg = None
    if cfg is None or cfg.get("data") is None:
        raise InputError(f"{' '.join(argv)}: names no data to prepare (give data=text data.source=...)")
    data = instantiate(cfg.data)
    if not callable(getattr(data, "build", None)):
        raise InputError(f"data={cfg.hydra.runtime.choices.get('data')} is built in and has nothing to prepare; "
                         "prepare data=text (the user's own data)")
    if cfg.get("model") is not None:
        hand_tokenizer(instantiate(cfg.model), data)
    folder = data.build()
    return {**data.record(), "cache": str(folder)}  # where the run (on this disk, or a shared one) will read it


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["cache"]:
        from framework.data import cache_cli

        if args[1:2] in (["-h"], ["--help"]):
            print(cache_cli.__doc__.strip())
            return 0
        return run_cli(lambda: print(cache_cli.main(args[1:])))
    if not args or args[0] != "prepare" or args[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip() if args[1:2] in (["-h"], ["--help"]) else USAGE, file=sys.stderr)
        return 0 if args[1:2] in (["-h"], ["--help"]) else 2
    return run_cli(lambda: print(json.dumps(prepare(args[1:]), indent=1)))


__all__ = ["main", "prepare"]
