"""What each side of `python -m framework.metrics` can be: features already computed (a `.npy` array), or texts
that a model embeds (`--feature`, `framework.models.hf_features.HFFeatures`).

Texts are a `.txt` file (one text per line, blank lines skipped: how generated samples are usually written), or any
source `data=text` reads (`.jsonl` / `.json` / `.csv` / `.parquet` / `.arrow` files, a folder, a glob, a Hub dataset
id), whose documents are the texts of `column` in `split`. A side is read as what it is; images are a later kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from framework.errors import InputError


@dataclass
class Side:
    """One side's points: `features` (N, D), read or embedded, and how they were read, for the output."""

    path: str
    kind: str  # "features" (a .npy array) or "texts"
    features: np.ndarray

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "read_as": self.kind, "points": int(self.features.shape[0])}


def read_features(path: str) -> np.ndarray:
    """A plain `.npy` array (nothing unpickled)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such features file: {path}")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as err:
        raise InputError(f"{path} is not a plain .npy array ({err}); object arrays are refused") from None


def read_texts(path: str, column: str = "text", split: str = "train") -> list[str]:
    """The texts of `path`: a `.txt` file's lines, else the documents of a `data=text` source (module docstring)."""
    from framework.data import sources

    file = Path(path).expanduser()
    if file.suffix == ".txt" and file.is_file():
        sources.check_utf8(str(file))
        return [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    source = sources.resolve(path)
    if split not in sources.splits_of(source):
        raise InputError(f"--split {split}: {path} has the splits {', '.join(sources.splits_of(source))}")
    sources.check(source, column, [split])
    return [text for batch in sources.read_texts(source, split, column) for text in batch]


def read_side(path: str, embed: Callable[[list[str]], np.ndarray] | None, column: str = "text",
              split: str = "train") -> Side:
    """One side: `.npy` features as they are, anything else as texts, embedded by `embed` (texts -> (N, D); None
    when no `--feature` was given, which texts refuse)."""
    if Path(path).suffix == ".npy":
        return Side(path, "features", read_features(path))
    texts = read_texts(path, column, split)
    if embed is None:
        raise InputError(f"{path} holds texts: name the model that embeds them with --feature <a transformers model "
                         "folder or Hub id> (or give features as a .npy array)")
    if not texts:
        raise InputError(f"{path} holds no text (an empty source)")
    return Side(path, "texts", embed(texts))


__all__ = ["Side", "read_features", "read_side", "read_texts"]
