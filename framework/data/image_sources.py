"""Where the user's images come from: `open_images(source)` gives one split of labelled (or unlabelled) images.

A source is a folder (an ImageFolder tree: one folder per class, labels from the leaf folders' paths, optionally
under split folders `train/`, `validation/`...; or a flat folder of images without labels), a folder with a
`metadata.csv`/`.jsonl` (datasets' `imagefolder`), `.parquet` files, webdataset `.tar` shards, or a Hub image
dataset by name (+ revision, recorded as the commit sha). The tables are read through Hugging Face `datasets`
(imported only then), into its Arrow cache under the data cache: memory-mapped, so a set larger than memory is
read from disk. What this adds: every image decoded once when the source is first opened (remembered by the
source's fingerprint), a file that is not an image or is truncated skipped and counted (or refused, `strict`),
class names and a `class_map`, and the refusals a user should get first, each naming the value.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.data.image_files import BadImage, check_image, is_image_name, list_images, load_image
from framework.data.packing import cache_root, fingerprint
from framework.data.sources import VAL_SPLITS
from framework.errors import InputError

log = logging.getLogger(__name__)
#: folder names read as a source's splits (the `datasets` convention), and label columns tried after `label`
SPLIT_NAMES = ("train", *VAL_SPLITS)
LABEL_COLUMNS = ("label", "cls", "labels", "class", "target")
_TABLES = {".parquet": "parquet", ".tar": "webdataset"}


@dataclass
class ImageSource:
    """One split of a source: `len()` images, `image(i)` (PIL RGB), `label(i)` (int, None unlabelled), `classes`."""

    spec: str
    kind: str  # folder | flat | imagefolder | parquet | webdataset | hub
    split: str
    splits: list[str]
    items: list[Any]  # file paths (folders), else row numbers of `table`
    labels: list[int] | None
    classes: list[str] | None
    ident: dict[str, Any]
    table: Any = None  # a datasets.Dataset holding only the image column, undecoded
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why) of files that are not images
    left_out: int = 0  # images whose class the class_map does not name
    revision: str | None = None  # the Hub revision asked for (the commit it named is `ident["sha"]`)
    channels: int = 3  # 1 when every image that decodes is grey (the scan says), else 3

    def __len__(self) -> int:
        return len(self.items)

    def name(self, i: int) -> str:
        return str(self.items[i]) if self.table is None else f"{self.spec} ({self.split} row {self.items[i]})"

    def image(self, i: int) -> Any:
        if self.table is None:
            return load_image(self.items[i], channels=self.channels)
        cell = self.table[int(self.items[i])][self.table.column_names[0]]
        return load_image(cell.get("bytes") or cell["path"], name=self.name(i), channels=self.channels)

    def label(self, i: int) -> int | None:
        return None if self.labels is None else self.labels[i]

    def identity(self) -> str:
        """A fingerprint of what the images are: the files' paths, sizes and mtimes, or the Hub repo's commit sha."""
        return fingerprint({"images": self.ident, "split": self.split})

    def describe(self) -> dict[str, Any]:
        """For results.json and the model card: the dataset, its split, counts, classes and the skipped files."""
        where = {"dataset": self.ident["hub"], "revision": self.revision or "main", "sha": self.ident["sha"]} \
            if "hub" in self.ident else {"dataset": self.spec}
        out = {**where, "format": self.kind, "split": self.split, "images": len(self),
               "classes": len(self.classes) if self.classes else None, "skipped": len(self.skipped)}
        if self.skipped:
            out["skipped_examples"] = [f"{Path(n).name}: {why}" for n, why in self.skipped[:5]]
        if self.left_out:
            out["not_in_class_map"] = self.left_out
        return out


def open_images(source: str, split: str = "train", revision: str | None = None, image_column: str = "image",
                label_column: str = "label", class_map: dict | str | None = None, *, classes: list[str] | None = None,
                strict: bool = False, min_classes: int = 1, cache_dir: str | None = None,
                workers: int = 0) -> ImageSource:
    """One split of `source` (see the module), bad files skipped and counted (`strict`: refused, naming the file).
    `classes`: the training split's class names, which another split's labels must use; `min_classes`: refuse a
    labelled split with fewer distinct classes (training needs 2); InputError naming the value otherwise."""
    spec = str(source)
    path = Path(spec).expanduser()
    opts = {"revision": revision, "image_column": image_column, "label_column": label_column, "cache_dir": cache_dir}
    if path.is_dir() and not _table_files(path):
        found = _from_folder(spec, path, split)
    elif path.exists() or any(ch in spec for ch in "*?["):
        found = _from_table(spec, path, split, **opts)
    elif "/" in spec and not spec.startswith((".", "~", "/")):
        found = _from_table(spec, None, split, **opts)
    else:
        raise InputError(f"data.source={spec}: no such file or folder (give a folder of images, .parquet files, "
                         "webdataset .tar shards, or a Hub image dataset id 'owner/name')")
    raw, natural, src = found
    _scan(src, strict, cache_dir, workers)
    if raw is not None:
        lost = sorted({str(r) for r in raw} - {str(raw[i]) for i in src.ident["kept"]})
        if lost:  # a class folder whose every file was skipped
            log.warning("data.source=%s: class%s %s lost every file (none decodes as an image): not a class of this "
                        "run", spec, "es" if len(lost) > 1 else "", ", ".join(lost))
        raw = [raw[i] for i in src.ident.pop("kept")]
        _apply_labels(src, raw, natural, _read_class_map(class_map), classes)
        present = len(set(src.labels or ()))
        if present < min_classes:
            raise InputError(f"data.source={spec}: the {split} split holds images of {present} class"
                             f"{'' if present == 1 else 'es'} ({', '.join(src.classes or [])}); training a "
                             f"classifier needs at least {min_classes} (one folder per class)")
    else:
        src.ident.pop("kept")
    return src


def _table_files(folder: Path) -> list[Path]:
    """The .parquet / .tar files of a folder without images, or the metadata file that makes it an imagefolder."""
    meta = [p for p in folder.rglob("metadata.*") if p.suffix in (".csv", ".jsonl")]
    if meta:
        return meta
    files = sorted(p for p in folder.rglob("*") if p.suffix in _TABLES and p.is_file())
    has_images = any(is_image_name(p) for p in folder.rglob("*"))
    return [] if has_images else files


def _from_folder(spec: str, root: Path, split: str) -> tuple[list[str] | None, None, ImageSource]:
    """An ImageFolder tree (labels: each image's folder relative to the root) or a flat folder (no labels)."""
    splits = [s for s in SPLIT_NAMES if (root / s).is_dir()]
    if splits:
        if split not in splits:
            raise InputError(f"data.split={split!r}: {spec} has no folder {split}/; its split folders: "
                             f"{', '.join(splits)}")
        root = root / split
    elif split != "train":
        raise InputError(f"data.split={split!r}: {spec} has no split folders (train/, validation/, ...); all its "
                         "images are the train split")
    paths = list_images(root)
    rel = [p.relative_to(root).parent.as_posix() for p in paths]
    kind = "folder" if all(r != "." for r in rel) else "flat"
    if kind == "flat" and any(r != "." for r in rel):
        log.warning("data.source=%s: images both in the folder itself and in subfolders: read as unlabelled", spec)
    stats = [(p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns) for p in paths for st in [p.stat()]]
    src = ImageSource(spec, kind, split, splits or ["train"], [str(p) for p in paths], None, None,
                      {"root": str(root.absolute()), "files": stats})
    return (rel if kind == "folder" else None), None, src


def _from_table(spec: str, path: Path | None, split: str, revision: str | None, image_column: str,
                label_column: str, cache_dir: str | None) -> tuple[list[Any] | None, list[str] | None, ImageSource]:
    """A source `datasets` reads: a Hub dataset, a local imagefolder (with metadata), parquet files or tar shards."""
    from framework.data import sources

    datasets = sources.datasets_module()
    store = str(cache_root(cache_dir) / "images" / "datasets")
    if path is None:  # a Hub dataset by name: its commit sha now (the errors name the Hub and the repo)
        hub = sources.resolve(spec, revision)
        builder = datasets.load_dataset_builder(spec, revision=hub.sha, cache_dir=store)
        kind, ident = "hub", {"hub": spec, "sha": hub.sha}
    else:
        kind, files = _local_tables(spec, path)
        if kind == "imagefolder":
            builder = datasets.load_dataset_builder("imagefolder", data_dir=str(path), cache_dir=store)
        else:
            builder = datasets.load_dataset_builder(kind, data_files=files, cache_dir=store)
        every = sorted({str(f) for fs in builder.config.data_files.values() for f in fs})
        ident = {"format": kind, "files": [(f, st.st_size, st.st_mtime_ns) for f in every for st in [os.stat(f)]]}
    splits = [str(s) for s in (builder.config.data_files or builder.info.splits or {})]
    if split not in splits:
        raise InputError(f"data.split={split!r} is not a split of {spec}; its splits: {', '.join(splits)}")
    try:
        builder.download_and_prepare()
        table = builder.as_dataset(split=split)
    except (ValueError, OSError) as err:
        raise InputError(f"data.source={spec}: the {split} split cannot be read "
                         f"({' '.join(str(err).split())[:300]})") from None
    image_col = _image_column(spec, table, image_column)
    label_col = _label_column(spec, table, label_column)
    feature = table.features.get(label_col) if label_col else None
    natural = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    raw = list(table[label_col]) if label_col else None
    table = table.select_columns([image_col]).cast_column(image_col, datasets.Image(decode=False))
    src = ImageSource(spec, kind, split, splits, list(range(len(table))), None, None, ident, table=table,
                      revision=revision)
    return raw, natural, src


def _local_tables(spec: str, path: Path) -> tuple[str, Any]:
    """(builder, data_files) of a local table source: a metadata folder, parquet, or tar shards of one kind."""
    import glob

    if path.is_dir():
        found = _table_files(path)
        if found and found[0].name.startswith("metadata."):
            return "imagefolder", None
    else:
        found = [Path(p) for p in sorted(glob.glob(os.path.expanduser(spec), recursive=True))] if not path.exists() \
            else [path]
    kinds = sorted({_TABLES.get(p.suffix, p.suffix or "(no extension)") for p in found if p.is_file()})
    if not kinds:
        raise InputError(f"data.source={spec}: matches no image files, .parquet files or .tar shards")
    if len(kinds) > 1 or kinds[0] not in _TABLES.values():
        raise InputError(f"data.source={spec}: cannot read {', '.join(kinds)} files as images; give a folder of "
                         f"images, .parquet files or webdataset .tar shards (one kind)")
    if path.is_dir():  # datasets' split inference from the file names (train-*.parquet, validation-*.tar ...)
        from datasets.data_files import DataFilesDict, get_data_patterns

        return kinds[0], {str(k): list(v) for k, v in DataFilesDict.from_patterns(
            get_data_patterns(str(path)), base_path=str(path)).items()}
    return kinds[0], {"train": [str(p) for p in found]}


def _image_column(spec: str, table: Any, wanted: str) -> str:
    import datasets

    images = [name for name, f in table.features.items() if isinstance(f, datasets.Image)]
    if wanted in table.features:
        return wanted
    if wanted == "image" and len(images) == 1:  # webdataset names it by extension: jpg, png ...
        return images[0]
    raise InputError(f"data.image_column={wanted!r} is not a column of {spec}; its columns: "
                     f"{', '.join(table.column_names)} (image columns: {', '.join(images) or 'none'})")


def _label_column(spec: str, table: Any, wanted: str | None) -> str | None:
    if not wanted:
        return None
    if wanted in table.features:
        return wanted
    if wanted == "label":
        return next((c for c in LABEL_COLUMNS if c in table.features), None)
    raise InputError(f"data.label_column={wanted!r} is not a column of {spec}; its columns: "
                     f"{', '.join(table.column_names)} (or null: unlabelled)")


def _scan(src: ImageSource, strict: bool, cache_dir: str | None, workers: int) -> None:
    """Decode every image once (remembered by the split's fingerprint); keep the good ones (`ident["kept"]`) and
    say whether they are all grey (`channels`)."""
    memo = cache_root(cache_dir) / "images" / "scans" / f"{src.identity()}.json"
    try:
        seen = json.loads(memo.read_text())
        bad, src.channels = {int(i): why for i, why in seen["bad"].items()}, int(seen["channels"])
    except (OSError, ValueError, KeyError, TypeError):
        bad, src.channels = _decode_all(src, workers)
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"bad": bad, "channels": src.channels}))
        os.replace(tmp, memo)
    if bad and strict:
        first = min(bad)
        raise BadImage(src.name(first), f"{bad[first]} (data.strict=true refuses it; false skips and counts it)")
    src.skipped = [(src.name(i), why) for i, why in sorted(bad.items())]
    if bad:
        log.warning("data.source=%s: %d of %d files skipped, not images or truncated (first: %s: %s)",
                    src.spec, len(bad), len(src), *src.skipped[0])
    src.ident["kept"] = [i for i in range(len(src)) if i not in bad]
    src.items = [src.items[i] for i in src.ident["kept"]]
    if not src.items:
        raise InputError(f"data.source={src.spec}: none of its {len(bad)} files in the {src.split} split is an image "
                         f"that can be decoded (first: {src.skipped[0][0]}: {src.skipped[0][1]})")


def _decode_all(src: ImageSource, workers: int) -> tuple[dict[int, str], int]:
    """({index: why} of the items that do not decode, 1 if all the others are grey else 3): a thread pool (PIL
    decodes outside the GIL)."""
    def check(i: int) -> str | int:
        try:
            if src.table is None:
                return check_image(src.items[i])
            cell = src.table[int(src.items[i])][src.table.column_names[0]]
            return check_image(cell.get("bytes") or cell["path"], name=src.name(i))
        except BadImage as err:
            return err.why

    with ThreadPoolExecutor(max(1, workers)) as pool:
        results = list(pool.map(check, range(len(src)), chunksize=64))
    bad = {i: r for i, r in enumerate(results) if isinstance(r, str)}
    return bad, max((r for r in results if isinstance(r, int)), default=3)


def _read_class_map(class_map: dict | str | None) -> dict[str, Any] | None:
    """A dict, or a .json file of one, or a .txt file of class names (line order = index)."""
    if class_map is None or isinstance(class_map, dict) or hasattr(class_map, "items"):
        return None if class_map is None else {str(k): v for k, v in dict(class_map).items()}
    path = Path(str(class_map)).expanduser()
    if not path.is_file():
        raise InputError(f"data.class_map={class_map}: no such file (give a .json mapping folder → class index or "
                         "name, a .txt of folder names one per line, or a mapping)")
    if path.suffix == ".txt":
        return {line.strip(): i for i, line in enumerate(x for x in path.read_text().splitlines() if x.strip())}
    try:
        loaded = json.loads(path.read_text())
    except ValueError as err:
        raise InputError(f"data.class_map={class_map}: not JSON ({err})") from None
    if not isinstance(loaded, dict):
        raise InputError(f"data.class_map={class_map}: a JSON object mapping folder → class is needed")
    return {str(k): v for k, v in loaded.items()}


def _apply_labels(src: ImageSource, raw: list[Any], natural: list[str] | None, class_map: dict[str, Any] | None,
                  classes: list[str] | None) -> None:
    """`src.labels` / `src.classes` from the raw labels (folder names, ClassLabel ids, ints or strings)."""
    if natural is not None:
        raw = [natural[r] if r is not None and r >= 0 else None for r in raw]
    if class_map is not None:
        bad = [v for v in class_map.values() if not isinstance(v, int | str) or isinstance(v, bool)]
        if bad:
            raise InputError(f"data.class_map: values must be class indexes or names, got {bad[0]!r}")
        names = {k: str(v) for k, v in class_map.items()}
        if all(isinstance(v, int) for v in class_map.values()):
            top = max(class_map.values())
            own = classes or ["+".join(sorted(k for k, v in class_map.items() if v == i)) or str(i)
                              for i in range(top + 1)]
            names = {k: own[v] for k, v in class_map.items()}
        src.left_out = sum(str(r) not in names for r in raw)
        keep = [i for i, r in enumerate(raw) if str(r) in names]
        src.items, raw = [src.items[i] for i in keep], [names[str(raw[i])] for i in keep]
        if not raw:
            raise InputError(f"data.class_map names none of the classes in {src.spec} (first keys: "
                             f"{', '.join(list(class_map)[:5])})")
        order = own if all(isinstance(v, int) for v in class_map.values()) else sorted(set(names.values()))
    elif natural is not None:
        order = natural
    elif all(isinstance(r, int) for r in raw):
        order = [str(i) for i in range(max(raw) + 1)]
    else:
        order = sorted({str(r) for r in raw if r is not None})
    order = classes or order
    index = {name: i for i, name in enumerate(order)}
    missing = sorted({str(r) for r in raw if str(r) not in index})
    if missing:
        raise InputError(f"data.source={src.spec}: the {src.split} split has class{'es' if len(missing) > 1 else ''} "
                         f"{', '.join(missing[:5])} that the training split lacks (its classes: {', '.join(order)})")
    src.labels, src.classes = [index[str(r)] for r in raw], list(order)


__all__ = ["ImageSource", "LABEL_COLUMNS", "SPLIT_NAMES", "open_images"]
