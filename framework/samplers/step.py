"""What one training step tells a selection policy, for any LightningModule and any batch layout.

`DataSelection` reads the per-sample fields a policy `needs` from, in this order:
- the dict `training_step` returns: `per_sample_loss` (or `losses`), `logits`, `features`, `targets`, `index`; a
  language model's `token_stats` (each row's means over its supervised tokens, `framework.modules.causal_lm`) stand
  in for `logits` and `targets`;
- the classifier head it was told to watch (`DataSelection(head="net.fc")`): the head's output is the logits,
  its input the penultimate features, both taken from the training step's own forward pass; a language model's
  head (`head="model.lm_head"`, logits of shape (batch, seq, vocab)) gives each row's mean token loss against the
  batch's `labels` (or `input_ids`), so a Hugging Face model that returns only its mean loss needs no change;
- the batch: `batch["targets"]`/`batch["y"]`, or the second element of a tuple batch `(x, y)`, as targets;
- its own sampler, for the indices (the callback knows which samples each batch holds: it yields them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

ALIASES = {"losses": ("losses", "per_sample_loss")}  # a step output's accepted names
#: a sequence model's per-row summary that stands in for per-token logits and targets (`reward.sample_pieces`)
SUMMARIES = {"logits": "token_stats", "targets": "token_stats"}
BATCH_KEYS = {"targets": "y"}  # a field that may also be read from a dict batch under another name
HOOK = "return {'loss': losses.mean(), 'per_sample_loss': losses} from training_step (losses: reduction='none')"


def batch_len(batch: Any) -> int | None:
    """The leading size of the first tensor in `batch` (a tensor, or a dict, tuple or list holding one)."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        n = batch_len(value)
        if n is not None:
            return n
    return None


def from_batch(batch: Any, key: str) -> Any:
    if isinstance(batch, dict):
        return batch.get(key, batch.get(BATCH_KEYS.get(key, key)))
    if key == "targets" and isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return batch[1]
    return None


class HeadCapture:
    """The input (`features`) and output (`logits`) of `root`'s submodule `name` during a `with` block: its forward
    hook is registered on entering and removed on leaving, so the module carries nothing between training steps."""

    def __init__(self, root: nn.Module, name: str):
        try:
            self.module = root.get_submodule(name)
        except AttributeError as error:
            names = [n for n, m in root.named_modules() if n and not list(m.children())]
            raise ValueError(f"DataSelection(head={name!r}): {type(root).__name__} has no such submodule; its "
                             f"layers: {names[:12]}") from error
        self.fields: dict[str, Tensor] = {}
        self.sequence_logits: Tensor | None = None  # a language model head's (batch, seq, vocab) output, in the graph
        self._handle: Any = None

    def _hook(self, module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, Tensor) and inputs and isinstance(inputs[0], Tensor):
            if output.ndim == 3:  # per token: the features are the rows' mean hidden state
                self.sequence_logits = output
                self.fields = {"features": inputs[0].detach().mean(1)}
            else:
                self.fields = {"features": inputs[0].detach(), "logits": output.detach()}

    def __enter__(self) -> HeadCapture:
        self.fields, self.sequence_logits = {}, None
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def with_sequence_losses(outputs: Any, batch: Any, logits: Tensor, shift: bool = True) -> Any:
    """`outputs` as `{"loss": ..., "per_sample_loss": ...}`: each row's mean token cross-entropy of a language model's
    `logits` (batch, seq, vocab) against the batch's `labels` (else `input_ids`; -100 and padding are ignored, as
    transformers does), shifted one place for a causal LM (`shift`). Outputs that already carry per-sample losses,
    or a batch without token labels, are returned unchanged."""
    out = outputs if isinstance(outputs, dict) else {"loss": outputs}
    if any(out.get(k) is not None for k in ALIASES["losses"]) or not isinstance(batch, dict):
        return outputs
    labels = batch.get("labels", batch.get("input_ids"))
    if not isinstance(labels, Tensor) or labels.shape != logits.shape[:2]:
        return outputs
    labels = labels.clone()
    if "attention_mask" in batch and "labels" not in batch:
        labels[batch["attention_mask"] == 0] = -100
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    tokens = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                               reduction="none").view(labels.shape)
    counted = (labels != -100).sum(1).clamp(min=1)
    return {**out, "per_sample_loss": tokens.sum(1) / counted}


def step_fields(outputs: Any, batch: Any, needs: tuple[str, ...], index: Tensor, captured: dict[str, Tensor],
                policy: str) -> dict[str, Tensor]:
    """The fields `needs` names for one step (detached), or an error saying how to provide the missing ones."""
    out = outputs if isinstance(outputs, dict) else {}
    step: dict[str, Tensor] = {}
    for key in needs:
        summary = SUMMARIES.get(key)
        if summary is not None and out.get(summary) is not None:
            step[summary] = out[summary].detach()
            continue
        value = next((out[k] for k in ALIASES.get(key, (key,)) if out.get(k) is not None), None)
        if value is None and key == "index":
            value = index
        if value is None:
            value = captured.get(key)
        if value is None:
            value = from_batch(batch, key)
        if value is None:
            what = f"a dict with {sorted(out)}" if out else type(outputs).__name__
            how = HOOK if key == "losses" else (
                f"add {key!r} to training_step's output dict, or name the classifier's last layer: "
                "DataSelection(head='net.fc') (its output is the logits, its input the features)")
            raise TypeError(f"{policy} needs the per-sample {key!r} of every training step; training_step "
                            f"returned {what}: {how}")
        step[key] = (value if isinstance(value, Tensor) else torch.as_tensor(value)).detach()
    return step


def reweight(outputs: Any, weight: Tensor, policy: str) -> Any:
    """`outputs` with its loss trained on mean(w·ℓ): loss + mean((w − 1)·ℓ), ℓ its `per_sample_loss`."""
    losses = outputs.get("per_sample_loss") if isinstance(outputs, dict) else None
    if losses is None:
        raise TypeError(f"{policy} weighs this epoch's samples (weights {weight.min():.3g}..{weight.max():.3g}) "
                        f"and the batch has no room for them; {HOOK}")
    if losses.shape != weight.shape:
        raise ValueError(f"per_sample_loss has shape {tuple(losses.shape)}; it must hold one loss per sample of "
                         f"the batch: {tuple(weight.shape)}")
    loss = outputs["loss"]
    if isinstance(loss, Tensor) and loss.requires_grad and not losses.requires_grad:
        raise ValueError("per_sample_loss is detached: return the tensor the loss was computed from, so the "
                         "selection's weights reach the gradient")
    return {**outputs, "loss": loss + ((weight.to(losses.device, losses.dtype) - 1) * losses).mean()}


class RankGather:
    """All-gathers one step's per-sample fields over the ranks of a fit in one collective (`all_gather`: a tensor to
    its (world_size, ...) stack, e.g. `LightningModule.all_gather`), each field in its own dtype: the fields travel as
    their bytes, so every value arrives bitwise. The identity on one rank. Every rank's fields must have the same
    leading size (the selection sampler's equal shards guarantee it)."""

    def __init__(self, all_gather: Callable[[Tensor], Tensor] | None = None, rank: int = 0, world_size: int = 1,
                 device: torch.device | str | None = None):
        if world_size > 1 and all_gather is None:
            raise ValueError(f"world_size={world_size} needs an all_gather function")
        self.all_gather, self.rank, self.world_size, self.device = all_gather, rank, world_size, device

    def __call__(self, fields: dict[str, Tensor]) -> dict[str, Tensor]:
        if self.world_size == 1:
            return dict(fields)
        rows = next(iter(fields.values())).shape[0]
        device = self.device if self.device is not None else next(iter(fields.values())).device
        cols = [v.detach().to(device).reshape(rows, -1).contiguous().view(torch.uint8) for v in fields.values()]
        assert self.all_gather is not None
        packed = self.all_gather(torch.cat(cols, 1))
        packed = packed.reshape(-1, packed.shape[-1])
        out, at = {}, 0
        for (key, value), col in zip(fields.items(), cols, strict=True):
            part = packed[:, at : at + col.shape[1]].contiguous().view(value.dtype)
            out[key] = part.reshape(-1, *value.shape[1:])
            at += col.shape[1]
        return out
