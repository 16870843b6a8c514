"""Plain-text files as documents, read in bounded memory: `data.sample_by=document|line|paragraph`.

The words are `datasets`' text builder's. `document` (the default): a file is one document; `line`: each line is
one; `paragraph`: text between blank lines is one. Whatever the choice, nothing holds more than `PIECE` characters
at a time: a longer document (one big file, a line without end) is read as consecutive pieces of at most that size,
cut after a line end where the piece has one, each piece starting its own positions (as each packed row does).
The files are decoded as UTF-8 with universal newlines (as `datasets` reads them), a byte-order mark dropped;
compressed files (.gz, .bz2, .xz, .zst) are read through their decompressor, named by their inner extension.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from framework.errors import InputError

SAMPLE_BY = ("document", "line", "paragraph")
#: the most characters a document is read at a time (256 Ki, about 64k tokens): one big file is read in pieces
PIECE = 1 << 18
#: documents of text files read together in a stream, by what a document is (a read batch of whole-file pieces
#: holds at most 8 · PIECE characters)
READ_BATCH = {"document": 8, "paragraph": 64, "line": 256}


def _zstd(path: str) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raise InputError(f"data.source={path}: a .zst file is read through the `zstandard` package: "
                         "pip install zstandard") from None
    return zstandard.open(path, "rb")


#: a compressed file's suffix → how to open it for reading bytes
COMPRESSIONS = {".gz": lambda p: gzip.open(p, "rb"), ".bz2": lambda p: bz2.open(p, "rb"),
                ".xz": lambda p: lzma.open(p, "rb"), ".zst": _zstd}


def inner_suffix(path: str | Path) -> str:
    """The extension that says what a file holds: `corpus.txt.gz` → `.txt` (lower case)."""
    p = Path(path)
    if p.suffix.lower() in COMPRESSIONS:
        p = p.with_suffix("")
    return p.suffix.lower()


def open_bytes(path: str | Path) -> IO[bytes]:
    """The file's bytes, decompressed where its suffix names a compression."""
    opener = COMPRESSIONS.get(Path(path).suffix.lower())
    return opener(str(path)) if opener else open(path, "rb")  # noqa: SIM115 - the caller closes it


def open_text(path: str | Path) -> IO[str]:
    """The file as text: UTF-8 (a leading byte-order mark dropped), universal newlines."""
    return io.TextIOWrapper(open_bytes(path), encoding="utf-8-sig", newline=None)


def documents(path: str | Path, sample_by: str = "document", piece: int | None = None) -> Iterator[str]:
    """The file's non-empty documents, in order (each at most `piece` characters, default `PIECE`)."""
    piece = piece or PIECE
    if sample_by not in SAMPLE_BY:
        raise InputError(f"data.sample_by={sample_by!r}; valid: {', '.join(SAMPLE_BY)}")
    with open_text(path) as f:
        if sample_by == "document":
            yield from _pieces(f, piece)
        elif sample_by == "line":
            yield from _lines(f, piece)
        else:
            yield from _paragraphs(f, piece)


def _pieces(f: IO[str], piece: int) -> Iterator[str]:
    """The whole text in pieces of at most `piece` characters, each cut after its last line end where it has one:
    joined, they are the text."""
    carry = ""
    while True:
        block = f.read(piece - len(carry))
        text = carry + block
        if not block:
            if text:
                yield text
            return
        if len(text) < piece:  # the file ends within this piece: the next read says so
            carry = text
            continue
        cut = text.rfind("\n") + 1 or len(text)
        yield text[:cut]
        carry = text[cut:]


def _lines(f: IO[str], piece: int) -> Iterator[str]:
    """Each line without its line end (empty lines skipped); a line longer than `piece` in pieces."""
    while True:
        line = f.readline(piece)
        if not line:
            return
        text = line[:-1] if line.endswith("\n") else line
        if text:
            yield text


def _paragraphs(f: IO[str], piece: int) -> Iterator[str]:
    """Text between blank lines (lines of only whitespace), without the line end after its last line; a paragraph
    longer than `piece` in pieces, cut after a line end."""
    lines: list[str] = []
    size = 0
    while True:
        line = f.readline(piece)
        if not line or not line.strip():
            if lines:
                yield "".join(lines).removesuffix("\n")
            lines, size = [], 0
            if not line:
                return
            continue
        if size + len(line) > piece and lines:
            yield "".join(lines)
            lines, size = [], 0
        lines.append(line)
        size += len(line)


def rows(files: list[str], sample_by: str = "document") -> Iterator[dict[str, Any]]:
    """Every document of `files` as a row {"text": ...}: a `datasets.IterableDataset.from_generator` source,
    sharded by file."""
    for path in files:
        for text in documents(path, sample_by):
            yield {"text": text}


def batches(files: list[str], sample_by: str = "document", size: int = 1000, chars: int | None = None
            ) -> Iterator[list[str]]:
    """The documents of `files`, `size` at a time or fewer when they reach `chars` characters (default 8 · PIECE;
    the cached path reads this way, without `datasets`)."""
    chars = chars or 8 * PIECE
    batch: list[str] = []
    held = 0
    for path in files:
        for text in documents(path, sample_by):
            batch.append(text)
            held += len(text)
            if len(batch) == size or held >= chars:
                yield batch
                batch, held = [], 0
    if batch:
        yield batch


__all__ = ["COMPRESSIONS", "PIECE", "READ_BATCH", "SAMPLE_BY", "batches", "documents", "inner_suffix", "open_bytes",
           "open_text", "rows"]
