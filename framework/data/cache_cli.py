"""`python -m framework.data cache ls | rm KEY... | rm --all`: the packed data under the data cache, with sizes.

Each entry is a folder named by its fingerprint (`text/<key>`): what one source, tokenizer and settings made. A
changed source is packed anew beside the old entry, which stays until removed here (the build's log line names it).
`ls` lists every entry with its size, when it was built, its source, seq_len and tokens; `rm` removes entries by
key (or a unique prefix of one), `rm --all` every entry. The cache is $FRAMEWORK_DATA_CACHE, else
~/.cache/framework/data (`--cache-dir DIR` names another).
"""

from __future__ import annotations

import difflib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from framework.data.packing import cache_root
from framework.errors import InputError


def entries(root: Path) -> list[dict[str, Any]]:
    """Every built entry under `root/text`: key, folder, bytes, built (a time), source, seq_len, tokens."""
    found = []
    for done in sorted((root / "text").glob("*/done")):
        folder = done.parent
        try:
            meta = json.loads((folder / "train" / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        found.append({"key": folder.name, "folder": str(folder),
                      "bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
                      "built": time.strftime("%Y-%m-%d %H:%M", time.localtime(done.stat().st_mtime)),
                      "source": meta.get("source", "?"), "seq_len": meta.get("seq_len"),
                      "tokens": meta.get("tokens")})
    return found


def ls(root: Path) -> str:
    rows = entries(root)
    if not rows:
        return f"{root}: no packed data"
    lines = [f"{'key':<20}  {'MiB':>9}  {'built':<16}  {'seq_len':>7}  {'tokens':>13}  source"]
    lines += [f"{r['key']:<20}  {r['bytes'] / 2**20:>9,.1f}  {r['built']:<16}  {r['seq_len'] or '?':>7}  "
              f"{r['tokens'] if r['tokens'] is not None else '?':>13}  {r['source']}" for r in rows]
    total = sum(r["bytes"] for r in rows)
    return "\n".join([*lines, f"{len(rows)} entries, {total / 2**20:,.1f} MiB in {root / 'text'}"])


def rm(root: Path, keys: list[str]) -> str:
    """Remove entries by key or unique prefix (`--all`: every one); InputError naming a key that is none."""
    rows = {r["key"]: r for r in entries(root)}
    if keys == ["--all"]:
        chosen = list(rows)
    else:
        chosen = []
        for key in keys:
            matches = [k for k in rows if k.startswith(key)]
            if len(matches) != 1:
                close = difflib.get_close_matches(key, list(rows), n=3, cutoff=0.5)
                hint = f" Did you mean {' or '.join(close)}?" if close else ""
                why = "matches several entries" if matches else "is no entry"
                raise InputError(f"cache rm {key}: {why} of {root / 'text'}.{hint} Entries: "
                                 f"{', '.join(rows) or '(none)'} (python -m framework.data cache ls)")
            chosen.append(matches[0])
    freed = 0
    for key in chosen:
        freed += rows[key]["bytes"]
        shutil.rmtree(rows[key]["folder"])
    return f"removed {len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'}, {freed / 2**20:,.1f} MiB freed"


def main(args: list[str]) -> str:
    root = cache_root()
    if "--cache-dir" in args:
        i = args.index("--cache-dir")
        if i + 1 >= len(args):
            raise InputError("cache --cache-dir needs a folder")
        root, args = Path(args[i + 1]).expanduser(), args[:i] + args[i + 2:]
    if args[:1] == ["ls"] and len(args) == 1:
        return ls(root)
    if args[:1] == ["rm"] and len(args) > 1:
        return rm(root, args[1:])
    raise InputError(f"cache {' '.join(args)}: give `cache ls`, `cache rm KEY...` or `cache rm --all`")


__all__ = ["entries", "ls", "main", "rm"]
