"""JSON Lines read line by line for a stream, so one bad line costs one row, not the run.

A streamed `data=text` run reads local `.jsonl` files (compressed or not) here instead of through `datasets`' JSON
builder, which parses blocks of 10 MB at a time and fails a whole block on one bad line. Each line that parses to a
JSON object is a row; a line that does not is a `BAD` row naming its file and line (the text module skips and counts
it), or, with `data.strict=true`, `BadRow` is raised, which the streamed loader turns into an interruption: a
checkpoint of the last step, the resume command, the error in the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from framework.data import text_files
from framework.errors import InputError

#: the column of a row that stands for a bad line: "file line N: why"
BAD = "__bad_line__"


class BadRow(InputError):
    """A line of a streamed JSON Lines file that is not a JSON object (`data.strict=true` stops on it)."""


def _parsed(path: str) -> Iterator[tuple[int, str, Any, str | None]]:
    """(line number, line, value, why it is no JSON object or None) of each non-blank line of `path`."""
    with text_files.open_text(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
                why = None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
            except ValueError as err:
                value, why = None, str(err)
            yield number, line, value, why


def rows(files: list[str], strict: bool = False) -> Iterator[dict[str, Any]]:
    """Every non-blank line of `files` as a row: the JSON object it holds, or {BAD: "name line N: why"}."""
    for path in files:
        for number, line, value, why in _parsed(path):
            if why is None:
                yield value
            elif strict:
                raise BadRow(f"data.source: {path} line {number} is not a JSON object ({why}): "
                             f"{line.strip()[:80]!r} (data.strict=true stops on it; false skips and counts it)")
            else:
                yield {BAD: f"{Path(path).name} line {number}: {why}"}


def bad_json_line(files: list[str]) -> tuple[str, int, str, str] | None:
    """The first line of JSON Lines `files` that is not a JSON object: (file, line number, why, the line)."""
    for path in files:
        if text_files.inner_suffix(path) == ".jsonl":
            bad = next(((n, line, why) for n, line, _, why in _parsed(path) if why is not None), None)
            if bad is not None:
                return path, bad[0], bad[2], bad[1].strip()
    return None


def readable(files: list[str]) -> bool:
    """Whether every file is JSON Lines (read here when streamed)."""
    return bool(files) and all(text_files.inner_suffix(f) == ".jsonl" for f in files)


__all__ = ["BAD", "BadRow", "bad_json_line", "readable", "rows"]
