"""Where the user's data comes from: `data.source=` a file, a folder, a glob, or a Hub dataset id (+ `revision`).

The reading itself is Hugging Face `datasets`' (`load_dataset` with its format builders, its split inference for a
folder, and the Hub client for a dataset by name; imported only when a source is used). What this adds: one
resolution of the source into files (with sizes and mtimes) or a repo id and the commit sha its revision names,
so that what made the data has a fingerprint (a digest of each file's bytes, `framework.data.file_ids`, so a
touched or re-staged copy is the same data); and the refusals a user should get before a run writes anything,
each naming the value: a missing file or dataset, a missing column (naming the columns there), an empty source,
bytes that are not UTF-8 (naming the file, line and byte offset).
"""

from __future__ import annotations

import codecs
import glob
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.data import file_ids, json_lines, text_files
from framework.errors import InputError

log = logging.getLogger(__name__)

#: file extension (inside a compression's: `.jsonl.gz` is `.jsonl`) → the `datasets` builder that reads it
FORMATS = {".txt": "text", ".md": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet",
           ".arrow": "arrow"}
#: a source's own validation split, by the names datasets' split inference gives or Hub repos use, in this order
VAL_SPLITS = ("validation", "valid", "val", "dev", "test")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TEXT_BYTES = ("text", "json", "csv")  # formats whose bytes are text (checked as UTF-8 before reading)


@dataclass(frozen=True)
class Source:
    """A resolved source: local `files` by split (each with size and mtime), or a Hub `repo_id` at commit `sha`
    (and `config`). Text files are read as `sample_by` says (`framework.data.text_files`)."""

    spec: str
    builder: str  # a datasets builder (text, json, csv, parquet, arrow); "hub" for a dataset by name
    files: dict[str, list[str]] = field(default_factory=dict)
    stats: tuple[tuple[str, int, int], ...] = ()
    repo_id: str | None = None
    revision: str | None = None
    sha: str | None = None
    format: str = ""  # the data files' format (a Hub dataset's, from its files' extensions)
    sample_by: str = "document"
    config: str | None = None
    memo: Path | None = None  # where file digests are remembered (the data cache)
    _digests: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def digest(self, path: str) -> str:
        """The file's digest, taken once per Source (the data it was resolved to, even if the file changes)."""
        if path not in self._digests:
            self._digests[path] = file_ids.digest(path, self.memo)
        return self._digests[path]

    def identity(self) -> dict[str, Any]:
        """What the source's data is: each file's bytes (a digest and the size, by split, in order: not its path
        or times), or the repo id, commit sha and config."""
        if self.repo_id:
            return {"hub": self.repo_id, "sha": self.sha, **({"config": self.config} if self.config else {})}
        size = {p: n for p, n, _ in self.stats}
        return {"format": self.builder, **({"sample_by": self.sample_by} if self.builder == "text" else {}),
                "files": {s: [[self.digest(f), size[f]] for f in fs] for s, fs in self.files.items()}}

    def file_table(self) -> list[list[Any]]:
        """[name, bytes, digest] of each file (a checkpoint keeps it, to name a file that changed)."""
        return [[Path(p).name, size, self.digest(p)] for p, size, _ in self.stats]

    def describe(self) -> dict[str, Any]:
        """For results.json and the model card: the dataset's id and revision, or its file names."""
        if self.repo_id:
            return {"dataset": self.repo_id, "revision": self.revision or "main", "sha": self.sha,
                    **({"config": self.config} if self.config else {})}
        names = [Path(p).name for p, _, _ in self.stats]
        shown = names if len(names) <= 10 else [*names[:10], f"... ({len(names)} files)"]
        return {"dataset": self.spec, "files": shown, "bytes": sum(size for _, size, _ in self.stats)}

    def load(self, split: str, bad_lines: str | None = None) -> Any:
        """The `split` as a streamed `datasets.IterableDataset` (rows are read as they are consumed). Text files
        are read by `text_files` (bounded memory), one shard per file. `bad_lines` ("skip" or "raise"): local JSON
        Lines read line by line (`json_lines`), a bad line a row that says so, or `BadRow`."""
        datasets = datasets_module()
        if bad_lines and not self.repo_id and json_lines.readable(self.files.get(split, [])):
            return datasets.IterableDataset.from_generator(
                json_lines.rows, gen_kwargs={"files": self.files[split], "strict": bad_lines == "raise"})
        if self.repo_id:
            return datasets.load_dataset(self.repo_id, self.config, revision=self.sha, split=split, streaming=True)
        if self.builder == "text":
            return datasets.IterableDataset.from_generator(
                text_files.rows, gen_kwargs={"files": self.files[split], "sample_by": self.sample_by})
        return datasets.load_dataset(self.builder, data_files={split: self.files[split]}, split=split,
                                     streaming=True)


def datasets_module() -> Any:
    """Hugging Face `datasets`, imported on first use (an InputError saying how to install it where it is not)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - the dev extra installs it
        raise InputError("the user's own data is read through Hugging Face `datasets`: pip install "
                         "'framework[data]'") from None
    # a bad JSON line is named by file and line here (`bad_line`); the builder's own log line would say it twice
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    return datasets


def resolve(source: str, revision: str | None = None, format: str | None = None,  # noqa: A002
            sample_by: str = "document", config: str | None = None, cache_dir: str | Path | None = None) -> Source:
    """`source` resolved (see `Source`); InputError naming it when nothing is there. `cache_dir`: where file
    digests are remembered (the data cache's root)."""
    from framework.data.packing import cache_root

    spec = str(source)
    if format is not None and format not in set(FORMATS.values()):
        raise InputError(f"data.format={format!r} is not a format datasets reads here; valid: "
                         f"{', '.join(sorted(set(FORMATS.values())))} (or null: from the files' extensions)")
    if sample_by not in text_files.SAMPLE_BY:
        raise InputError(f"data.sample_by={sample_by!r}; valid: {', '.join(text_files.SAMPLE_BY)} (what one "
                         "document of a text file is)")
    extra = {"sample_by": sample_by, "memo": cache_root(cache_dir)}
    path = Path(spec).expanduser()
    if path.is_file():
        return _local(spec, {"train": [str(path.absolute())]}, format, extra)
    if path.is_dir():
        return _local(spec, _folder_splits(path, format), format, extra)
    if any(ch in spec for ch in "*?["):
        files = sorted(p for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
        if not files:
            raise InputError(f"data.source={spec}: the pattern matches no files")
        return _local(spec, {"train": [os.path.abspath(p) for p in files]}, format, extra)
    if _HUB_ID.match(spec) and text_files.inner_suffix(spec) not in FORMATS and not spec.startswith((".", "~")):
        from framework.data.hub_source import resolve_hub

        return Source(**resolve_hub(spec, revision, config, extra["memo"], FORMATS), sample_by=sample_by)
    raise InputError(f"data.source={spec}: no such file or folder (give a file, a folder, a glob such as "
                     f"'corpus/*.jsonl', or a Hub dataset id 'owner/name')")


def _kind(path: str) -> str:
    """The builder of a file by its (inner) extension, else the extension itself."""
    suffix = text_files.inner_suffix(path)
    return FORMATS.get(suffix) or suffix or "(no extension)"


def _folder_splits(folder: Path, format: str | None) -> dict[str, list[str]]:  # noqa: A002
    """The folder's files by split, as `datasets` infers them (train.jsonl / validation.jsonl ..., else all
    files are train): those of a format read here (compressed or not), or every file with `data.format=`. The
    files left out are counted by extension in the log."""
    data_files = datasets_module().data_files
    from_patterns = data_files.DataFilesDict.from_patterns(data_files.get_data_patterns(str(folder)),
                                                           base_path=str(folder))
    listed = {str(s): sorted(files) for s, files in from_patterns.items()}
    splits = {s: [f for f in fs if format is not None or _kind(f) in FORMATS.values()] for s, fs in listed.items()}
    skipped = Counter(text_files.inner_suffix(f) or "(no extension)" for s, fs in listed.items() for f in fs
                      if f not in splits[s])
    splits = {s: fs for s, fs in splits.items() if fs}
    if not splits:
        raise InputError(f"data.source={folder}: the folder holds no {', '.join(FORMATS)} files (an empty source"
                         + (f"; it holds {_counted(skipped)}: name their format with data.format=)" if skipped else
                            ")"))
    if skipped:
        log.warning("data.source=%s: %s left out (not a format read here; data.format= reads every file as one)",
                    folder, _counted(skipped))
    return splits


def _counted(by_suffix: Counter) -> str:
    return ", ".join(f"{n} {suffix} file{'s' * (n != 1)}" for suffix, n in by_suffix.most_common())


def _local(spec: str, files: dict[str, list[str]], format: str | None, extra: dict[str, Any]) -> Source:  # noqa: A002
    everything = [f for fs in files.values() for f in fs]
    kinds = sorted({_kind(f) for f in everything})
    if format is None:
        unknown = [k for k in kinds if k not in FORMATS.values()]
        if unknown:
            raise InputError(f"data.source={spec}: cannot tell the format of {unknown[0]!r} files; name it with "
                             f"data.format= (one of {', '.join(sorted(set(FORMATS.values())))}) or use the "
                             f"extensions {', '.join(FORMATS)} (compressed: .gz .bz2 .xz .zst after them)")
        if len(kinds) > 1:
            raise InputError(f"data.source={spec} mixes formats ({', '.join(kinds)}); give files of one format")
        format = kinds[0]  # noqa: A001
    if format != "text" and extra["sample_by"] != "document":
        raise InputError(f"data.sample_by={extra['sample_by']} applies to text files; data.source={spec} is "
                         f"{format} (one row is one document)")
    stats = tuple((f, st.st_size, st.st_mtime_ns) for f in everything for st in [os.stat(f)])
    if not any(size for _, size, _ in stats):
        raise InputError(f"data.source={spec}: every file is empty ({', '.join(Path(f).name for f in everything)})")
    return Source(spec, format, files, stats, format=format, **extra)


def splits_of(source: Source) -> list[str]:
    """The split names the source has (a Hub dataset's as `datasets` infers them from its files or card)."""
    if not source.repo_id:
        return list(source.files)
    from framework.data.hub_source import hub_splits

    return hub_splits(source, datasets_module())


def field(row: dict[str, Any], column: str) -> tuple[bool, Any]:
    """(whether it is there, the value) of `column` in a row: a column, or a nested field `meta.text`."""
    if column in row:
        return True, row[column]
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def check(source: Source, column: str, splits: list[str], bad_lines: str | None = None) -> list[str]:
    """Refuse, before anything is written, a source that cannot give text: bytes that are not UTF-8 (file, line,
    offset), a split with no rows, a column that is not there (naming those there). Returns the columns.
    `bad_lines`: read as a stream reads it (`Source.load`)."""
    for path, _, _ in source.stats:
        if source.builder in _TEXT_BYTES:
            check_utf8(path, source.spec)
    columns: list[str] = []
    for split in splits:
        try:
            first = next((r for r in source.load(split, bad_lines) if json_lines.BAD not in r), None)
        except ValueError as err:  # pyarrow's and json's parse errors, the builders' own
            raise unreadable(source, split, err) from None
        if first is None:
            raise InputError(f"data.source={source.spec}: the {split} split has no rows (an empty source)")
        columns = list(first)
        if not field(first, column)[0]:
            nested = [f"{k}.{n}" for k, v in first.items() if isinstance(v, dict) for n in v]
            raise InputError(f"data.column={column!r} is not a column of {source.spec} ({split} split); its "
                             f"columns: {', '.join(columns)}" + (f" (nested: {', '.join(nested[:10])})" if nested
                                                                 else ""))
    return columns


def unreadable(source: Source, split: str, err: BaseException) -> InputError:
    """The refusal of a split a builder could not parse: a JSON Lines file's bad line by file and line number."""
    if source.builder == "json" and not source.repo_id:
        bad = json_lines.bad_json_line(source.files.get(split, []))
        if bad is not None:
            path, number, why, text = bad
            return InputError(f"data.source={source.spec}: {path} line {number} is not a JSON object ({why}): "
                              f"{text[:80]!r}; fix or remove that line")
    return InputError(f"data.source={source.spec}: the {split} split cannot be read ({_short(err)})")


def check_utf8(path: str, spec: str | None = None, chunk: int = 1 << 20) -> None:
    """InputError naming `path`, the line and byte offset of its first byte sequence that is not UTF-8 (of the
    decompressed bytes, for a compressed file)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with text_files.open_bytes(path) as f:
        while True:
            block = f.read(chunk)
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as err:
                bad = offset - pending + err.start
                with text_files.open_bytes(path) as again:
                    line = again.read(bad).count(b"\n") + 1
                same = spec is None or os.path.abspath(os.path.expanduser(spec)) == os.path.abspath(path)
                what = f"data.source={path}" if same else f"data.source={spec}: {path}"
                raise InputError(f"{what} is not UTF-8 text: byte {bad} (line {line}) is "
                                 f"{err.object[err.start:err.start + 1]!r}; re-encode the file as UTF-8") from None
            if not block:
                return
            offset += len(block)


def read_texts(source: Source, split: str, column: str, batch_size: int = 1000, rows: Any = None,
               on_bad: Callable[[str], None] | None = None) -> Iterator[list[str]]:
    """The `column` of `split`, in order, a batch of strings at a time (null values skipped). `rows`: the split
    already opened (a rank's share at a position, `framework.data.streaming`), iterated as it is; its bad lines
    (`json_lines.BAD`) are skipped and told to `on_bad`. Text files are read by `text_files` directly."""
    if rows is None and source.builder == "text":
        yield from text_files.batches(source.files[split], source.sample_by, batch_size)
        return
    if rows is None:
        rows = source.load(split).select_columns([column.split(".")[0] if "." in column else column])
    if source.builder == "text":  # documents of up to PIECE characters: fewer at a time
        batch_size = min(batch_size, text_files.READ_BATCH[source.sample_by])
    try:
        for batch in rows.iter(batch_size=batch_size):
            for bad in batch.pop(json_lines.BAD, None) or ():
                if bad and on_bad is not None:
                    on_bad(bad)
            texts = batch[column] if column in batch else [field(r, column)[1] for r in _rows_of(batch)]
            wrong = next((t for t in texts if t is not None and not isinstance(t, str)), None)
            if wrong is not None:
                raise InputError(f"data.column={column!r} of {source.spec} holds {type(wrong).__name__} values "
                                 f"(e.g. {str(wrong)[:40]!r}), not text; name a text column with data.column=")
            yield [t for t in texts if t]
    except InputError:
        raise
    except ValueError as err:
        raise unreadable(source, split, err) from None


def _rows_of(batch: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]


def _short(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]


def summary_path(root: Path, key: str) -> Path:
    return root / "sources" / f"{key}.json"


def remembered(root: Path, key: str) -> dict[str, Any] | None:
    """A source check's result saved under `root` (so a second run does not read the source to check it)."""
    path = summary_path(root, key)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def remember(root: Path, key: str, summary: dict[str, Any]) -> None:
    path = summary_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(summary))
    os.replace(tmp, path)


__all__ = ["FORMATS", "Source", "VAL_SPLITS", "check", "check_utf8", "datasets_module", "field",
           "read_texts", "remember", "remembered", "resolve", "splits_of", "unreadable"]
