"""A data file's identity: a digest of its bytes, so `touch`, `cp` without `-p` or a node-local copy under another
path is the same data, and a real change is told apart from a new time stamp.

A file is read once per version: its digest is remembered under the data cache (`digests/`), keyed by its real
path with the size, inode and modification time it had, so an unchanged file is not read again (a copy, a touched
file or one on another node is read once, then remembered the same way).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_BLOCK = 1 << 20


def digest(path: str | Path, memo_root: Path | None = None) -> str:
    """The sha256 of the file's bytes (hex, first 32 digits), from the memo when the file is as it was then."""
    real = os.path.realpath(path)
    st = os.stat(real)
    stamp = {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}
    memo = None
    if memo_root is not None:
        memo = Path(memo_root) / "digests" / f"{hashlib.sha256(real.encode()).hexdigest()[:24]}.json"
        try:
            seen = json.loads(memo.read_text())
        except (OSError, ValueError):
            seen = None
        if seen and seen.get("path") == real and all(seen.get(k) == v for k, v in stamp.items()):
            return str(seen["digest"])
    h = hashlib.sha256()
    with open(real, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    value = h.hexdigest()[:32]
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"path": real, **stamp, "digest": value}))
            os.replace(tmp, memo)
        except OSError:  # a read-only cache: the digest is still right, only computed again next time
            pass
    return value


__all__ = ["digest"]
