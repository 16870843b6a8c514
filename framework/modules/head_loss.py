"""Next-token cross-entropy taken from the output head's input, a few rows of logits at a time.

A language model's logits are (batch, seq, vocab): at 2,048 tokens and a 128k vocabulary, 1 GiB in float32, and as much
again for their gradient, more than a LoRA fine-tune's adapters and optimizer state together. `HeadSkipped` runs the
model with its output head replaced by a placeholder that holds no memory and keeps the head's input (the final
hidden states); `head_token_losses` then builds the logits only at the supervised positions, `rows` at a time, and
rebuilds each slice in the backward pass (activation checkpointing) instead of keeping it. The losses are the same
cross-entropies as the logits' own, up to float rounding.

It applies where the model's output is the head's output as is (`HeadSkipped.took`): the framework's models and
transformers' causal LMs (Llama, Qwen, Mistral, ...). A family that changes the logits after its head (Gemma 2's
soft-capping, Cohere's scale) returns something else, and the caller takes the logits the usual way.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

#: logits entries built at once (float32: 64 MiB); with its gradient, the most the loss holds beyond the model
CHUNK_ELEMENTS = 2**24


def head_width(head: nn.Module) -> int | None:
    """The number of logits `head` makes per position (its weight's rows), None for a head without a 2-D weight."""
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, Tensor) and weight.dim() == 2 else None


def is_sharded(head: nn.Module) -> bool:
    """True when `head`'s parameters are distributed tensors (FSDP2): they are whole only inside the model's forward,
    so the head cannot be run after it."""
    return any(type(p).__name__ == "DTensor" for p in head.parameters())


class HeadSkipped:
    """Inside the block, `head` returns a placeholder of its output's shape with no storage (one element, expanded) and
    keeps its input in `hidden`; `took(out)` says whether the model's output was that placeholder as is."""

    def __init__(self, head: nn.Module):
        self.head, self.width = head, head_width(head)
        self.hidden: Tensor | None = None
        self.placeholder: Tensor | None = None
        self._saved: Any = None

    def _forward(self, hidden: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        self.hidden = hidden
        self.placeholder = hidden.new_zeros(()).expand(*hidden.shape[:-1], self.width)
        return self.placeholder

    def __enter__(self) -> HeadSkipped:
        self._saved = self.head.__dict__.get("forward")  # an instance-level forward (accelerate's hooks) comes back
        self.head.forward = self._forward
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            del self.head.forward
        else:
            self.head.forward = self._saved

    def took(self, out: Any) -> bool:
        """True when `out` is the placeholder or a slice of it (its storage, no strides, its width): nothing ran after
        the head but indexing."""
        p = self.placeholder
        return (isinstance(out, Tensor) and p is not None and self.hidden is not None and out.dim() == p.dim()
                and out.shape[-1] == p.shape[-1] and not any(out.stride()) and out.data_ptr() == p.data_ptr())


def _slice_losses(head: nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(head(hidden).float(), targets, reduction="none")


def head_token_losses(head: nn.Module, hidden: Tensor, targets: Tensor, chunk: int | None = None) -> Tensor:
    """Each position's CE of `head(hidden)` against `targets` (batch, seq; -100 where no loss is taken, and there 0),
    the logits built only at the supervised positions, `chunk // vocab` rows at a time (`CHUNK_ELEMENTS` by default);
    while training, each slice is rebuilt in the backward pass rather than kept."""
    width = head_width(head) or head(hidden[:1, :1]).shape[-1]
    flat = targets.reshape(-1)
    keep = (flat != -100).nonzero().squeeze(1)
    rows, wanted = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep), flat.index_select(0, keep)
    step = max(1, (chunk or CHUNK_ELEMENTS) // width)
    training = torch.is_grad_enabled() and (rows.requires_grad or any(p.requires_grad for p in head.parameters()))
    run = functools.partial(_slice_losses, head)
    parts = [checkpoint(run, rows[s : s + step], wanted[s : s + step], use_reentrant=False) if training
             else run(rows[s : s + step], wanted[s : s + step]) for s in range(0, rows.shape[0], step)]
    losses = torch.cat(parts) if parts else rows.new_zeros(0, dtype=torch.float32)
    return losses.new_zeros(flat.shape).index_put((keep,), losses).view(targets.shape)
