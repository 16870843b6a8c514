"""Key-value associative recall (the needle task's harder variant): `BOS k1 v1 .. kN vN SEP kq vq EOS^p PAD...`.

N pairs with distinct keys; the query key kq repeats the key of pair q ("content-matched": the model must
compare contents, not find a marker), and the answer is its value vq, right after the prompt `BOS pairs SEP kq`.
Slot q = 0 is the pair farthest from the answer. p ~ U{0..max_eos} trailing EOS, as in the needle task.
Same interface as `NeedleData`, so `mask_sweep` works on it. A 3-layer d=64 MDLM stays at chance in a CPU
budget (docs/mdlm.md); it is sized for a GPU (≥ 20k steps).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from framework.data.needle import RetrievalData, masked_eval_batch, slot_rows
from framework.rng import draw_device

PAD, MASK, BOS, SEP, EOS = range(5)
FIRST_KEY = 5  # keys are FIRST_KEY .. FIRST_KEY + n_keys - 1; values follow them


def _check(n_pairs: int, n_keys: int, n_values: int, max_eos: int) -> None:
    if n_pairs < 1 or n_keys < n_pairs:
        raise ValueError(f"n_pairs={n_pairs} must be >= 1 and n_keys={n_keys} >= n_pairs (keys are distinct)")
    if n_values < 2:
        raise ValueError(f"n_values={n_values} must be >= 2")
    if max_eos < 0:
        raise ValueError(f"max_eos={max_eos} must be >= 0")


def prompt_length(n_pairs: int = 8) -> int:
    """Length of `BOS k1 v1 .. kN vN SEP kq`; also the absolute position of the answer vq."""
    return 2 * n_pairs + 3


def key_position(slot: Tensor | int) -> Tensor | int:
    """Absolute position of the key of pair `slot` (BOS is position 0); its value follows it."""
    return 1 + 2 * slot


def kv_prompts(
    slots: Tensor, generator: torch.Generator | None = None, n_pairs: int = 8, n_keys: int = 16, n_values: int = 16
) -> dict[str, Tensor]:
    """Prompts (n, 2N+3) querying pair `slots` (n,); also returns the answers (`value`) and the slots."""
    _check(n_pairs, n_keys, n_values, 0)
    slots = torch.as_tensor(slots, dtype=torch.long)
    if slots.numel() and (slots.min() < 0 or slots.max() >= n_pairs):
        raise ValueError(f"slots must lie in [0, {n_pairs - 1}], got {slots.unique().tolist()}")
    n = slots.shape[0]
    where = draw_device(generator)
    keys = torch.rand(n, n_keys, generator=generator, device=where).argsort(dim=1)[:, :n_pairs] + FIRST_KEY
    values = torch.randint(0, n_values, (n, n_pairs), generator=generator, device=where) + FIRST_KEY + n_keys
    rows = torch.arange(n)
    pairs = torch.stack([keys, values], dim=2).flatten(1)  # k1 v1 k2 v2 ...
    query = keys[rows, slots]
    prompt = torch.cat([torch.full((n, 1), BOS), pairs, torch.full((n, 1), SEP), query[:, None]], dim=1)
    return {"prompt": prompt, "value": values[rows, slots], "slot": slots}


def kv_rows(
    n: int,
    generator: torch.Generator | None = None,
    n_pairs: int = 8,
    n_keys: int = 16,
    n_values: int = 16,
    max_eos: int = 32,
) -> dict[str, Tensor]:
    """n training rows of fixed length 2N + 4 + max_eos, right-padded with PAD.

    Keys: tokens, attention_mask (True = real), prompt_mask (True = prompt), slot, value, length.
    """
    _check(n_pairs, n_keys, n_values, max_eos)
    slots = torch.randint(0, n_pairs, (n,), generator=generator, device=draw_device(generator))
    made = kv_prompts(slots, generator, n_pairs, n_keys, n_values)
    eos = torch.randint(0, max_eos + 1, (n,), generator=generator, device=draw_device(generator))
    p = prompt_length(n_pairs)
    width = p + 1 + max_eos
    tokens = torch.full((n, width), PAD)
    tokens[:, :p] = made["prompt"]
    tokens[:, p] = made["value"]
    pos = torch.arange(width)[None]
    length = p + 1 + eos
    tokens = torch.where((pos > p) & (pos < length[:, None]), EOS, tokens)
    return {
        "tokens": tokens,
        "attention_mask": pos < length[:, None],
        "prompt_mask": (pos < p).expand(n, width).clone(),
        "slot": slots,
        "value": made["value"],
        "length": length,
    }


def kv_eval_batch(
    m: int,
    slots: Iterable[int] = range(8),
    n_per_slot: int = 400,
    generator: torch.Generator | None = None,
    n_pairs: int = 8,
    n_keys: int = 16,
    n_values: int = 16,
) -> dict[str, Tensor | int]:
    """`n_per_slot` prompts per queried slot, each followed by 1+m masks; the same generator seed gives the same
    prompts for every m. Keys: tokens, prompt, answer, answer_position (an int), slot."""
    made = kv_prompts(slot_rows(slots, n_per_slot), generator, n_pairs, n_keys, n_values)
    return masked_eval_batch(made, m, prompt_length(n_pairs), MASK)


class KVRecallData(RetrievalData):
    """Key-value recall (GPU-sized): `n_train` rows from `seed`, `n_val` held-out rows from another
    stream; `eval_batch(m, ...)` gives `prompt + [MASK]^(1+m)` inputs for the `mask_sweep` callback.

    The settings both retrieval tasks share are `RetrievalData`'s.

    Args:
        n_pairs: key-value pairs in each prompt (≥ 1); also the number of answer slots.
        n_keys: size of the key vocabulary, ≥ n_pairs (a prompt's keys are distinct).
        n_values: size of the value vocabulary (≥ 2); chance accuracy is 1/n_values.
    """

    pad_id, mask_id, bos_id, sep_id, eos_id = PAD, MASK, BOS, SEP, EOS
    make_rows, make_eval_batch = staticmethod(kv_rows), staticmethod(kv_eval_batch)

    def __init__(
        self,
        n_pairs: int = 8,
        n_keys: int = 16,
        n_values: int = 16,
        max_eos: int = 32,
        n_train: int = 20_000,
        n_val: int = 2_000,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ):
        _check(n_pairs, n_keys, n_values, max_eos)
        super().__init__(n_train, n_val, batch_size, seed, num_workers)
        self.n_pairs, self.n_keys, self.n_values, self.max_eos = n_pairs, n_keys, n_values, max_eos
        self.vocab_size = FIRST_KEY + n_keys + n_values
        self.prompt_length = prompt_length(n_pairs)
        self.answer_position = self.prompt_length
        self.max_len = self.prompt_length + 1 + max_eos
        self.n_slots = n_pairs

    def prompt_shape(self) -> dict[str, int]:
        return dict(n_pairs=self.n_pairs, n_keys=self.n_keys, n_values=self.n_values)
