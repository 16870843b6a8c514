"""The "needle" retrieval task (docs/mdlm.md): find the value after a marker, then answer it after many masks.

Row: `BOS c_0 .. c_{C-1} SEP v SEP v EOS^p PAD...`. The context has C = 16 content tokens holding one
`NDL v` pair at slot q (context positions 2q, 2q+1; q = 0 is farthest from the answer); filler and value share
the content vocabulary, so the model must find the marker. The prompt is `BOS context SEP`; the answer sits
right after it. p ~ U{0..max_eos} trailing EOS mirror LLaDA's EOS-padded SFT responses. Generated from a
seed: no download, same rows for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from framework.data.resumable import SplitData, check_split_sizes
from framework.data.rows import GeneratedRows
from framework.data.symbols import SymbolTask
from framework.rng import draw_device

PAD, MASK, BOS, SEP, EOS, NDL = range(6)
FIRST_SYMBOL = 6  # content tokens are FIRST_SYMBOL .. FIRST_SYMBOL + n_symbols - 1


def _check(n_symbols: int, context_len: int, max_eos: int) -> None:
    if n_symbols < 2:
        raise ValueError(f"n_symbols={n_symbols} must be >= 2")
    if context_len < 2 or context_len % 2:
        raise ValueError(f"context_len={context_len} must be an even number >= 2 (slots are token pairs)")
    if max_eos < 0:
        raise ValueError(f"max_eos={max_eos} must be >= 0")


def prompt_length(context_len: int = 16) -> int:
    """Length of `BOS context SEP`; also the absolute position of the answer token."""
    return context_len + 2


def needle_position(slot: Tensor | int) -> Tensor | int:
    """Absolute position of the NDL marker of slot q (BOS is position 0); the value follows it."""
    return 1 + 2 * slot


def needle_prompts(
    slots: Tensor, generator: torch.Generator | None = None, n_symbols: int = 12, context_len: int = 16
) -> dict[str, Tensor]:
    """Prompts `BOS context SEP` (n, context_len + 2) with the needle at `slots` (n,); also returns the values."""
    _check(n_symbols, context_len, 0)
    slots = torch.as_tensor(slots, dtype=torch.long)
    if slots.numel() and (slots.min() < 0 or slots.max() >= context_len // 2):
        raise ValueError(f"slots must lie in [0, {context_len // 2 - 1}], got {slots.unique().tolist()}")
    n = slots.shape[0]
    context = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + n_symbols, (n, context_len), generator=generator,
                           device=draw_device(generator))
    value = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + n_symbols, (n,), generator=generator,
                          device=draw_device(generator))
    rows = torch.arange(n)
    context[rows, 2 * slots] = NDL
    context[rows, 2 * slots + 1] = value
    prompt = torch.cat([torch.full((n, 1), BOS), context, torch.full((n, 1), SEP)], dim=1)
    return {"prompt": prompt, "value": value, "slot": slots}


def needle_rows(
    n: int, generator: torch.Generator | None = None, n_symbols: int = 12, context_len: int = 16, max_eos: int = 32
) -> dict[str, Tensor]:
    """n training rows of fixed length context_len + 5 + max_eos, right-padded with PAD.

    Keys: tokens, attention_mask (True = real), prompt_mask (True = prompt: kept clean in SFT-style masking),
    slot, value, length.
    """
    _check(n_symbols, context_len, max_eos)
    slots = torch.randint(0, context_len // 2, (n,), generator=generator, device=draw_device(generator))
    made = needle_prompts(slots, generator, n_symbols, context_len)
    eos = torch.randint(0, max_eos + 1, (n,), generator=generator, device=draw_device(generator))
    p = prompt_length(context_len)
    width = p + 3 + max_eos
    v = made["value"][:, None]
    tokens = torch.full((n, width), PAD)
    tokens[:, :p] = made["prompt"]
    tokens[:, p : p + 3] = torch.cat([v, torch.full_like(v, SEP), v], dim=1)
    pos = torch.arange(width)[None]
    length = p + 3 + eos
    tokens = torch.where((pos >= p + 3) & (pos < length[:, None]), EOS, tokens)
    return {
        "tokens": tokens,
        "attention_mask": pos < length[:, None],
        "prompt_mask": (pos < p).expand(n, width).clone(),
        "slot": slots,
        "value": made["value"],
        "length": length,
    }


def with_masks(prompt: Tensor, m: int, mask_id: int = MASK) -> Tensor:
    """Evaluation input `prompt + [MASK]^(1+m)`: the answer mask plus m appended masks."""
    if m < 0:
        raise ValueError(f"m={m} appended masks must be >= 0")
    return torch.cat([prompt, prompt.new_full((prompt.shape[0], 1 + m), mask_id)], dim=1)


def slot_rows(slots: Iterable[int], n_per_slot: int) -> Tensor:
    """Each slot repeated `n_per_slot` times (the rows of an evaluation batch, slot by slot)."""
    return torch.tensor(list(slots), dtype=torch.long).repeat_interleave(n_per_slot)


def masked_eval_batch(made: dict[str, Tensor], m: int, answer_position: int, mask_id: int = MASK) -> dict[str, Any]:
    """A retrieval task's evaluation batch from its prompts (`prompt`, `value`, `slot`): tokens `prompt +
    [MASK]^(1+m)`, prompt, answer, answer_position (an int), slot. Shared by needle and kv_recall."""
    return {"tokens": with_masks(made["prompt"], m, mask_id), "prompt": made["prompt"], "answer": made["value"],
            "answer_position": answer_position, "slot": made["slot"]}

def needle_eval_batch(
    m: int,
    slots: Iterable[int] = range(8),
    n_per_slot: int = 400,
    generator: torch.Generator | None = None,
    n_symbols: int = 12,
    context_len: int = 16,
) -> dict[str, Tensor | int]:
    """`n_per_slot` prompts per slot, each followed by 1+m masks; same generator seed gives the same prompts
    for every m. Keys: tokens, prompt, answer (the value), answer_position (an int), slot."""
    made = needle_prompts(slot_rows(slots, n_per_slot), generator, n_symbols, context_len)
    return masked_eval_batch(made, m, prompt_length(context_len))


class RetrievalData(SymbolTask, SplitData):
    """What needle and kv_recall share: `n_train` rows from `seed`, `n_val` held-out rows from another stream, and
    `eval_batch(m, ...)`: held-out `prompt + [MASK]^(1+m)` inputs for the `mask_sweep` callback.

    A subclass sets `make_rows` / `make_eval_batch` (its task's functions) and `prompt_shape()` (their keywords).

    Args:
        max_eos: most trailing EOS tokens after the answer; each row draws p ~ U{0..max_eos}.
        n_train: training rows, generated from `seed`.
        n_val: validation rows, generated from a separate stream.
        batch_size: rows per batch.
        seed: seed of the generated rows (the same seed gives the same rows).
        num_workers: DataLoader worker processes; 0 loads in the main process.
    """

    make_rows: Callable[..., dict[str, Tensor]]
    make_eval_batch: Callable[..., dict[str, Tensor | int]]
    n_train: int
    n_val: int
    seed: int
    max_eos: int
    n_slots: int
    train_set: GeneratedRows | None = None
    val_set: GeneratedRows | None = None

    def __init__(self, n_train: int, n_val: int, batch_size: int, seed: int, num_workers: int):
        super().__init__()
        check_split_sizes(n_train=n_train, n_val=n_val, batch_size=batch_size)
        self.n_train, self.n_val, self.batch_size, self.seed = n_train, n_val, batch_size, seed
        self.num_workers = num_workers

    def prompt_shape(self) -> dict[str, int]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        shape = {**self.prompt_shape(), "max_eos": self.max_eos}
        self.train_set = GeneratedRows(self.make_rows, self.n_train, self.seed, self.token_map, **shape)
        self.val_set = GeneratedRows(self.make_rows, self.n_val, self.seed + 1_000_003, self.token_map,
                                     **shape)  # a disjoint stream

    def eval_batch(self, m: int, n_per_slot: int = 400, seed: int | None = None) -> dict[str, Tensor | int]:
        """Held-out `prompt + [MASK]^(1+m)` inputs over every slot; the same `seed` gives the same prompts."""
        g = torch.Generator().manual_seed(self.seed + 2_000_006 if seed is None else seed)
        return self.written(self.make_eval_batch(m, range(self.n_slots), n_per_slot, g, **self.prompt_shape()))


class NeedleData(RetrievalData):
    """Needle retrieval: `n_train` training rows from `seed`, `n_val` held-out rows from another stream.

    The settings both retrieval tasks share are `RetrievalData`'s.

    Args:
        n_symbols: size of the content vocabulary shared by filler and values (≥ 2); chance is 1/n_symbols.
        context_len: content tokens in the context, an even number ≥ 2; the needle sits in one of context_len/2 slots.
    """

    pad_id, mask_id, bos_id, sep_id, eos_id, needle_id = PAD, MASK, BOS, SEP, EOS, NDL
    make_rows, make_eval_batch = staticmethod(needle_rows), staticmethod(needle_eval_batch)

    def __init__(
        self,
        n_symbols: int = 12,
        context_len: int = 16,
        max_eos: int = 32,
        n_train: int = 20_000,
        n_val: int = 2_000,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ):
        _check(n_symbols, context_len, max_eos)
        super().__init__(n_train, n_val, batch_size, seed, num_workers)
        self.n_symbols, self.context_len, self.max_eos = n_symbols, context_len, max_eos
        self.vocab_size = FIRST_SYMBOL + n_symbols
        self.prompt_length = prompt_length(context_len)
        self.answer_position = self.prompt_length
        self.max_len = self.prompt_length + 3 + max_eos
        self.n_slots = context_len // 2

    def prompt_shape(self) -> dict[str, int]:
        return dict(n_symbols=self.n_symbols, context_len=self.context_len)
