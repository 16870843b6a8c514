"""Byte-level text corpora that ship with Python itself: no download, no tokenizer files.

`pydoc` is CPython's documentation prose (`pydoc_data.topics`, ~465 kB); `stdlib` adds the source text of a
fixed list of standard-library modules. Bytes are tokens (vocabulary 256), so any text round-trips; a model that
brings its own tokenizer (a Hugging Face model: `use_tokenizer`) gets the same text as that tokenizer's ids.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset

from framework.data.resumable import SplitData, check_batches

SOURCES = ("pydoc", "stdlib", "both")
_STDLIB_MODULES = ("collections", "json", "argparse", "dataclasses", "typing", "functools", "pathlib", "inspect")


def corpus_bytes(source: str = "pydoc") -> bytes:
    """The raw corpus as UTF-8 bytes, always in the same order (so splits are reproducible)."""
    if source not in SOURCES:
        raise ValueError(f"unknown corpus source {source!r}; valid: {', '.join(SOURCES)}")
    parts: list[str] = []
    if source in ("pydoc", "both"):
        from pydoc_data.topics import topics

        parts += [topics[k] for k in sorted(topics)]
    if source in ("stdlib", "both"):
        for name in _STDLIB_MODULES:
            spec = importlib.util.find_spec(name)
            origin = Path(spec.origin) if spec and spec.origin else None
            if origin and origin.name == "__init__.py":
                parts += [p.read_text(encoding="utf-8") for p in sorted(origin.parent.glob("*.py"))]
            elif origin:
                parts.append(origin.read_text(encoding="utf-8"))
    return "\n".join(parts).encode("utf-8")


class ByteChunks(Dataset):
    """Fixed, non-overlapping windows of `seq_len + 1` bytes (input and next-byte target)."""

    def __init__(self, data: Tensor, seq_len: int):
        if len(data) < seq_len + 1:
            raise ValueError(f"corpus split of {len(data)} bytes is shorter than seq_len+1={seq_len + 1}")
        self.data, self.seq_len = data, seq_len
        self.count = (len(data) - 1) // seq_len

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> Tensor:
        start = i * self.seq_len
        return self.data[start : start + self.seq_len + 1].long()


class ByteCorpus(SplitData):
    """Byte-level LM data: the last `val_fraction` of the corpus is the validation split. With a tokenizer
    (`use_tokenizer`, which the run calls when the model brings one) the text is that tokenizer's ids instead, and
    `max_bytes` still cuts the text before it is tokenized.

    Args:
        source: corpus: "pydoc" (CPython's documentation prose), "stdlib" (standard-library source) or "both".
        seq_len: tokens per training row (each row holds seq_len + 1 for the next-token target).
        batch_size: rows per batch.
        val_fraction: fraction at the end of the corpus used for validation, in (0, 1).
        max_bytes: keep only the corpus's first `max_bytes` bytes; None: the whole corpus.
        seed: seed of the training rows' order.
        num_workers: DataLoader worker processes; 0 loads in the main process.
    """

    vocab_size = 256
    tokenizer = None
    mask_id: int | None = None

    def __init__(
        self,
        source: str = "pydoc",
        seq_len: int = 128,
        batch_size: int = 32,
        val_fraction: float = 0.05,
        max_bytes: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
    ):
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"unknown corpus source {source!r}; valid: {', '.join(SOURCES)}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in (0, 1)")
        for key, value in (("seq_len", seq_len), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"{key}={value} must be positive (an integer >= 1)")
        if max_bytes is not None:
            if max_bytes < 1:
                raise ValueError(f"max_bytes={max_bytes} must be >= 1, or null for the whole corpus")
            cut = int(max_bytes * (1 - val_fraction))  # the split setup() makes, if the corpus is that long
            for split, size in (("training", cut), ("validation", max_bytes - cut)):
                if size < seq_len + 1:
                    raise ValueError(f"corpus split of {size} bytes is shorter than seq_len+1={seq_len + 1} (the "
                                     f"{split} part of max_bytes={max_bytes}); raise max_bytes or lower seq_len")
            check_batches((cut - 1) // seq_len, batch_size)
        self.source, self.seq_len, self.batch_size = source, seq_len, batch_size
        self.val_fraction, self.max_bytes, self.seed, self.num_workers = val_fraction, max_bytes, seed, num_workers
        self.train_set: ByteChunks | None = None
        self.val_set: ByteChunks | None = None

    def use_tokenizer(self, tokenizer) -> None:
        """Tokenize the corpus with `tokenizer` (a transformers tokenizer) instead of taking bytes: the vocabulary
        becomes the tokenizer's (`len(tokenizer)`), and its [MASK] token, if any, the mask id a masked diffusion
        module uses."""
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.mask_id = getattr(tokenizer, "mask_token_id", None)
        self.train_set = self.val_set = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        raw = corpus_bytes(self.source)
        if self.max_bytes:
            raw = raw[: self.max_bytes]
        if self.tokenizer is not None:
            ids = self.tokenizer(raw.decode("utf-8", errors="ignore"), add_special_tokens=False)["input_ids"]
            data = torch.tensor(ids, dtype=torch.int32 if self.vocab_size < 2**31 else torch.int64)
        else:
            data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        cut = int(len(data) * (1 - self.val_fraction))
        self.train_set = ByteChunks(data[:cut], self.seq_len)
        self.val_set = ByteChunks(data[cut:], self.seq_len)
