"""`data=text`: the user's own text (a file, folder, glob or Hub dataset; `framework.data.sources`), tokenized once,
packed into rows of `seq_len` (`framework.data.packing`) and cached on disk by what made it.

Our byte models read UTF-8 bytes (vocabulary 256, no EOS: the boundaries live in `position_ids`); a model that
brings a tokenizer (`use_tokenizer`) gets its ids, without its automatic special tokens, its EOS after each
document. The cache key (`fingerprint`) is the source's files' bytes (a digest each, `framework.data.file_ids`; or
the Hub repo and commit sha), the tokenizer's identity (name and a hash of its whole definition), seq_len, packing,
column, format and the split: a second run reads the packed arrays without reading the source, a touched or
re-staged copy is the same data, a changed source is packed anew (a log line says what changed), and a resumed run
whose data changed is refused naming the file and what changed (`load_state_dict`; `data.allow_changed=true` goes
on with the new data).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from framework.data import changes, sources
from framework.data.packing import (
    PackedRows,
    PackWriter,
    cache_root,
    cached,
    encode,
    fingerprint,
    tail_start,
    token_dtype,
)
from framework.data.resumable import SplitData
from framework.data.text_keys import held_out, tokenizer_identity
from framework.errors import InputError

log = logging.getLogger(__name__)


class TextData(SplitData):
    """The user's text as packed (or one-per-row, padded) rows; batches are dicts (`framework.data.packing`).

    The validation rows are `val_split` (default: the source's own `validation`/`valid`/`val`/`dev`/`test`
    split), else a held-out `val_fraction` of the documents: every (1/val_fraction)-th, from the first, so
    ceil(n · val_fraction) of n; a split of a single document holds out its last val_fraction of tokens instead.
    A `.txt` (or `.md`) file is one document, read in pieces of at most 256 Ki characters (`framework.data.text_files`).

    Args:
        source: a file, folder, glob (`corpus/*.jsonl`) or Hub dataset id `owner/name`; required.
        column: the column holding each document's text (ignored for plain-text files).
        revision: Hub branch, tag or commit of a Hub `source`, pinned in the cache key; None: the default branch.
        format: datasets' reader ("text", "json", "csv", "parquet", "arrow"); None: from the files' extensions.
        split: the source's split to train on.
        val_split: the source's split to validate on; None: its own validation/valid/val/dev/test split if any.
        val_fraction: share of the documents held out for validation when there is no validation split, in (0, 1).
        seq_len: tokens per row; None: the run's model's maximum length.
        packing: pack several documents per row (attention kept within each); False: one document per padded row.
        batch_size: rows per batch.
        seed: seed of the training rows' order; None: 0 (a run fills in its own seed).
        num_workers: DataLoader worker processes; 0 loads in the main process.
        cache_dir: root of the packed-data cache; None: $FRAMEWORK_DATA_CACHE, else ~/.cache/framework/data.
        streaming: read the training split as a stream instead of packing it into the cache first (very large corpora).
        sample_by: what one document of a text file is: "document" (the whole file), "line" or "paragraph".
        config: the Hub dataset's configuration (subset) name; None: its default.
        allow_changed: resume even if the data changed since the checkpoint; False refuses, naming what changed.
        strict: when streaming, stop at a bad JSON line; False skips and counts it.
    """

    vocab_size = 256
    tokenizer = None
    _tokenizer_identity: dict[str, Any] = {"name_or_path": "bytes"}  # noqa: RUF012 - replaced, never mutated
    mask_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0
    tails = False  # streamed: every document validates on its last tokens (`streaming.val_rows` decides)

    def __init__(
        self,
        source: str | None = None,
        column: str = "text",
        revision: str | None = None,
        format: str | None = None,  # noqa: A002 - the user's word for it (data.format=json)
        split: str = "train",
        val_split: str | None = None,
        val_fraction: float = 0.05,
        seq_len: int | None = 128,
        packing: bool = True,
        batch_size: int = 32,
        seed: int | None = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        streaming: bool = False,
        sample_by: str = "document",
        config: str | None = None,
        allow_changed: bool = False,
        strict: bool = False,
    ):
        super().__init__()
        for key, value in (("seq_len", seq_len), ("batch_size", batch_size)):  # seq_len None: the run's model's
            if (value is not None or key != "seq_len") and (not isinstance(value, int) or value < 1):
                raise InputError(f"data.{key}={value!r} must be an integer >= 1")
        if not 0.0 < val_fraction < 1.0:
            raise InputError(f"data.val_fraction={val_fraction} must be in (0, 1) (the share of documents held out "
                             "for validation when the source has no validation split)")
        self.column, self.seq_len, self.packing, self.batch_size = column, seq_len, bool(packing), batch_size
        # a run fills the seed from its own; built on its own (DATA.build("text", ...)) the order is seed 0's
        self.val_fraction, self.seed, self.num_workers = val_fraction, 0 if seed is None else int(seed), num_workers
        self.streaming = bool(streaming)  # read the training split as a stream (framework.data.streaming)
        self.allow_changed = bool(allow_changed)  # resume on data that changed since the checkpoint
        self.strict = bool(strict)  # streamed: a bad JSON line stops the run (else it is skipped and counted)
        # streamed: the distinct bad lines skipped so far (this process; a share read again repeats none), the first
        self.bad_lines, self.bad_examples, self._bad_seen = 0, [], set()
        if not source:
            raise InputError("data.source= is required: a file, a folder, a glob such as 'corpus/*.jsonl', or a Hub "
                             "dataset id 'owner/name' (with data.revision= to pin it)")
        self.root = cache_root(cache_dir)
        self.source = sources.resolve(source, revision, format, sample_by, config, self.root)
        self.split, self.val_split = split, self._check(split, val_split)
        self.train_set: PackedRows | None = None
        self.val_set: PackedRows | None = None
        self.meta: dict[str, dict[str, Any]] = {}

    def _check(self, split: str, val_split: str | None) -> str | None:
        """The source checked once per version of it (remembered under the cache root); returns the validation
        split to read, or None to hold documents out of the training split."""
        key = fingerprint({"check": self.source.identity(), "column": self.column, "split": split,
                           "val_split": val_split})
        seen = sources.remembered(self.root, key)
        if seen is not None:
            return seen["val_split"]
        names = sources.splits_of(self.source)
        if split not in names:
            raise InputError(f"data.split={split!r} is not a split of {self.source.spec}; its splits: "
                             f"{', '.join(names)}")
        if val_split is not None and val_split not in names:
            raise InputError(f"data.val_split={val_split!r} is not a split of {self.source.spec}; its splits: "
                             f"{', '.join(names)} (or null: its own validation split, else data.val_fraction)")
        chosen = val_split or next((s for s in sources.VAL_SPLITS if s in names and s != split), None)
        sources.check(self.source, self.column, [split] + ([chosen] if chosen else []),
                      self.stream_bad_lines() if self.streaming else None)
        sources.remember(self.root, key, {"val_split": chosen})
        return chosen

    def use_tokenizer(self, tokenizer: Any) -> None:
        """Read the text as `tokenizer`'s ids (a transformers tokenizer): its vocabulary, EOS, pad and [MASK]."""
        self.tokenizer = tokenizer
        self._tokenizer_identity = tokenizer_identity(tokenizer)  # once: hashing a large vocabulary takes a while
        self.vocab_size = len(tokenizer)
        self.eos_id = tokenizer.eos_token_id
        self.mask_id = getattr(tokenizer, "mask_token_id", None)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_id if self.eos_id is not None else 0)
        self.train_set = self.val_set = None

    def identity(self) -> dict[str, Any]:
        """Everything that made the packed arrays (the cache key is its `fingerprint`)."""
        held = None if self.val_split else self.val_fraction
        if self.seq_len is None:
            raise InputError("data.seq_len=null means the model's context length, which a run hands the data from its "
                             "model; built on its own, give data.seq_len (e.g. 2048)")
        return {"kind": "text", "source": self.source.identity(), "column": self.column,
                "split": self.split, "val_split": self.val_split, "val_fraction": held,
                "tokenizer": self._tokenizer_identity, "seq_len": self.seq_len, "packing": self.packing,
                **({"streaming": True} if self.streaming else {})}

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.identity())

    def prepare_data(self) -> None:
        """Tokenize and pack into the cache, once per node (Lightning calls it on local rank 0 before `setup`)."""
        if not self.streaming:  # streamed: nothing is written ahead
            self.build()

    def build(self) -> Path:
        """The cached packed arrays of this data, made if missing (atomically: no process sees half of them); a
        build says so in the log, and what changed since the last build from this source and settings."""
        folder, built = cached(self.root / "text", self.fingerprint, self._write)
        if built:
            self._say_built(folder)
        return folder

    def _lineage(self) -> Path:
        """Where the last build from this source (by its spec) and settings is remembered."""
        spec = self.source.repo_id or os.path.abspath(os.path.expanduser(self.source.spec))
        kind = self.identity()["kind"]
        return self.root / "sources" / f"last-{fingerprint({'spec': spec, 'kind': kind, 'split': self.split})}.json"

    def _say_built(self, folder: Path) -> None:
        now = self._version()
        before = sources.remembered(self._lineage().parent, self._lineage().stem)
        if before and before.get("fingerprint") != self.fingerprint:
            old = folder.parent / str(before["fingerprint"])
            kept = (f"; the cache it supersedes stays ({old}, {_size(old) / 2**20:,.1f} MiB): "
                    f"python -m framework.data cache rm {before['fingerprint']}") if old.exists() else ""
            # a warning: a run's console and train.log show it, and so does `prepare` (no logging set up there)
            log.warning("data: %s tokenized and packed anew (%s)%s", self.source.spec, changes.describe(before, now),
                        kept)
        else:
            log.info("data: %s tokenized and packed into %s", self.source.spec, folder)
        sources.remember(self._lineage().parent, self._lineage().stem, now)

    def _version(self) -> dict[str, Any]:
        """This data's identity, fingerprint, files and training documents (a checkpoint and the lineage keep it)."""
        docs = self.meta.get("train", {}).get("documents") if self.meta else None
        if docs is None and (self.root / "text" / self.fingerprint / "train" / "meta.json").exists():
            docs = json.loads((self.root / "text" / self.fingerprint / "train" / "meta.json").read_text())["documents"]
        return {"fingerprint": self.fingerprint, "identity": self.identity(),
                "files": [] if self.source.repo_id else self.source.file_table(), "documents": docs}

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None or (self.streaming and self.val_set is not None):
            return
        if self.streaming:
            from framework.data import streaming

            self.val_set = streaming.val_rows(self)
            return
        folder = self.build()
        self.train_set, self.val_set = (PackedRows(folder / name, self.pad_id) for name in ("train", "val"))
        self.meta = {"train": self.train_set.meta, "val": self.val_set.meta}
        world = self.trainer.world_size if self.trainer is not None else 1
        if len(self.train_set) < self.batch_size * world:
            raise InputError(f"data.source={self.source.spec} gives {len(self.train_set)} training rows of "
                             f"{self.seq_len} tokens, fewer than one batch of data.batch_size={self.batch_size} "
                             f"on each of {world} rank(s): lower data.batch_size or data.seq_len, or add text")

    def _write(self, folder: Path) -> None:
        writers = {name: PackWriter(folder / name, self.seq_len, self.packing, dtype=token_dtype(self.vocab_size))
                   for name in ("train", "val")}
        if self.val_split:
            for name, split in (("train", self.split), ("val", self.val_split)):
                for ids in self._documents(split):
                    writers[name].add(ids)
        else:
            first = None  # held until a second document shows the split has more than one
            for i, ids in enumerate(self._documents(self.split)):
                if i == 0:
                    first = ids
                    continue
                if first is not None:
                    writers["val"].add(first)
                    first = None
                writers["val" if held_out(i, self.val_fraction) else "train"].add(ids)
            if first is not None:  # a single document: its last tokens are the validation text
                keep = tail_start(len(first), self.val_fraction)
                writers["train"].add(first[:keep])
                writers["val"].add(first[keep:])
        metas = {name: w.close(fingerprint=self.fingerprint, source=self.source.spec) for name, w in writers.items()}
        for name, meta in metas.items():
            if not meta["tokens"]:
                where = f"the {self.val_split} split" if name == "val" and self.val_split else f"the {name} part"
                raise InputError(f"data.source={self.source.spec}: {where} has no text in data.column="
                                 f"{self.column!r} (an empty source)")

    def _documents(self, split: str) -> Iterator[np.ndarray]:
        """Each non-empty text of `split` as token ids (`document_batches`), in order."""
        for batch in self.document_batches(None, split):
            yield from batch

    def document_batches(self, rows: Any = None, split: str | None = None) -> Iterator[list[np.ndarray]]:
        """The documents of `split` (or of `rows`, a split already opened: `framework.data.streaming`), a list per
        read batch: each text's UTF-8 bytes, or the tokenizer's ids and its EOS. Streamed, the split is read as
        the stream reads it (`stream_bad_lines`)."""
        mode = self.stream_bad_lines() if self.streaming else None
        if rows is None and mode and sources.json_lines.readable(self.source.files.get(split or self.split, [])):
            rows = self.source.load(split or self.split, mode)
        for texts in sources.read_texts(self.source, split or self.split, self.column, rows=rows,
                                        on_bad=self._bad_line):
            if self.tokenizer is None:
                yield [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
                continue
            eos = [] if self.eos_id is None else [self.eos_id]
            yield [np.asarray(ids + eos, dtype=np.int64)
                   for ids in encode(self.tokenizer, texts)]

    def stream_bad_lines(self) -> str | None:
        """How a stream reads local JSON Lines: line by line, a bad line skipped ("skip") or stopping the run
        ("raise", `strict`)."""
        return "raise" if self.strict else "skip"

    def _bad_line(self, where: str) -> None:
        """A streamed bad line, skipped: counted once, the first few said in the log."""
        key = where.split(":", 1)[0]  # "file line N"
        if key in self._bad_seen:
            return
        self._bad_seen.add(key)
        self.bad_lines += 1
        if self.bad_lines <= 3:
            self.bad_examples.append(where)
            log.warning("data.source=%s: %s is not a JSON object: skipped and counted (data.strict=true stops on "
                        "it)%s", self.source.spec, where, "; later ones are only counted" if self.bad_lines == 3
                        else "")

    def train_dataloader(self) -> Any:
        """The resumable, self-sharding loader over the packed rows; streamed: `framework.data.streaming`'s."""
        if self.streaming:
            from framework.data import streaming

            return streaming.train_loader(self)
        return super().train_dataloader()

    def state_dict(self) -> dict[str, Any]:
        """Goes into the run's checkpoint: what the data was (its identity, files and documents), so a resumed run
        can tell it is the same and, when it is not, say what changed."""
        return {**self._version(), "source": self.source.describe()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refuse to resume on other data than the checkpoint's (InputError naming what changed), unless
        `allow_changed`: then say it and go on with the new data."""
        theirs = state.get("fingerprint")
        if theirs is None or theirs == self.fingerprint:
            return
        what = changes.describe(state, self._version()) if "identity" in state else (
            f"fingerprint {theirs} then, {self.fingerprint} now: the source's files, revision, tokenizer, seq_len, "
            "packing, column or split differ")
        if self.allow_changed:
            log.warning("data.source=%s: resuming on data that changed since the checkpoint (%s)", self.source.spec,
                        what)
            return
        raise InputError(f"data.source={self.source.spec}: the data changed since the checkpoint was written "
                         f"({what}); resume on the new data with data.allow_changed=true, or start a new run")

    def record(self) -> dict[str, Any]:
        """What results.json and the model card say about the data: dataset, format, tokens, packing efficiency."""
        self.setup()
        if self.streaming:
            from framework.data import streaming

            return streaming.record(self)
        train, val = self.meta["train"], self.meta["val"]
        return {**self.source.describe(), "fingerprint": self.fingerprint, "format": self.source.format,
                "column": self.column, "tokenizer": self._tokenizer_identity["name_or_path"],
                "seq_len": self.seq_len, "packing": self.packing, "documents": train["documents"],
                "tokens": train["tokens"], "rows": train["rows"], "packing_efficiency": round(train["efficiency"], 4),
                "val_documents": val["documents"], "val_tokens": val["tokens"],
                "validation": self.val_split or (f"held out: {self.val_fraction:g} of the documents" if
                                                 train["documents"] > 1 else f"held out: the last {self.val_fraction:g}"
                                                 " of the single document's tokens")}


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


__all__ = ["TextData", "held_out", "tokenizer_identity"]
