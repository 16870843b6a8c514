"""What changed between two versions of a run's data, in words: the files (by name, with bytes and documents before
and after), the Hub commit, or the settings (tokenizer, seq_len, ...). A resumed run on changed data is refused
with it, and a cache built anew says it in the log."""

from __future__ import annotations

from typing import Any


def _files(table: list[list[Any]] | None) -> dict[str, tuple[int, str]]:
    return {str(name): (int(size), str(digest)) for name, size, digest in table or []}


def describe(before: dict[str, Any], now: dict[str, Any]) -> str:
    """`before` / `now`: {"identity": the data's identity, "files": [[name, bytes, digest]], "documents": n}."""
    parts: list[str] = []
    old, new = before.get("identity") or {}, now.get("identity") or {}
    theirs, ours = _files(before.get("files")), _files(now.get("files"))
    for name in sorted(set(theirs) | set(ours)):
        if name not in ours:
            parts.append(f"{name} is gone ({theirs[name][0]:,} bytes then)")
        elif name not in theirs:
            parts.append(f"{name} is new ({ours[name][0]:,} bytes)")
        elif theirs[name][1] != ours[name][1]:
            parts.append(f"{name} changed ({theirs[name][0]:,} bytes then, {ours[name][0]:,} now)")
    src_old, src_new = old.get("source") or {}, new.get("source") or {}
    if src_old.get("sha") != src_new.get("sha"):
        parts.append(f"the Hub dataset is at commit {src_new.get('sha')} now, {src_old.get('sha')} then")
    if not parts and src_old != src_new:
        keys = sorted(k for k in set(src_old) | set(src_new) if src_old.get(k) != src_new.get(k))
        parts.append("the source's " + ", ".join(keys) + (" (the same files in another order)" if keys == ["files"]
                                                          else ""))
    for key in sorted(k for k in set(old) | set(new) if k != "source" and old.get(k) != new.get(k)):
        a, b = old.get(key), new.get(key)
        short = all(isinstance(v, (int, float, str, bool, type(None))) for v in (a, b))
        parts.append(f"{key} {a!r} then, {b!r} now" if short else f"the {key}")
    docs = (before.get("documents"), now.get("documents"))
    if None not in docs and docs[0] != docs[1]:
        parts.append(f"{docs[0]:,} training documents then, {docs[1]:,} now")
    return "; ".join(parts) or "a part of its identity"


__all__ = ["describe"]
