"""`data.streaming=true`: the training split read as a stream (`datasets` streaming, `split_dataset_by_node`),
packed on the fly into the same rows the packed cache holds, equal steps on every rank, resumable at any step.

Each rank reads its share of the split (`split_dataset_by_node`: whole files per rank when their number divides the
world size, else 1 row in N of every file). Once per step the ranks agree (`reduce_boolean_decision`, one small
collective) whether any of them still has rows it has not trained on this epoch; a rank whose share has ended
starts it again (rows repeated and counted, as torch's DistributedSampler pads with repeats), so every rank takes
the same number of steps and the epoch ends on all ranks at the same one. The order is the source's, with the files
shuffled by (seed, epoch) (`datasets`' `set_epoch`); no shuffle buffer, whose contents a checkpoint would lose.

The position after every step is small (the `datasets` state before the current read batch, the document and
token reached in it): it goes into the run's checkpoint through Lightning's stateful-loader hooks, so a run killed
mid-epoch resumes with the same next batch without reading what it already trained on.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from framework.data.json_lines import BadRow
from framework.data.packing import IGNORE, PackedRows, tail_start
from framework.data.stream_state import ResumableStream, shard_order_epoch, share_strategy
from framework.errors import InputError

log = logging.getLogger(__name__)

#: a read batch's documents: token ids, or (ids, labels with -100 where no loss is taken)
Documents = list[Any]


def held_out(ids: np.ndarray, fraction: float) -> bool:
    """A document is a validation document when the hash of its tokens falls in the first `fraction` of the range:
    the same in any file order, on any rank, in any epoch (a stream has no stable document index)."""
    return zlib.crc32(np.ascontiguousarray(ids).tobytes()) < fraction * 2**32


def _split(doc: Any) -> tuple[np.ndarray, np.ndarray]:
    """(ids, targets: 1 where a token is a target) of a document given as ids or (ids, labels)."""
    ids, labels = doc if isinstance(doc, tuple) else (doc, None)
    ids = np.asarray(ids)
    targets = np.ones(len(ids), np.uint8) if labels is None else (np.asarray(labels) != IGNORE).astype(np.uint8)
    return ids, targets


class RankStream:
    """One rank's share of the split as rows of `seq_len` tokens, laid out as `PackWriter` lays them (packing:
    documents in order, continued across rows; else one document per row), endless: at the end of its share it
    starts the share again (pass 1, 2, ...: repeated rows). `open_rows(epoch)` gives the rank's `datasets`
    IterableDataset for that epoch; `documents(rows)` its documents, one list per read batch."""

    def __init__(self, open_rows: Callable[[int], Any], documents: Callable[[Any], Iterator[Documents]],
                 seq_len: int, packing: bool = True, split_documents: bool = True):
        self.open_rows, self.documents = open_rows, documents
        self.seq_len, self.packing, self.split_documents = seq_len, packing, split_documents
        self.start(0)

    def start(self, epoch: int, position: dict[str, Any] | None = None) -> None:
        """Begin `epoch` from its first row, or from `position` (a `position()` of the same epoch)."""
        p = position or {}
        self.epoch, self.passes = epoch, p.get("pass", 0)
        self.rows, self.repeated, self.ended = p.get("rows", 0), p.get("repeated", 0), p.get("ended", False)
        self._open(p.get("state"))
        self._skip = (p.get("doc", 0), p.get("token", 0))

    def _open(self, state: dict | None) -> None:
        self._ds = self.open_rows(self.epoch)
        if state is not None:
            self._ds.load_state_dict(state)
        self._first_state, self._groups = state, None
        self._group: list[tuple[np.ndarray, np.ndarray]] = []
        self._group_state, self._doc, self._token = state, 0, 0
        self._skip = (0, 0)

    def position(self) -> dict[str, Any]:
        """Where the next row starts: the `datasets` state before the current read batch, the document and token
        in it; the pass, and this epoch's row counts."""
        return {"epoch": self.epoch, "pass": self.passes, "state": self._group_state, "doc": self._doc,
                "token": self._token, "rows": self.rows, "repeated": self.repeated, "ended": self.ended}

    def _ready(self) -> bool:
        """Point the cursor at the next token, reading on as needed; False when this pass's share has ended."""
        while self._doc >= len(self._group) or self._token >= len(self._group[self._doc][0]):
            if self._doc < len(self._group):
                self._doc, self._token = self._doc + 1, 0
                continue
            if self._groups is None:
                self._groups = iter(self.documents(self._ds))
                before = self._first_state
            else:
                before = self._ds.state_dict()
            group = next(self._groups, None)
            if group is None:
                return False
            self._group, self._group_state = [_split(d) for d in group], before
            self._doc, self._token = self._skip
            self._skip = (0, 0)
        return True

    def has_fresh(self) -> bool:
        """Whether the next row holds tokens not yet trained on this epoch (the first pass has not ended)."""
        if self.passes == 0 and not self.ended and not self._ready():
            self.ended = True
        return self.passes == 0 and not self.ended

    def _next_token_ready(self) -> bool:
        """`_ready`, starting the share again when it ended; InputError when a whole pass gives no token."""
        if self._ready():
            return True
        self.ended, self.passes = True, self.passes + 1
        self._open(None)
        if not self._ready():
            raise InputError("data.streaming: this rank's share of the training split has no text (a source with "
                             "fewer rows or files than ranks?); add data or use fewer devices")
        return True

    def next_row(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The next row: its tokens, targets (1 = a target) and where each document (or piece) starts."""
        ids: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        starts: list[int] = []
        fill, fresh = 0, False
        while fill < self.seq_len:
            if fill and not self._ready():
                break  # the share ends here: a row never mixes two passes
            if not fill:
                self._next_token_ready()
            doc_ids, doc_targets = self._group[self._doc]
            if fill and self._token == 0 and self._starts_new_row(len(doc_ids), fill):
                break
            take = min(self.seq_len - fill, len(doc_ids) - self._token)
            starts.append(fill)
            ids.append(doc_ids[self._token:self._token + take])
            targets.append(doc_targets[self._token:self._token + take])
            fresh |= self.passes == 0
            fill, self._token = fill + take, self._token + take
        self.rows += 1
        self.repeated += not fresh
        return np.concatenate(ids), np.concatenate(targets), starts

    def _starts_new_row(self, length: int, fill: int) -> bool:
        """PackWriter's rule: one document per row unpacked; packed, a whole document that does not fit what is
        left of the row starts the next one when documents are not split."""
        return not self.packing or (not self.split_documents and length > self.seq_len - fill)


def collate(rows: list[tuple[np.ndarray, np.ndarray, list[int]]], seq_len: int, packing: bool, pad_id: int,
            first_index: int, index_step: int = 1) -> dict[str, torch.Tensor]:
    """Rows as one batch dict, read by `PackedRows` itself (the same labels, positions and padding as the cache)."""
    lengths = [len(ids) for ids, _, _ in rows]
    row_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    doc_starts = np.concatenate([np.asarray(s, np.int64) + o for (_, _, s), o in zip(rows, row_starts, strict=False)])
    targets = np.concatenate([t for _, t, _ in rows])
    arrays = {"tokens": np.concatenate([ids for ids, _, _ in rows]), "row_starts": row_starts,
              "doc_starts": doc_starts}
    if not targets.all():
        arrays["targets"] = targets
    view = PackedRows.__new__(PackedRows)  # the cache's reader over in-memory arrays
    view.folder, view.pad_id, view.seq_len, view.packing = None, pad_id, seq_len, packing
    view.meta, view._arrays = {"rows": len(rows), "seq_len": seq_len, "packing": packing}, arrays
    items = [view[i] for i in range(len(rows))]
    batch = {key: torch.stack([item[key] for item in items]) for key in items[0]}
    batch["index"] = first_index + index_step * torch.arange(len(rows), dtype=torch.long)
    return batch


class StreamLoader(ResumableStream):
    """The training loader Lightning iterates: batches of `batch_size` rows of this rank's `RankStream`, as many
    steps on every rank (the ranks agree each step whether any still has fresh rows), resumable through the
    checkpoint (`state_dict` / `load_state_dict`, Lightning's stateful-loader hooks)."""

    def __init__(self, stream: RankStream, batch_size: int, pad_id: int, trainer: Any = None):
        super().__init__(trainer, {"rows": 0, "repeated": 0})
        self.stream, self.batch_size, self.pad_id = stream, batch_size, pad_id

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch = self._current_epoch()
        resume = self._resume if self._resume and self._resume["epoch"] == epoch else None
        self._resume = None
        self.stream.start(epoch, resume)
        batches = resume["batches"] if resume else 0
        self._after = {(epoch, batches): self._position(batches)}
        return self._batches(epoch, batches)

    def _position(self, batches: int) -> dict[str, Any]:
        return {**self.stream.position(), "batches": batches, "totals": dict(self.totals)}

    def _batches(self, epoch: int, batches: int) -> Iterator[dict[str, torch.Tensor]]:
        s = self.stream
        if batches == 0 and self._any(not self._fresh()[0]):  # every rank raises together, none waits for another
            raise InputError(f"data.streaming: a rank's share of the training split is empty ({self.world} ranks: "
                             "a source with fewer rows or files than ranks?); add data or use fewer devices")
        while True:
            first, repeated = s.rows, s.repeated
            fresh, bad = self._fresh()
            rows = None
            if fresh and bad is None:
                try:
                    rows = [s.next_row() for _ in range(self.batch_size)]
                except BadRow as err:
                    bad = err
            any_fresh, any_bad = self._vote(fresh, bad is not None)  # one collective a step, as before
            if any_bad:  # data.strict=true and a bad line on some rank: stop as an interruption, every rank
                self._stop_on(bad)
            if not any_fresh:
                break
            rows = rows or [s.next_row() for _ in range(self.batch_size)]  # a share that ended: its rows again
            batch = collate(rows, s.seq_len, s.packing, self.pad_id, self.rank + self.world * first, self.world)
            self.totals = {"rows": self.totals["rows"] + len(rows),
                           "repeated": self.totals["repeated"] + s.repeated - repeated}
            batches += 1
            self._after[(epoch, batches)] = self._position(batches)
            for old in [k for k in self._after if k[0] != epoch or k[1] < batches - 4]:
                del self._after[old]  # Lightning fetches one batch ahead: a few positions are enough
            yield batch
        log.info("data.streaming: epoch %d on rank %d: %d steps, %d rows, %d of them repeats (rows of its share "
                 "read again while a longer share was still being read)", epoch, self.rank, batches, s.rows,
                 s.repeated)

    def _fresh(self) -> tuple[bool, BadRow | None]:
        """Whether this rank's share has rows not yet trained on this epoch, or the bad line reading them met."""
        try:
            return self.stream.has_fresh(), None
        except BadRow as err:
            return False, err

# ---- the `text` / `chat` DataModule's streamed side (`data.streaming=true`) --------------------------------------
#: validation rows read from the stream's start (the source's validation split, else its held-out documents)
VAL_ROWS = 256


def open_split(data: Any, split: str, rank: int = 0, world: int = 1, shuffle: bool = True) -> Callable[[int], Any]:
    """`open_rows(epoch)`: the rank's share of `split` (`split_dataset_by_node`, `share_strategy`), its files in
    (seed, epoch) order."""
    from datasets.distributed import split_dataset_by_node

    base = data.source.load(split, getattr(data, "stream_bad_lines", lambda: None)())
    strategy = share_strategy(data.source, split, world)

    def open_rows(epoch: int) -> Any:
        rows = split_dataset_by_node(base, rank=rank, world_size=world, **strategy)
        rows.set_epoch(shard_order_epoch(data.seed, epoch) if shuffle else 0)
        return rows

    return open_rows


def documents_of(data: Any, held: float | None, validation: bool = False, tails: bool = False,
                 seen: dict[str, int] | None = None) -> Callable[[Any], Iterator[Documents]]:
    """The DataModule's documents of opened rows (`data.document_batches`), without the held-out ones (training)
    or only them (validation) when a `held` fraction of the documents is the validation set (counted in `seen`).
    `tails`: every document trains on its head and validates on its last `data.val_fraction` of tokens."""
    def documents(rows: Any) -> Iterator[Documents]:
        for group in data.document_batches(rows):
            if tails:
                cuts = [tail_start(len(_split(d)[0]), data.val_fraction) for d in group]
                yield [_cut(d, c, validation) for d, c in zip(group, cuts, strict=True)]
            elif held is None:
                yield group
            else:
                marks = [held_out(_split(d)[0], held) for d in group]
                if seen is not None:
                    seen["val"] += sum(marks)
                    seen["train"] += len(marks) - sum(marks)
                yield [d for d, m in zip(group, marks, strict=True) if m == validation]

    return documents


def _cut(doc: Any, at: int, tail: bool) -> Any:
    """A document's tokens (and labels) before `at`, or from it."""
    part = slice(at, None) if tail else slice(None, at)
    return (doc[0][part], None if doc[1] is None else doc[1][part]) if isinstance(doc, tuple) else doc[part]


def _splits_documents(data: Any) -> bool:
    """Whether packed rows continue a document across rows (text), or keep each whole (chat: `split_documents`)."""
    return bool(getattr(data, "split_documents", True))


def train_loader(data: Any) -> StreamLoader:
    """The streamed training loader of a `text` / `chat` DataModule (`data.trainer` gives rank and world size)."""
    trainer = data.trainer
    rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
    held = None if data.val_split or getattr(data, "tails", False) else data.val_fraction
    documents = documents_of(data, held, tails=getattr(data, "tails", False))
    stream = RankStream(open_split(data, data.split, rank, world), documents, data.seq_len,
                        data.packing, _splits_documents(data))
    data.stream_loader = StreamLoader(stream, data.batch_size, data.pad_id, trainer)
    return data.stream_loader


def val_rows(data: Any, limit: int = VAL_ROWS) -> list[dict[str, torch.Tensor]]:
    """The first `limit` validation rows, the same on every rank: from the source's validation split, else the
    held-out documents of the training split (`held_out`); when those leave validation or training empty (a
    split of one document, or of a few), every document's last val_fraction of tokens (`data.tails`)."""
    seen = {"train": 0, "val": 0}
    if data.val_split:
        opened, documents = open_split(data, data.val_split, shuffle=False), documents_of(data, None)
    else:
        opened = open_split(data, data.split, shuffle=False)
        documents = documents_of(data, data.val_fraction, validation=True, seen=seen)
    rows, ended = _first_rows(data, opened, documents, limit)
    if not data.val_split and ended and (not rows or not seen["train"]) and seen["train"] + seen["val"]:
        data.tails = True
        rows, _ = _first_rows(data, opened, documents_of(data, None, validation=True, tails=True), limit)
    if not rows:
        where = f"the {data.val_split} split" if data.val_split else f"the held-out documents ({data.val_fraction:g})"
        raise InputError(f"data.source={data.source.spec}: {where} has no text in data.column={data.column!r}; "
                         "add text")
    batch = collate(rows, data.seq_len, data.packing, data.pad_id, 0)
    return [{key: value[i] for key, value in batch.items()} for i in range(len(rows))]


def _first_rows(data: Any, opened: Callable[[int], Any], documents: Callable[[Any], Iterator[Documents]],
                limit: int) -> tuple[list[Any], bool]:
    """Up to `limit` rows of a stream, and whether the stream ended before them."""
    stream = RankStream(opened, documents, data.seq_len, data.packing, _splits_documents(data))
    rows = []
    while len(rows) < limit and stream.has_fresh():
        rows.append(stream.next_row())
    return rows, not stream.has_fresh()


def record(data: Any) -> dict[str, Any]:
    """What results.json says about streamed data: the source, and the rows read and repeated so far, summed over
    the ranks (each rank's beside, as gathered at the last checkpoint; this rank's alone before one)."""
    loader = getattr(data, "stream_loader", None)
    counts = loader.totals if loader is not None else {"rows": 0, "repeated": 0}
    ranks = getattr(loader, "rank_totals", None) or [counts]
    out = {**data.source.describe(), "fingerprint": data.fingerprint, "format": data.source.format,
           "column": data.column, "seq_len": data.seq_len, "packing": data.packing, "streaming": True,
           "rows_read": sum(r.get("rows", 0) for r in ranks), "repeated_rows": sum(r.get("repeated", 0) for r in ranks),
           "val_rows": len(data.val_set or ()), "bad_lines": getattr(data, "bad_lines", 0),
           **({"bad_line_examples": data.bad_examples} if getattr(data, "bad_lines", 0) else {}),
           "validation": data.val_split or (f"held out: the last {data.val_fraction:g} of each document's tokens "
                                             "(the split's documents, by content hash, left a side empty)"
                                             if getattr(data, "tails", False) else
                                             f"held out: {data.val_fraction:g} of the documents (by content hash)")}
    if len(ranks) > 1:
        out["ranks"] = [{"rows_read": r.get("rows", 0), "repeated_rows": r.get("repeated", 0)} for r in ranks]
    return out
