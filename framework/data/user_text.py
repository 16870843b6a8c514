"""`data=text`: the user's own text (a file, folder, glob or Hub dataset; `framework.data.sources`), tokenized once,
packed into rows of `seq_len` (`framework.data.packing`) and cached on disk by what made it.

Our byte models read UTF-8 bytes (vocabulary 256, no EOS: the boundaries live in `position_ids`); a model that
brings a tokenizer (`use_tokenizer`) gets its ids, without its automatic special tokens, its EOS after each
document. The cache key (`fingerprint`) is the source's files with sizes and mtimes (or the Hub repo and commit
sha), the tokenizer's identity (name and a hash of its whole definition), seq_len, packing, column, format and the
split: a second run reads the packed arrays without reading the source, a changed source is packed anew, and a
resumed run whose data changed is refused naming both fingerprints (`load_state_dict`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from framework.data import sources
from framework.data.packing import PackedRows, PackWriter, cache_root, cached, encode, fingerprint, token_dtype
from framework.data.resumable import SplitData
from framework.errors import InputError


class TextData(SplitData):
    """The user's text as packed (or one-per-row, padded) rows; batches are dicts (`framework.data.packing`).

    The validation rows are `val_split` (default: the source's own `validation`/`valid`/`val`/`dev`/`test`
    split), else a held-out `val_fraction` of the documents: every (1/val_fraction)-th, from the first, so
    ceil(n · val_fraction) of n. A `.txt` file is one document (datasets' `sample_by="document"`)."""

    vocab_size = 256
    tokenizer = None
    _tokenizer_identity: dict[str, Any] = {"name_or_path": "bytes"}  # noqa: RUF012 - replaced, never mutated
    mask_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0

    def __init__(
        self,
        source: str | None = None,
        column: str = "text",
        revision: str | None = None,
        format: str | None = None,  # noqa: A002 - the user's word for it (data.format=json)
        split: str = "train",
        val_split: str | None = None,
        val_fraction: float = 0.05,
        seq_len: int = 128,
        packing: bool = True,
        batch_size: int = 32,
        seed: int | None = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        streaming: bool = False,
    ):
        super().__init__()
        for key, value in (("seq_len", seq_len), ("batch_size", batch_size)):
            if not isinstance(value, int) or value < 1:
                raise InputError(f"data.{key}={value!r} must be an integer >= 1")
        if not 0.0 < val_fraction < 1.0:
            raise InputError(f"data.val_fraction={val_fraction} must be in (0, 1) (the share of documents held out "
                             "for validation when the source has no validation split)")
        self.column, self.seq_len, self.packing, self.batch_size = column, seq_len, bool(packing), batch_size
        # a run fills the seed from its own; built on its own (DATA.build("text", ...)) the order is seed 0's
        self.val_fraction, self.seed, self.num_workers = val_fraction, 0 if seed is None else int(seed), num_workers
        self.streaming = bool(streaming)  # read the training split as a stream (framework.data.streaming)
        if not source:
            raise InputError("data.source= is required: a file, a folder, a glob such as 'corpus/*.jsonl', or a Hub "
                             "dataset id 'owner/name' (with data.revision= to pin it)")
        self.root = cache_root(cache_dir)
        self.source = sources.resolve(source, revision, format)
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
        sources.check(self.source, self.column, [split] + ([chosen] if chosen else []))
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
        return {"kind": "text", "source": self.source.identity(), "column": self.column, "format": self.source.format,
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
        """The cached packed arrays of this data, made if missing (atomically: no process sees half of them)."""
        folder, _ = cached(self.root / "text", self.fingerprint, self._write)
        return folder

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
            for i, ids in enumerate(self._documents(self.split)):
                writers["val" if held_out(i, self.val_fraction) else "train"].add(ids)
        metas = {name: w.close(fingerprint=self.fingerprint) for name, w in writers.items()}
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
        read batch: each text's UTF-8 bytes, or the tokenizer's ids and its EOS."""
        for texts in sources.read_texts(self.source, split or self.split, self.column, rows=rows):
            if self.tokenizer is None:
                yield [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
                continue
            eos = [] if self.eos_id is None else [self.eos_id]
            yield [np.asarray(ids + eos, dtype=np.int64)
                   for ids in encode(self.tokenizer, texts)]

    def train_dataloader(self) -> Any:
        """The resumable, self-sharding loader over the packed rows; streamed: `framework.data.streaming`'s."""
        if self.streaming:
            from framework.data import streaming

            return streaming.train_loader(self)
        return super().train_dataloader()

    def state_dict(self) -> dict[str, Any]:
        """Goes into the run's checkpoint: what the data was, so a resumed run can tell it is the same."""
        return {"fingerprint": self.fingerprint, "source": self.source.describe()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refuse to resume on other data than the checkpoint's (InputError naming both fingerprints)."""
        theirs = state.get("fingerprint")
        if theirs is not None and theirs != self.fingerprint:
            raise InputError(f"data.source={self.source.spec}: the data changed since the checkpoint was written "
                             f"(fingerprint {theirs} then, {self.fingerprint} now: the source's files, revision, "
                             "tokenizer, seq_len, packing, column or split differ); resume with the same data, "
                             "or start a new run")

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
                "validation": self.val_split or f"held out: {self.val_fraction:g} of the documents"}


def held_out(i: int, fraction: float) -> bool:
    """Document i is a validation document: every (1/fraction)-th from the first (ceil(n · fraction) of n)."""
    return math.ceil(round((i + 1) * fraction, 9)) > math.ceil(round(i * fraction, 9))


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """A tokenizer's name and a hash of its whole definition (a fast tokenizer's JSON without its call-time
    padding / truncation settings, else its vocabulary), its EOS; bytes for byte data."""
    if tokenizer is None:
        return {"name_or_path": "bytes"}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("padding", "truncation")}
    else:
        definition = sorted(tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]
    return {"name_or_path": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
            "definition": digest, "eos": tokenizer.eos_token_id, "size": len(tokenizer)}


__all__ = ["TextData", "held_out", "tokenizer_identity"]
