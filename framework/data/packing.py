"""Documents → rows of `seq_len` tokens, held on disk as flat arrays a memmap reads, cached by a fingerprint.

A `Document` is `(ids, labels)`: int token ids and, where only some tokens are targets, labels aligned with them
(-100 = no loss; None = every token a target). `PackWriter` lays documents into rows, greedy and in order, and
appends them to flat binary files (nanoGPT's layout plus the offsets it lacks): `tokens.bin` (every row's real
tokens, concatenated), `row_starts.bin` (n_rows + 1 offsets into it), `doc_starts.bin` (where each document, or
piece of one, starts), `row_docs.bin` (n_rows + 1 indices into doc_starts: the row's first document start) and,
when some token is not a target, `targets.bin` (1 = a target). Memory stays bounded by one flush, so a corpus larger
than memory packs too. `PackedRows` reads a row with a few positioned reads (`os.pread`) of exactly its bytes, not
through a memory map, so a run's resident memory does not grow with the pages a long epoch touches. It returns the
batch dicts of user text:
`input_ids`, `labels` (not shifted; -100 on padding, non-targets and each packed document's first token),
`position_ids` restarting per document (packed) or `attention_mask` (one document per row), and `index`.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

Document = tuple[np.ndarray, "np.ndarray | None"]
IGNORE = -100
FORMAT_VERSION = 2  # 2: row_docs.bin
_FLUSH_TOKENS = 1 << 22


def encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Each text's ids without the tokenizer's automatic special tokens. A fast tokenizer's Rust backend is called
    directly, without offsets (`encode_batch_fast`: the same ids, about a fifth less time), unless its tokenizer.json
    sets truncation or padding (which transformers' own call turns off); others as called."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch_fast") and backend.truncation is None and \
            backend.padding is None:
        return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a `vocab_size` vocabulary."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int64)


class PackWriter:
    """Lays documents into rows of `seq_len` tokens and appends them to flat files in `folder`.

    packing=True: rows are filled in order; with `split_documents` a document that crosses a row's end continues
    in the next row (concatenate-and-chunk: only the last row is padded), else it starts a new row when it does
    not fit what is left (whole documents per row, tails padded). A document longer than a row is cut into
    row-sized pieces either way, each piece its own document. packing=False: one document (piece) per row."""

    def __init__(self, folder: str | Path, seq_len: int, packing: bool = True, split_documents: bool = True,
                 dtype: np.dtype | type = np.uint8):
        if seq_len < 1:
            raise ValueError(f"seq_len={seq_len} must be >= 1")
        self.folder, self.seq_len, self.packing, self.split = Path(folder), seq_len, packing, split_documents
        self.folder.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(dtype)
        self.offset = self.fill = self.documents = 0
        self.has_targets = False  # some token is not a target: targets.bin is written (earlier tokens backfilled)
        self._backfill = 0
        self._tokens: list[np.ndarray] = []
        self._targets: list[np.ndarray] = []
        self._rows: list[int] = [0]
        self._row_docs: list[int] = [0]
        self._pieces = 0
        self._docs: list[int] = []
        self._pending = 0
        self._files = {name: open(self.folder / f"{name}.bin", "wb")  # noqa: SIM115 - closed in close()
                       for name in ("tokens", "targets", "row_starts", "doc_starts", "row_docs")}

    def add(self, ids: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Append one document (an empty one is skipped)."""
        ids = np.asarray(ids)
        if len(ids) == 0:
            return
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != ids.shape:
                raise ValueError(f"labels of shape {labels.shape} for ids of shape {ids.shape}: give one per token")
        target = None if labels is None else (labels != IGNORE).astype(np.uint8)
        if target is not None and not self.has_targets and not target.all():
            self.has_targets, self._backfill, self._targets = True, self.offset, []  # all tokens so far: targets
        if self.has_targets and target is None:
            target = np.ones(len(ids), dtype=np.uint8)
        self.documents += 1
        if self.fill and (not self.packing or (not self.split and len(ids) > self.seq_len - self.fill)):
            self._end_row()
        while len(ids):
            piece = self.seq_len - self.fill
            self._put(ids[:piece], None if target is None else target[:piece])
            ids, target = ids[piece:], None if target is None else target[piece:]

    def _put(self, ids: np.ndarray, target: np.ndarray | None) -> None:
        if self.dtype.kind == "u" and (int(ids.min()) < 0 or int(ids.max()) > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids in [{int(ids.min())}, {int(ids.max())}] do not fit {self.dtype} (ids from 0 "
                             f"to {np.iinfo(self.dtype).max}); pack with a wider dtype (`token_dtype(vocab_size)`)")
        self._docs.append(self.offset)
        self._pieces += 1
        self._tokens.append(ids.astype(self.dtype, copy=False))
        if self.has_targets:
            self._targets.append(target)
        self.offset += len(ids)
        self.fill += len(ids)
        self._pending += len(ids)
        if self.fill == self.seq_len:
            self._end_row()
        if self._pending >= _FLUSH_TOKENS:
            self._flush()

    def _end_row(self) -> None:
        self._rows.append(self.offset)
        self._row_docs.append(self._pieces)
        self.fill = 0

    def _flush(self) -> None:
        while self._backfill:  # the tokens before the first non-target were all targets
            step = min(self._backfill, _FLUSH_TOKENS)
            self._files["targets"].write(np.ones(step, dtype=np.uint8).tobytes())
            self._backfill -= step
        for name, parts, dtype in (("tokens", self._tokens, self.dtype), ("targets", self._targets, np.uint8)):
            if parts:
                self._files[name].write(np.concatenate(parts).astype(dtype, copy=False).tobytes())
        self._files["row_starts"].write(np.asarray(self._rows, dtype=np.int64).tobytes())
        self._files["doc_starts"].write(np.asarray(self._docs, dtype=np.int64).tobytes())
        self._files["row_docs"].write(np.asarray(self._row_docs, dtype=np.int64).tobytes())
        self._tokens, self._targets, self._rows, self._docs, self._row_docs, self._pending = [], [], [], [], [], 0

    def close(self, **extra: Any) -> dict[str, Any]:
        """Finish the last row, write `meta.json` (counts, packing efficiency and `extra`) and return it."""
        if self.fill:
            self._end_row()
        self._flush()
        for f in self._files.values():
            f.close()
        if not self.has_targets:
            (self.folder / "targets.bin").unlink()
        rows = os.path.getsize(self.folder / "row_starts.bin") // 8 - 1
        meta = {"version": FORMAT_VERSION, "seq_len": self.seq_len, "packing": self.packing, "dtype": self.dtype.str,
                "rows": rows, "tokens": self.offset, "documents": self.documents,
                "pieces": os.path.getsize(self.folder / "doc_starts.bin") // 8, "targets": self.has_targets,
                "efficiency": self.offset / (rows * self.seq_len) if rows else 0.0, **extra}
        (self.folder / "meta.json").write_text(json.dumps(meta, indent=1))
        return meta


def pack(documents: Iterable[Document], folder: str | Path, seq_len: int, packing: bool = True,
         split_documents: bool = True, dtype: np.dtype | type = np.uint8) -> PackedRows:
    """Pack `documents` into `folder` (see `PackWriter`) and open the result."""
    writer = PackWriter(folder, seq_len, packing, split_documents, dtype)
    for ids, labels in documents:
        writer.add(ids, labels)
    writer.close()
    return PackedRows(folder)


class FileArray:
    """A flat binary file as a 1-D array that reads what is sliced from it (`os.pread`): no memory map, so nothing
    read stays resident in the process after the slice is gone."""

    def __init__(self, path: str | Path, dtype: np.dtype | type):
        self.path, self.dtype = str(path), np.dtype(dtype)
        self.fd = os.open(self.path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            lo, hi, _ = key.indices(self.size)
            if hi <= lo:
                return np.zeros(0, self.dtype)
            width = self.dtype.itemsize
            return np.frombuffer(os.pread(self.fd, (hi - lo) * width, lo * width), dtype=self.dtype)
        return self[key:key + 1][0]

    def __del__(self) -> None:
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            os.close(fd)


class PackedRows(Dataset):
    """The rows `PackWriter` wrote, as batch dicts (module docstring). The files are opened on first use in each
    process (a DataLoader worker opens its own), so a row costs a few positioned reads of its own bytes."""

    def __init__(self, folder: str | Path, pad_id: int = 0):
        self.folder, self.pad_id = Path(folder), pad_id
        self.meta = json.loads((self.folder / "meta.json").read_text())
        self.seq_len, self.packing = self.meta["seq_len"], self.meta["packing"]
        self._arrays: dict[str, Any] | None = None

    def __len__(self) -> int:
        return self.meta["rows"]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}

    def arrays(self) -> dict[str, Any]:
        if self._arrays is None:
            dtypes = {"tokens": np.dtype(self.meta["dtype"]), "targets": np.uint8, "row_starts": np.int64,
                      "doc_starts": np.int64, "row_docs": np.int64}
            self._arrays = {name: FileArray(self.folder / f"{name}.bin", dtype)
                            for name, dtype in dtypes.items() if (self.folder / f"{name}.bin").exists()}
        return self._arrays

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        a = self.arrays()
        lo, hi = (int(v) for v in a["row_starts"][i:i + 2])
        n, length = hi - lo, self.seq_len
        ids = np.full(length, self.pad_id, dtype=np.int64)
        ids[:n] = a["tokens"][lo:hi]
        labels = np.full(length, IGNORE, dtype=np.int64)
        labels[:n] = ids[:n]
        if "targets" in a:
            labels[:n][a["targets"][lo:hi] == 0] = IGNORE
        docs = a["doc_starts"]
        if "row_docs" in a:  # the written cache: the row's document starts by index
            first, last = (int(v) for v in a["row_docs"][i:i + 2])
        else:  # rows held in memory (a streamed batch): found by search
            first, last = int(np.searchsorted(docs, lo)), int(np.searchsorted(docs, hi))
        starts = np.asarray(docs[first:last], dtype=np.int64) - lo
        row = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        if self.packing:
            labels[starts] = IGNORE  # no prediction crosses into a document from the one before it
            bounds = np.append(starts, [n, length]) if n < length else np.append(starts, n)
            firsts = bounds[:-1]
            pos = np.arange(length) - np.repeat(firsts, np.diff(bounds))
            row["position_ids"] = torch.from_numpy(pos.astype(np.int64))
        else:
            row["attention_mask"] = torch.from_numpy((np.arange(length) < n).astype(np.int64))
        row["index"] = torch.tensor(i, dtype=torch.long)
        return row


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where packed data lives: `cache_dir`, else $FRAMEWORK_DATA_CACHE, else ~/.cache/framework/data."""
    chosen = cache_dir or os.environ.get("FRAMEWORK_DATA_CACHE") or Path.home() / ".cache" / "framework" / "data"
    return Path(chosen).expanduser()


def fingerprint(parts: dict[str, Any]) -> str:
    """A short hash of what made the data (plain JSON values), stable across processes and Python versions."""
    text = json.dumps({"format_version": FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cached(root: Path, key: str, build: Callable[[Path], Any]) -> tuple[Path, bool]:
    """`root/key`, built by `build(tmp_folder)` into a temporary folder and renamed into place if it is not there
    yet, so no reader ever sees half a cache (two builders: the first rename wins, the other's copy is dropped).
    Returns the folder and whether this call built it."""
    final = root / key
    if (final / "done").exists():
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        build(tmp)
        (tmp / "done").write_text(key)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would keep a shared cache from the other users of a node
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "done").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, True


class BestFit:
    """Best-fit decreasing (TRL's BFD) over windows of `window` documents, written bin by bin to `writer`: each
    bin fits a row, so the writer's next-fit over them opens at most one row per bin. None documents are skipped."""

    def __init__(self, writer: PackWriter, seq_len: int, window: int):
        self.writer, self.seq_len, self.window = writer, seq_len, window
        self.buffer: list[tuple[np.ndarray, np.ndarray | None]] = []

    def add(self, doc: tuple[np.ndarray, np.ndarray | None] | None) -> None:
        if doc is not None:
            self.buffer.append(doc)
            if len(self.buffer) >= self.window:
                self.flush()

    def flush(self) -> None:
        for bin_ in best_fit([len(ids) for ids, _ in self.buffer], self.seq_len):
            for i in bin_:
                self.writer.add(*self.buffer[i])
        self.buffer = []


def tail_start(length: int, fraction: float) -> int:
    """Where a single document's held-out tail starts: its last ceil(length · fraction) tokens, at least one, and
    at least one token left to train on (a document of one token trains and validates on it)."""
    if length < 2:
        return length
    return length - min(length - 1, max(1, math.ceil(length * fraction)))


def best_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` in bins of at most `capacity`: longest first, each into the fullest bin it fits."""
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (space left, bin), sorted
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        j = bisect.bisect_left(room, (lengths[i], -1))
        if j < len(room):
            left, b = room.pop(j)
        else:
            left, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        bisect.insort(room, (left - lengths[i], b))
    return bins


def chunks(rows: Iterator[dict[str, Any]], size: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(index of the first, rows) in lists of `size`."""
    chunk: list[dict[str, Any]] = []
    start = 0
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield start, chunk
            start, chunk = start + size, []
    if chunk:
        yield start, chunk


__all__ = ["BestFit", "Document", "FileArray", "IGNORE", "PackWriter", "PackedRows", "best_fit", "cache_root", "cached",
           "chunks", "fingerprint", "pack", "tail_start", "token_dtype"]
