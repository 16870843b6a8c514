"""A generated task's symbols written in a model's own tokenizer: each task id becomes one token id of it.

The generated tasks (needle, kv_recall, pointer_chase) are sequences of abstract symbols whose positions carry the
task (the answer sits right after the prompt). On a model that brings a tokenizer, each symbol is written as one
of that tokenizer's tokens, so positions, lengths and answers are unchanged: the task's roles take the tokenizer's
own special tokens where it has them (EOS, BOS, SEP, [MASK], padding; each used once), and every other symbol a
distinct single-token string (` a`, ` b`, ..., digits, punctuation) that is not a special token. The vocabulary
becomes the tokenizer's. `SymbolTask.use_tokenizer` is what the run calls (`framework.assembly.hand_tokenizer`).
"""

from __future__ import annotations

import string
from typing import Any

import torch
from torch import Tensor

#: a role's attribute on the data → the tokenizer attribute holding its token, in the order roles claim tokens
ROLE_TOKENS = {"eos_id": "eos_token_id", "bos_id": "bos_token_id", "sep_id": "sep_token_id",
               "mask_id": "mask_token_id", "pad_id": "pad_token_id"}
#: strings tried, in order, for the symbols without a special token (each must be one token of the tokenizer)
CANDIDATES = ([f" {c}" for c in string.ascii_lowercase + string.ascii_uppercase + string.digits]
              + list(string.ascii_lowercase + string.ascii_uppercase + string.digits)
              + [f" {c}" for c in string.punctuation] + list(string.punctuation))
#: the keys of a generated batch that hold token ids (the rest are positions, lengths, masks, slots)
TOKEN_KEYS = ("tokens", "prompt", "value", "answer")


def single_tokens(tokenizer: Any, exclude: set[int]) -> list[int]:
    """Distinct ids of the `CANDIDATES` the tokenizer writes as exactly one token, those in `exclude` left out."""
    out: list[int] = []
    for text in CANDIDATES:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and ids[0] not in exclude and ids[0] not in out:
            out.append(int(ids[0]))
    return out


def symbol_map(tokenizer: Any, vocab_size: int, roles: dict[str, int]) -> Tensor:
    """(vocab_size,) long tensor: task id → token id of `tokenizer`. `roles` names the task ids of the roles in
    `ROLE_TOKENS` (a role the tokenizer lacks, or whose token another role took, is written like any symbol).
    ValueError when the tokenizer has too few single-token strings for the task's symbols."""
    written: dict[int, int] = {}
    for role, attr in ROLE_TOKENS.items():
        token = getattr(tokenizer, attr, None)
        if role in roles and isinstance(token, int) and token not in written.values():
            written[roles[role]] = token
    specials = set(getattr(tokenizer, "all_special_ids", [])) | set(written.values())
    rest = [i for i in range(vocab_size) if i not in written]
    pool = single_tokens(tokenizer, specials)
    if len(pool) < len(rest):
        raise ValueError(f"the task has {len(rest)} symbols to write without a special token, but the tokenizer "
                         f"({type(tokenizer).__name__}) writes only {len(pool)} of the {len(CANDIDATES)} candidate "
                         "strings (letters, digits, punctuation) as single tokens; shrink the task's symbol counts")
    written.update(zip(rest, pool, strict=False))
    return torch.tensor([written[i] for i in range(vocab_size)], dtype=torch.long)


def write(rows: Tensor | dict[str, Any], token_map: Tensor | None) -> Tensor | dict[str, Any]:
    """`rows` (a tensor of task ids, or a dict holding some under `TOKEN_KEYS`) with its task ids written through
    `token_map`; unchanged when there is no map."""
    if token_map is None:
        return rows
    if isinstance(rows, Tensor):
        return token_map.to(rows.device)[rows]
    return {k: (token_map.to(v.device)[v] if k in TOKEN_KEYS and isinstance(v, Tensor) else v)
            for k, v in rows.items()}


class SymbolTask:
    """Mixin for a generated task's data module: `use_tokenizer` writes its symbols in a model's tokenizer.

    The module states its role ids as class attributes (`pad_id`, `eos_id`, ...; `needle_id` and other `*_id`
    markers are symbols too), its task vocabulary as `vocab_size`, and passes every batch it builds through
    `self.written(...)`."""

    token_map: Tensor | None = None
    tokenizer: Any = None

    def use_tokenizer(self, tokenizer: Any) -> None:
        """Write the task in `tokenizer`'s tokens: the role ids become its tokens, `vocab_size` its length."""
        cls = type(self)
        ids = {name: getattr(cls, name) for name in dir(cls)
               if name.endswith("_id") and isinstance(getattr(cls, name, None), int)}
        self.task_vocab_size = getattr(self, "task_vocab_size", None) or int(self.vocab_size)  # a second call: same
        self.token_map = symbol_map(tokenizer, self.task_vocab_size, ids)
        for name, task_id in ids.items():
            setattr(self, name, int(self.token_map[task_id]))
        self.tokenizer, self.vocab_size = tokenizer, len(tokenizer)
        for name in ("train_set", "val_set", "chain_set"):
            if hasattr(self, name):
                setattr(self, name, None)

    def written(self, rows: Tensor | dict[str, Any]) -> Tensor | dict[str, Any]:
        return write(rows, self.token_map)


__all__ = ["CANDIDATES", "ROLE_TOKENS", "SymbolTask", "TOKEN_KEYS", "single_tokens", "symbol_map", "write"]
