"""`data=images data.streaming=true`: webdataset shards, parquet files or a Hub image dataset read as a stream
(`datasets` streaming, `split_dataset_by_node`), for sets too large to convert or hold: nothing is copied ahead.

The same equal-steps rule as the text stream (`framework.data.streaming`): once per step the ranks agree
(`reduce_boolean_decision`) whether any still has images it has not trained on this epoch; a rank whose share has
ended reads it again (repeats, counted), so every rank takes the same number of steps. The shards are shuffled by
(seed, epoch) (`set_epoch`), with no shuffle buffer. A rank's position after each step (the `datasets` state of its
stream and its counts) goes into the run's checkpoint, so a run killed mid-epoch resumes with the same next batch.
Images are decoded and transformed by a thread pool (PIL decodes outside the GIL), each transform's random draws
seeded by (seed, epoch, rank, the image's number in the rank's stream). Bad images are skipped and counted.
"""

from __future__ import annotations

import contextlib
import logging
import random
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from framework.data.image_files import BadImage, load_image
from framework.data.stream_state import ResumableStream, shard_order_epoch, share_strategy
from framework.errors import InputError

log = logging.getLogger(__name__)
VAL_IMAGES = 256  # validation images read from the stream's start (the same on every rank)


def open_stream(data: Any, split: str, rank: int = 0, world: int = 1, shuffle: bool = True) -> Any:
    """`open_rows(epoch)`: the rank's share of `split` as a `datasets` IterableDataset of (image cell, label)."""
    from datasets import Image
    from datasets.distributed import split_dataset_by_node

    base = data.stream_source.load(split)
    keep = [c for c in (data.image_col, data.label_col, "__key__") if c and c in (base.features or {})]
    base = base.select_columns(keep)
    base = base.cast_column(data.image_col, Image(decode=False))
    strategy = share_strategy(data.stream_source, split, world)

    def open_rows(epoch: int) -> Any:
        rows = split_dataset_by_node(base, rank=rank, world_size=world, **strategy)
        rows.set_epoch(shard_order_epoch(data.seed, epoch) if shuffle else 0)
        return rows

    return open_rows


def held_out(cell: dict[str, Any], fraction: float | None) -> bool:
    """An image is a validation image when the hash of its bytes (or path) falls in the first `fraction` of the
    range: the same in any shard order, on any rank (a stream has no stable index)."""
    if fraction is None:
        return False
    key = cell.get("bytes") or str(cell.get("path")).encode()
    return zlib.crc32(key) < fraction * 2**32


@contextlib.contextmanager
def seeded(value: int) -> Iterator[None]:
    """Python's and torch's global generators seeded with `value` (what timm's transforms draw from), and put back
    afterwards: the training process's own random state is untouched."""
    state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        random.seed(value)
        torch.manual_seed(value)
        try:
            yield
        finally:
            random.setstate(state)


class ImageStreamLoader(ResumableStream):
    """The training loader: batches {"x", "y", "index"} of this rank's share, equal steps on every rank, resumable
    (`state_dict` / `load_state_dict`, Lightning's stateful-loader hooks)."""

    def __init__(self, data: Any, transform: Any, trainer: Any = None):
        super().__init__(trainer, {"images": 0, "repeated": 0, "skipped": 0})
        self.data, self.transform = data, transform
        self.open_rows = open_stream(data, data.split, self.rank, self.world)

    def _open(self, state: dict | None) -> None:
        self._rows = self.open_rows(self._epoch)
        if state is not None:
            self._rows.load_state_dict(state)
        self._it, self._ahead, self._state = iter(self._rows), None, state

    def _peek(self) -> dict[str, Any] | None:
        """The next row of the share not yet taken (its position before it in `_state`); None at the share's end."""
        while self._ahead is None:
            self._state = self._rows.state_dict()
            row = next(self._it, None)
            if row is None:
                return None
            if not held_out(row[self.data.image_col], self.data.stream_held):
                self._ahead = row
        return self._ahead

    def _take(self) -> tuple[dict[str, Any], bool]:
        """The next row, starting the share again when it ended (a repeat); (row, fresh)."""
        if self._peek() is None:
            self._pass, self._ended = self._pass + 1, True
            self._open(None)
            if self._peek() is None:
                raise InputError("data.streaming: this rank's share of the training split has no image (a source "
                                 "with fewer shards or rows than ranks?); add data or use fewer devices")
        row, self._ahead = self._ahead, None
        return row, self._pass == 0

    def __iter__(self):
        self._epoch = self._current_epoch()
        p = self._resume if self._resume and self._resume["epoch"] == self._epoch else {}
        self._resume = None
        self._pass, self._ended, self._count = p.get("pass", 0), p.get("ended", False), p.get("count", 0)
        self._open(p.get("state"))
        batches = p.get("batches", 0)
        self._after = {(self._epoch, batches): self._position(batches)}
        return self._batches(batches)

    def _position(self, batches: int) -> dict[str, Any]:
        state = self._state if self._ahead is not None else self._rows.state_dict()  # before the row not taken
        return {"epoch": self._epoch, "batches": batches, "state": state, "pass": self._pass,
                "ended": self._ended, "count": self._count, "totals": dict(self.totals)}

    def _fresh(self) -> bool:
        if self._pass == 0 and not self._ended and self._peek() is None:
            self._ended = True
        return self._pass == 0 and not self._ended

    def _batches(self, batches: int):
        with ThreadPoolExecutor(max(1, self.data.num_workers)) as pool:
            while self._any(self._fresh()):
                items: list[dict[str, Any]] = []
                while len(items) < self.data.batch_size:
                    rows = [self._take() for _ in range(self.data.batch_size - len(items))]
                    first, self._count = self._count, self._count + len(rows)
                    made = list(pool.map(self._item, [(first + k, row) for k, (row, _) in enumerate(rows)]))
                    kept = [item for item in made if item is not None]
                    self.totals["skipped"] += len(rows) - len(kept)
                    self.totals["repeated"] += sum(not fresh for (_, fresh), item in zip(rows, made, strict=True)
                                                   if item is not None)
                    items += kept
                self.totals["images"] += len(items)
                batches += 1
                self._after[(self._epoch, batches)] = self._position(batches)
                for old in [k for k in self._after if k[0] != self._epoch or k[1] < batches - 4]:
                    del self._after[old]
                yield {"x": torch.stack([i["x"] for i in items]), "y": torch.tensor([i["y"] for i in items]),
                       "index": torch.tensor([i["index"] for i in items], dtype=torch.long)}

    def _item(self, numbered: tuple[int, dict[str, Any]]) -> dict[str, Any] | None:
        n, row = numbered
        try:
            where = row.get("__key__") or f"image {n} of rank {self.rank}"
            image = decode(self.data, row, f"{self.data.source_spec} ({self.data.split}: {where})")
        except BadImage as err:
            if self.data.strict:
                raise
            log.warning("data.streaming: skipped %s", err)
            return None
        with seeded(((int(self.data.seed or 0) * 1_000_003 + self._epoch) * 10_000_019 + n * self.world + self.rank)
                    % 2**63):
            x = self.transform(image)
        return {"x": x, "y": self.data.stream_label(row), "index": self.rank + self.world * n}


def setup_stream(data: Any, spec: str, revision: str | None, image_column: str, label_column: str,
                 class_map: Any) -> None:
    """Resolve `spec` for streaming (a Hub dataset, parquet files or webdataset shards) and set on `data` what the
    loaders read: `stream_source`, `image_col`, `label_col`, `classes`, `stream_label`, `val_split`."""
    from pathlib import Path

    from framework.data import image_sources as isrc
    from framework.data import sources

    path = Path(spec).expanduser()
    if path.is_dir() and not isrc._table_files(path):
        raise InputError(f"data.streaming=true reads .tar shards, .parquet files or a Hub dataset; {spec} is a folder "
                         "of images, read file by file already (data.streaming=false)")
    if path.exists() or any(ch in spec for ch in "*?["):
        kind, files = isrc._local_tables(spec, path)
        if kind == "imagefolder":
            raise InputError(f"data.streaming=true: {spec} is an imagefolder with metadata; read it with "
                             "data.streaming=false")
        every = sorted({f for fs in files.values() for f in fs})
        stats = tuple((f, st.st_size, st.st_mtime_ns) for f in every for st in [Path(f).stat()])
        from framework.data.packing import cache_root

        source = sources.Source(spec, kind, files, stats, format=kind, memo=cache_root())  # digests remembered
    else:
        source = sources.resolve(spec, revision)
    data.stream_source, data.source_spec = source, spec
    splits = sources.splits_of(source)
    if data.split not in splits:
        raise InputError(f"data.split={data.split!r} is not a split of {spec}; its splits: {', '.join(splits)}")
    data.splits = splits
    features = source.load(data.split).features or {}
    data.image_col = isrc._image_column(spec, _Columns(features), image_column)
    data.label_col = isrc._label_column(spec, _Columns(features), label_column)
    if data.label_col is None:
        raise InputError(f"data.source={spec}: no label column (data.label_column=); its columns: "
                         f"{', '.join(features)}")
    _stream_classes(data, features.get(data.label_col), isrc._read_class_map(class_map))


class _Columns:
    """What `image_sources`' column checks read of a table (`features`, `column_names`), from a stream's features."""

    def __init__(self, features: Any):
        self.features, self.column_names = features, list(features)


def _stream_classes(data: Any, feature: Any, class_map: dict[str, Any] | None) -> None:
    """The classes a stream's labels name: a ClassLabel's names (through `class_map` if given), else `class_map`'s
    (a stream cannot be read through first to find them)."""
    from datasets import ClassLabel

    natural = list(feature.names) if isinstance(feature, ClassLabel) else None
    if class_map is None and natural is None:
        raise InputError(f"data.streaming=true: the label column {data.label_col!r} of {data.source_spec} states no "
                         "class names (not a ClassLabel); name them with data.class_map={value: index, ...} (a "
                         "stream is not read through ahead to find them)")
    if class_map is None:
        data.classes, lookup = natural, {n: i for i, n in enumerate(natural)}
    elif all(isinstance(v, int) for v in class_map.values()):
        data.classes = [str(i) for i in range(max(class_map.values()) + 1)]
        lookup = dict(class_map)
    else:
        data.classes = sorted({str(v) for v in class_map.values()})
        lookup = {k: data.classes.index(str(v)) for k, v in class_map.items()}

    def label(row: dict[str, Any]) -> int:
        raw = row[data.label_col]
        key = natural[raw] if natural is not None else str(raw)
        if key not in lookup:
            raise InputError(f"data.source={data.source_spec}: label {key!r} is not in data.class_map "
                             f"({', '.join(list(lookup)[:10])})")
        return lookup[key]

    data.stream_label = label


def decode(data: Any, row: dict[str, Any], name: str) -> Any:
    cell = row[data.image_col]
    return load_image(cell.get("bytes") or cell["path"], name=name)


def val_items(data: Any, transform: Any, limit: int = VAL_IMAGES) -> list[dict[str, Any]]:
    """The first `limit` validation images, the same on every rank: the source's validation split, else the
    held-out images of the training split (`held_out`)."""
    split = data.val_split or data.split
    items = []
    for row in open_stream(data, split, shuffle=False)(0):
        cell = row[data.image_col]
        if not data.val_split and not held_out(cell, data.stream_held):
            continue
        try:
            image = decode(data, row, f"{data.source_spec} ({split} image)")
        except BadImage:
            continue
        items.append({"x": transform(image), "y": data.stream_label(row), "index": len(items)})
        if len(items) == limit:
            break
    if not items:
        where = f"the {data.val_split} split" if data.val_split else f"the held-out images ({data.val_fraction:g})"
        raise InputError(f"data.source={data.source_spec}: {where} has no image; raise data.val_fraction or add "
                         "images")
    return items


__all__ = ["ImageStreamLoader", "held_out", "open_stream", "seeded", "setup_stream", "val_items"]
