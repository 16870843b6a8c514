"""Where the user's data comes from: `data.source=` a file, a folder, a glob, or a Hub dataset id (+ `revision`).

The reading itself is Hugging Face `datasets`' (`load_dataset` with its format builders, its split inference for a
folder, and the Hub client for a dataset by name; imported only when a source is used). What this adds: one
resolution of the source into files (with sizes and mtimes) or a repo id and the commit sha its revision names,
so that what made the data has a fingerprint; and the refusals a user should get before a run writes anything,
each naming the value: a missing file or dataset, a missing column (naming the columns there), an empty source,
bytes that are not UTF-8 (naming the file, line and byte offset).
"""

from __future__ import annotations

import codecs
import glob
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framework.errors import InputError

#: file extension → the `datasets` builder that reads it
FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
#: a source's own validation split, by the names datasets' split inference gives or Hub repos use, in this order
VAL_SPLITS = ("validation", "valid", "val", "dev", "test")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TEXT_BYTES = ("text", "json", "csv")  # formats whose bytes are text (checked as UTF-8 before reading)


@dataclass(frozen=True)
class Source:
    """A resolved source: local `files` by split (each with size and mtime), or a Hub `repo_id` at commit `sha`."""

    spec: str
    builder: str  # a datasets builder (text, json, csv, parquet, arrow); "hub" for a dataset by name
    files: dict[str, list[str]] = field(default_factory=dict)
    stats: tuple[tuple[str, int, int], ...] = ()
    repo_id: str | None = None
    revision: str | None = None
    sha: str | None = None
    format: str = ""  # the data files' format (a Hub dataset's, from its files' extensions)

    def identity(self) -> dict[str, Any]:
        """What the source's data is made of: each file's path, size and mtime, or the repo id and commit sha."""
        if self.repo_id:
            return {"hub": self.repo_id, "sha": self.sha}
        return {"format": self.builder, "files": {s: fs for s, fs in self.files.items()}, "stats": self.stats}

    def describe(self) -> dict[str, Any]:
        """For results.json and the model card: the dataset's id and revision, or its file names."""
        if self.repo_id:
            return {"dataset": self.repo_id, "revision": self.revision or "main", "sha": self.sha}
        names = [Path(p).name for p, _, _ in self.stats]
        shown = names if len(names) <= 10 else [*names[:10], f"... ({len(names)} files)"]
        return {"dataset": self.spec, "files": shown, "bytes": sum(size for _, size, _ in self.stats)}

    def load(self, split: str) -> Any:
        """The `split` as a streamed `datasets.IterableDataset` (rows are read as they are consumed)."""
        datasets = datasets_module()
        if self.repo_id:
            return datasets.load_dataset(self.repo_id, revision=self.sha, split=split, streaming=True)
        extra = {"sample_by": "document"} if self.builder == "text" else {}
        return datasets.load_dataset(self.builder, data_files={split: self.files[split]}, split=split,
                                     streaming=True, **extra)


def datasets_module() -> Any:
    """Hugging Face `datasets`, imported on first use (an InputError saying how to install it where it is not)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - the dev extra installs it
        raise InputError("the user's own data is read through Hugging Face `datasets`: pip install "
                         "'framework[data]'") from None
    return datasets


def resolve(source: str, revision: str | None = None, format: str | None = None) -> Source:  # noqa: A002
    """`source` resolved (see `Source`); InputError naming it when nothing is there."""
    spec = str(source)
    if format is not None and format not in set(FORMATS.values()):
        raise InputError(f"data.format={format!r} is not a format datasets reads here; valid: "
                         f"{', '.join(sorted(set(FORMATS.values())))} (or null: from the files' extensions)")
    path = Path(spec).expanduser()
    if path.is_file():
        return _local(spec, {"train": [str(path.absolute())]}, format)
    if path.is_dir():
        return _local(spec, _folder_splits(path, format), format)
    if any(ch in spec for ch in "*?["):
        files = sorted(p for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
        if not files:
            raise InputError(f"data.source={spec}: the pattern matches no files")
        return _local(spec, {"train": [os.path.abspath(p) for p in files]}, format)
    if _HUB_ID.match(spec) and Path(spec).suffix not in FORMATS and not spec.startswith((".", "~")):
        return _hub(spec, revision)
    raise InputError(f"data.source={spec}: no such file or folder (give a file, a folder, a glob such as "
                     f"'corpus/*.jsonl', or a Hub dataset id 'owner/name')")


def _folder_splits(folder: Path, format: str | None) -> dict[str, list[str]]:  # noqa: A002
    """The folder's files by split, as `datasets` infers them (train.jsonl / validation.jsonl ..., else all
    files are train), keeping the supported formats (`FORMATS`)."""
    data_files = datasets_module().data_files
    from_patterns = data_files.DataFilesDict.from_patterns(data_files.get_data_patterns(str(folder)),
                                                           base_path=str(folder))
    keep = {ext for ext, builder in FORMATS.items() if format in (None, builder)}
    splits = {str(s): sorted(f for f in files if Path(f).suffix in keep) for s, files in from_patterns.items()}
    splits = {s: fs for s, fs in splits.items() if fs}
    if not splits:
        raise InputError(f"data.source={folder}: the folder holds no {', '.join(FORMATS)} files (an empty source)")
    return splits


def _local(spec: str, files: dict[str, list[str]], format: str | None) -> Source:  # noqa: A002
    everything = [f for fs in files.values() for f in fs]
    kinds = sorted({FORMATS.get(Path(f).suffix) or Path(f).suffix or "(no extension)" for f in everything})
    if format is None:
        unknown = [k for k in kinds if k not in FORMATS.values()]
        if unknown:
            raise InputError(f"data.source={spec}: cannot tell the format of {unknown[0]!r} files; name it with "
                             f"data.format= (one of {', '.join(sorted(set(FORMATS.values())))}) or use the "
                             f"extensions {', '.join(FORMATS)}")
        if len(kinds) > 1:
            raise InputError(f"data.source={spec} mixes formats ({', '.join(kinds)}); give files of one format")
        format = kinds[0]  # noqa: A001
    stats = tuple((f, st.st_size, st.st_mtime_ns) for f in everything for st in [os.stat(f)])
    if not any(size for _, size, _ in stats):
        raise InputError(f"data.source={spec}: every file is empty ({', '.join(Path(f).name for f in everything)})")
    return Source(spec, format, files, stats, format=format)


def _hub(repo_id: str, revision: str | None) -> Source:
    """A Hub dataset, with the commit sha its revision names now (one short request)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi().dataset_info(repo_id, revision=revision)
    except RevisionNotFoundError:
        raise InputError(f"data.revision={revision}: the Hub dataset '{repo_id}' at {constants.ENDPOINT} has no "
                         "such branch, tag or commit") from None
    except RepositoryNotFoundError:
        raise InputError(f"data.source={repo_id}: no such local file or folder, and the Hub at {constants.ENDPOINT} "
                         f"has no dataset repo '{repo_id}' (or it is private and this token cannot read it)") from None
    except Exception as err:  # noqa: BLE001 - offline, unreachable: say which Hub and why, in one line
        raise InputError(f"data.source={repo_id}: no such local file or folder, and the Hub at {constants.ENDPOINT} "
                         f"cannot be asked for the dataset '{repo_id}' ({_short(err)})") from None
    suffixes = {Path(f.rfilename).suffix for f in info.siblings or []}
    kinds = sorted({FORMATS[suffix] for suffix in suffixes if suffix in FORMATS})
    return Source(repo_id, "hub", repo_id=repo_id, revision=revision, sha=info.sha, format="+".join(kinds) or "hub")


def splits_of(source: Source) -> list[str]:
    """The split names the source has (a Hub dataset's as `datasets` infers them from its files or card)."""
    if not source.repo_id:
        return list(source.files)
    return list(datasets_module().load_dataset(source.repo_id, revision=source.sha, streaming=True))


def check(source: Source, column: str, splits: list[str]) -> list[str]:
    """Refuse, before anything is written, a source that cannot give text: bytes that are not UTF-8 (file, line,
    offset), a split with no rows, a column that is not there (naming those there). Returns the columns."""
    for path, _, _ in source.stats:
        if source.builder in _TEXT_BYTES:
            check_utf8(path, source.spec)
    columns: list[str] = []
    for split in splits:
        try:
            first = next(iter(source.load(split)), None)
        except ValueError as err:  # pyarrow's and json's parse errors, the builders' own
            raise InputError(f"data.source={source.spec}: the {split} split cannot be read ({_short(err)})") from None
        if first is None:
            raise InputError(f"data.source={source.spec}: the {split} split has no rows (an empty source)")
        columns = list(first)
        if column not in first:
            raise InputError(f"data.column={column!r} is not a column of {source.spec} ({split} split); its "
                             f"columns: {', '.join(columns)}")
    return columns


def check_utf8(path: str, spec: str | None = None, chunk: int = 1 << 24) -> None:
    """InputError naming `path`, the line and byte offset of its first byte sequence that is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as err:
                bad = offset - pending + err.start
                with open(path, "rb") as again:
                    line = again.read(bad).count(b"\n") + 1
                same = spec is None or os.path.abspath(os.path.expanduser(spec)) == os.path.abspath(path)
                what = f"data.source={path}" if same else f"data.source={spec}: {path}"
                raise InputError(f"{what} is not UTF-8 text: byte {bad} (line {line}) is "
                                 f"{err.object[err.start:err.start + 1]!r}; re-encode the file as UTF-8") from None
            if not block:
                return
            offset += len(block)


def read_texts(source: Source, split: str, column: str, batch_size: int = 1000, rows: Any = None
               ) -> Iterator[list[str]]:
    """The `column` of `split`, in order, a batch of strings at a time (null values skipped). `rows`: the split
    already opened (a rank's share at a position, `framework.data.streaming`), iterated as it is."""
    if rows is None:
        rows = source.load(split)
        if source.builder != "text":
            rows = rows.select_columns([column])
    try:
        for batch in rows.iter(batch_size=batch_size):
            texts = batch[column]
            wrong = next((t for t in texts if t is not None and not isinstance(t, str)), None)
            if wrong is not None:
                raise InputError(f"data.column={column!r} of {source.spec} holds {type(wrong).__name__} values "
                                 f"(e.g. {str(wrong)[:40]!r}), not text; name a text column with data.column=")
            yield [t for t in texts if t]
    except InputError:
        raise
    except ValueError as err:
        raise InputError(f"data.source={source.spec}: the {split} split cannot be read ({_short(err)})") from None


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


__all__ = ["FORMATS", "Source", "VAL_SPLITS", "check", "check_utf8", "datasets_module", "read_texts", "remember",
           "remembered", "resolve", "splits_of"]
