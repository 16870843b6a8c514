"""Prompt batches: the rows a head probe generates from (the user's prompt/completion rows, `data=chat`).

A batch is a dict: `prompt` (B, P) left-padded with the pad id (decoding continues every row at the right edge),
`prompt_mask` (B, P) True at real tokens, `answer` (B, A) each completion's ids through its end token, right-padded
with the pad id (what `framework.serving.decoding` writes after a row's EOS, so an exact match is a tensor compare),
and `index` (B,) the row's stable index. The generated tasks' probes read a tensor cut at `prompt_length` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from framework.errors import InputError

PromptPair = tuple[np.ndarray, np.ndarray]


class PromptRows(Dataset):
    """(prompt ids, completion ids) pairs as items of `collate_prompts`; `pad_id` fills both sides."""

    def __init__(self, pairs: Sequence[PromptPair], pad_id: int):
        self.pairs, self.pad_id = list(pairs), int(pad_id)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        prompt, completion = self.pairs[i]
        return i, prompt, completion

    def collate(self, items: Sequence[tuple[int, np.ndarray, np.ndarray]]) -> dict[str, Tensor]:
        return collate_prompts(items, self.pad_id)


def collate_prompts(items: Sequence[tuple[int, np.ndarray, np.ndarray]], pad_id: int) -> dict[str, Tensor]:
    """Items (index, prompt ids, completion ids) as one prompt batch (the module docstring)."""
    width, answer_width = max(len(p) for _, p, _ in items), max(len(c) for _, _, c in items)
    prompt = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.bool)
    answer = torch.full((len(items), answer_width), pad_id, dtype=torch.long)
    for r, (_, p, c) in enumerate(items):
        prompt[r, width - len(p):], mask[r, width - len(p):] = torch.as_tensor(p, dtype=torch.long), True
        answer[r, : len(c)] = torch.as_tensor(c, dtype=torch.long)
    return {"prompt": prompt, "prompt_mask": mask, "answer": answer,
            "index": torch.tensor([i for i, _, _ in items], dtype=torch.long)}


def prompt_sets(pairs: Iterable[tuple[str, int, np.ndarray, np.ndarray]], seq_len: int, truncate: bool, pad_id: int,
                source: str) -> tuple[dict[str, PromptRows], dict[str, Any]]:
    """`pairs` (part "train" / "val", row index, prompt ids, completion ids) as a PromptRows per part, and the counts
    for the log and the record. A row whose prompt and completion pass `seq_len` is skipped and counted (the model
    could not read it whole), or refused with `truncate=False`; a part left empty is refused."""
    kept: dict[str, list[PromptPair]] = {"train": [], "val": []}
    long = {"train": 0, "val": 0}
    for part, index, prompt, completion in pairs:
        if len(prompt) + len(completion) > seq_len:
            if not truncate:
                raise InputError(f"data=chat: row {index} is a prompt of {len(prompt)} and a completion of "
                                 f"{len(completion)} tokens, longer than data.seq_len={seq_len}; raise data.seq_len, "
                                 "or set data.truncate=true to skip such rows")
            long[part] += 1
            continue
        kept[part].append((prompt, completion))
    for part, rows in kept.items():
        if not rows:
            raise InputError(f"data.source={source}: the {part} part has no prompt/completion row of at most "
                             f"data.seq_len={seq_len} tokens ({long[part]} longer)")
    every = kept["train"] + kept["val"]
    counts = {part: {"rows": len(rows), "tokens": sum(len(p) + len(c) for p, c in rows),
                     "skipped_longer_than_seq_len": long[part]} for part, rows in kept.items()}
    counts.update(prompt_tokens_max=max(len(p) for p, _ in every), completion_tokens_max=max(len(c) for _, c in every),
                  end_ids=sorted({int(c[-1]) for _, c in every if len(c)}))
    return {part: PromptRows(rows, pad_id) for part, rows in kept.items()}, counts


def prompt_line(counts: dict[str, Any], seq_len: int) -> str:
    """One log line of what `prompt_sets` kept."""
    return (f"data=chat as prompts: {counts['train']['rows']} training and {counts['val']['rows']} validation rows "
            f"({counts['train']['skipped_longer_than_seq_len'] + counts['val']['skipped_longer_than_seq_len']} "
            f"skipped: longer than data.seq_len={seq_len}); prompts up to {counts['prompt_tokens_max']} tokens, "
            f"completions up to {counts['completion_tokens_max']}")


def split_prompts(batch: Tensor | dict[str, Tensor], prompt_length: int | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(prompt, answer, prompt mask or None) of a prompt batch, or of a generated task's rows cut at `prompt_length`."""
    if isinstance(batch, dict):
        return batch["prompt"], batch["answer"], batch["prompt_mask"]
    return batch[:, :prompt_length], batch[:, prompt_length:], None


__all__ = ["PromptRows", "collate_prompts", "prompt_line", "prompt_sets", "split_prompts"]
