"""Pointer chasing, a reasoning-chain analogue for RLKV (docs/rlkv.md): multi-hop look-ups through a permutation.

Row: `BOS a1 f(a1) .. aN f(aN) SEP s | f(s) f(f(s)) .. EOS PAD..`. The N symbols are drawn from `n_symbols`,
listed in random order, and f is a random permutation of them. Each answer token needs a look-up of the previous
token in the (far) prompt. Tasks:

* `chain` with `hops=None` (default): follow f until the chain returns to s, then EOS. The cycle length is
  uniform on 1..N, so *when to stop* depends on remembering s, which has left a short window after a few hops.
* `chain` with `hops=K`: exactly K hops, then EOS (an easier variant).
* `lookup`: one hop, `f(s) EOS` (a single-needle retrieval: the proxy task DuoAttention is trained on).

With `distinct_answers=True` (default) answers are written with their own copy of the symbols (id + n_symbols),
as a chat template marks the model's own turn: a window of recent tokens then shows that the model is answering.
With shared ids a rotary-position model must look back at SEP for that, and in a 2-layer model most heads then
need the full cache (measured, docs/rlkv.md).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from framework.data.resumable import SplitData, check_split_sizes, train_loader
from framework.data.rows import GeneratedRows
from framework.data.symbols import SymbolTask
from framework.rng import draw_device

PAD, BOS, SEP, EOS = range(4)
FIRST_SYMBOL = 4
TASKS = ("chain", "lookup")


def prompt_length(n_pairs: int) -> int:
    """Length of `BOS pairs SEP s`."""
    return 2 * n_pairs + 3


def answer_length(n_pairs: int, hops: int | None = None, task: str = "chain") -> int:
    """The longest answer, EOS included."""
    if task == "lookup":
        return 2
    return (n_pairs if hops is None else hops) + 1


def _check(n_pairs: int, n_symbols: int, hops: int | None, task: str) -> None:
    if n_pairs < 1 or n_symbols < n_pairs:
        raise ValueError(f"n_pairs={n_pairs} must be >= 1 and n_symbols={n_symbols} >= n_pairs (symbols are distinct)")
    if hops is not None and hops < 1:
        raise ValueError(f"hops={hops} must be >= 1, or None (follow the chain until it returns to the start)")
    if task not in TASKS:
        raise ValueError(f"task={task!r}; valid: {', '.join(TASKS)}")


def chase_rows(n: int, generator: torch.Generator | None = None, n_pairs: int = 8, n_symbols: int = 16,
               hops: int | None = None, task: str = "chain", distinct_answers: bool = True) -> Tensor:
    """n rows (n, prompt_length + answer_length) of token ids, right-padded with PAD after EOS."""
    _check(n_pairs, n_symbols, hops, task)
    where = draw_device(generator)
    symbols = torch.rand(n, n_symbols, generator=generator, device=where).argsort(dim=1)[:, :n_pairs] + FIRST_SYMBOL
    succ = torch.rand(n, n_pairs, generator=generator, device=where).argsort(dim=1)  # f(symbols[i]) = symbols[succ[i]]
    rows = torch.arange(n)
    values = symbols.gather(1, succ)
    start = torch.randint(0, n_pairs, (n,), generator=generator, device=draw_device(generator))
    pairs = torch.stack([symbols, values], dim=2).flatten(1)
    prompt = torch.cat([torch.full((n, 1), BOS), pairs, torch.full((n, 1), SEP), symbols[rows, start, None]], 1)
    width = answer_length(n_pairs, hops, task)
    answer = torch.full((n, width), PAD)
    at, done = start.clone(), torch.zeros(n, dtype=torch.bool)
    written = symbols + n_symbols if distinct_answers else symbols
    steps = 1 if task == "lookup" else (n_pairs if hops is None else hops)
    for k in range(steps):
        at = succ[rows, at]
        answer[:, k] = torch.where(done, answer[:, k], written[rows, at])
        stop = torch.full((n,), k + 1 == steps) if hops is not None or task == "lookup" else at == start
        answer[:, k + 1] = torch.where(~done & stop, EOS, answer[:, k + 1])
        done |= stop
    return torch.cat([prompt, answer], dim=1)


class PointerChaseData(SymbolTask, SplitData):
    """Pointer-chasing rows for causal LMs: `n_train` training rows of `train_task`, `n_val` held-out `chain` rows.

    Training batches are token tensors (what `causal_lm` trains on); probes split them at `prompt_length`.
    `pretrain_dataloader()` always serves `chain` rows (a probe pretraining its own base uses it).

    Args:
        n_pairs: (symbol, f(symbol)) pairs listed in each prompt (≥ 1); the longest chain has n_pairs hops.
        n_symbols: size of the symbol vocabulary, ≥ n_pairs (a prompt's symbols are distinct).
        hops: `chain` rows follow exactly this many hops; None: until the chain returns to its start.
        train_task: task of the training rows: "chain" or "lookup" (one hop); validation is always "chain".
        distinct_answers: write answers with their own copy of the symbols (id + n_symbols), marking the model's turn.
        n_train: training rows, generated from `seed`.
        n_val: validation rows, generated from a separate stream.
        batch_size: rows per training batch.
        val_batch_size: rows per validation batch (probes decode them several times, so bigger is cheaper).
        seed: seed of the generated rows (the same seed gives the same rows).
        num_workers: DataLoader worker processes; 0 loads in the main process.
    """

    pad_id, bos_id, sep_id, eos_id = PAD, BOS, SEP, EOS

    def __init__(self, n_pairs: int = 8, n_symbols: int = 16, hops: int | None = None, train_task: str = "chain",
                 distinct_answers: bool = True, n_train: int = 50_000, n_val: int = 1_000, batch_size: int = 64,
                 val_batch_size: int = 250, seed: int = 0, num_workers: int = 0):
        super().__init__()
        _check(n_pairs, n_symbols, hops, train_task)
        self.n_pairs, self.n_symbols, self.hops, self.train_task = n_pairs, n_symbols, hops, train_task
        self.distinct_answers = distinct_answers
        check_split_sizes(n_train=n_train, n_val=n_val, batch_size=batch_size, val_batch_size=val_batch_size)
        self.n_train, self.n_val, self.batch_size, self.seed = n_train, n_val, batch_size, seed
        self.val_batch_size = val_batch_size
        self.num_workers = num_workers
        self.vocab_size = FIRST_SYMBOL + n_symbols * (2 if distinct_answers else 1)
        self.prompt_length = prompt_length(n_pairs)
        self.max_new_tokens = answer_length(n_pairs, hops, "chain")
        self.max_len = self.prompt_length + self.max_new_tokens
        self.train_set: GeneratedRows | None = None
        self.val_set: GeneratedRows | None = None
        self.chain_set: GeneratedRows | None = None

    def _shape(self, task: str) -> dict:
        return dict(n_pairs=self.n_pairs, n_symbols=self.n_symbols, hops=self.hops, task=task,
                    distinct_answers=self.distinct_answers)

    def setup(self, stage: str | None = None) -> None:
        if self.val_set is not None:
            return
        write = self.token_map
        self.chain_set = GeneratedRows(chase_rows, self.n_train, self.seed, write, **self._shape("chain"))
        self.train_set = (self.chain_set if self.train_task == "chain" else
                          GeneratedRows(chase_rows, self.n_train, self.seed + 7, write, **self._shape(self.train_task)))
        self.val_set = GeneratedRows(chase_rows, self.n_val, self.seed + 1_000_003, write, **self._shape("chain"))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.val_batch_size, shuffle=False, num_workers=self.num_workers)

    def pretrain_dataloader(self, batch_size: int | None = None) -> DataLoader:
        """Shuffled `chain` training rows (whatever `train_task` is), `batch_size` rows at a time."""
        self.setup()
        return train_loader(self.chain_set, batch_size or self.batch_size, self.seed)

    def split(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """(prompt, answer) of a batch of rows."""
        return batch[:, : self.prompt_length], batch[:, self.prompt_length :]
