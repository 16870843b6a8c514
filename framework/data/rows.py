"""One dataset for the generated tasks (needle, kv_recall, pointer_chase): a fixed set of rows from a seed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from framework.data.symbols import write

Rows = Tensor | dict[str, Tensor]


class GeneratedRows(Dataset):
    """`make(n, generator, **shape)` called once with a generator seeded by `seed`; item i is row i.

    `make` returns a (n, ...) tensor (items are tensors) or a dict of such tensors (items are dicts), so the
    same seed always gives the same rows, and the tasks differ only in the function that writes them. With a
    `token_map` (`framework.data.symbols`) the rows' task ids are written in a tokenizer's tokens.
    """

    def __init__(self, make: Callable[..., Rows], n: int, seed: int, token_map: Tensor | None = None, **shape: Any):
        if n < 1:
            raise ValueError(f"n={n} rows must be >= 1")
        self.rows = write(make(n, torch.Generator().manual_seed(seed), **shape), token_map)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Rows:
        if isinstance(self.rows, dict):
            return {key: value[i] for key, value in self.rows.items()}
        return self.rows[i]
