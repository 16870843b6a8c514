"""Next-token language modelling: cross-entropy loss, bits per token on validation.

A batch is a tensor of token ids (batch, seq), every token after the first a target, or the dict batch of user text
(docs/data.md): `input_ids`, `labels` (aligned with the ids, -100 where no loss is taken; the logits at t predict
`labels[t+1]`) and either `position_ids` (packed rows: the model keeps attention inside each document) or
`attention_mask` (padded rows, 1 = real token), both passed on to the model.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from framework.modules.base import TrainModule
from framework.modules.head_loss import HeadSkipped, head_token_losses, head_width, is_sharded
from framework.samplers.reward import uncertainty

Batch = Tensor | dict[str, Tensor]
log = logging.getLogger(__name__)


def supervised_labels(batch: dict[str, Tensor]) -> Tensor:
    """The batch's `labels`; without them the ids, -100 at padding and at each packed document's first token."""
    labels = batch.get("labels")
    if labels is not None:
        return labels
    labels = batch["input_ids"].clone()
    if batch.get("attention_mask") is not None:
        labels[batch["attention_mask"] == 0] = -100
    if batch.get("position_ids") is not None:
        labels[batch["position_ids"] == 0] = -100
    return labels


def output_head(model: nn.Module) -> nn.Module | None:
    """The layer that turns `model`'s final hidden states into logits: a transformers model's output embeddings, the
    framework's `head`; None when there is no such layer."""
    hf = getattr(model, "hf", None)
    head = hf.get_output_embeddings() if hf is not None else getattr(model, "head", None)
    return head if isinstance(head, nn.Module) else None


class HeadInput:
    """The input of `model`'s output head (its final hidden states) during a `with` block, when `active`: a forward
    pre-hook that lives only inside the block, so nothing is held or run between steps."""

    def __init__(self, model: nn.Module, active: bool):
        self.head = output_head(model) if active else None
        self.hidden: Tensor | None = None
        self._handle: Any = None

    def _hook(self, module: nn.Module, inputs: tuple[Any, ...]) -> None:
        self.hidden = inputs[0].detach()

    def __enter__(self) -> HeadInput:
        if self.head is not None:
            self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


@torch.no_grad()
def token_stats(logits: Tensor, targets: Tensor, chunk: int = 2**24) -> Tensor:
    """(batch, 3): each row's mean over its supervised tokens (targets != -100; 0 for a row with none) of the token's
    CE, its CE against the uniform distribution (−mean_v log p_v) and its uncertainty (entropy / log V, the Data Agent's
    `uncertainty`). Label smoothing ε is linear in the first two, so (1 − ε)·CE + ε·uniform is the row's mean
    label-smoothed CE exactly. Computed `chunk` logits at a time, so memory stays bounded at any vocabulary."""
    vocab = logits.shape[-1]
    flat, tgt = logits.detach().reshape(-1, vocab), targets.reshape(-1)
    per_token = []
    for start in range(0, flat.shape[0], max(1, chunk // vocab)):
        z = flat[start : start + max(1, chunk // vocab)].float()
        log_p = z.log_softmax(-1)
        nll = -log_p.gather(-1, tgt[start : start + z.shape[0]].clamp_min(0)[:, None]).squeeze(-1)
        per_token.append(torch.stack([nll, -log_p.mean(-1), uncertainty(z)], -1))
    scored = (targets != -100).float()
    values = torch.cat(per_token).view(*targets.shape, 3) * scored[..., None]
    return values.sum(1) / scored.sum(1).clamp_min(1)[:, None]


class CausalLM(TrainModule):
    """Trains any tokens→logits model on next-token prediction; logs `val/bpb` (bits per token: per byte for byte data).

    The loss is token-weighted: the CE summed over every supervised token of the batch over their count (a row with
    more supervised tokens weighs more; `val/loss` and `val/bpb` alike over the whole validation set). Under DDP or
    FSDP2 the count is the global batch's, so N ranks train as one process on their rows together would; gradient
    accumulation still weighs each micro-batch by its own count. The rows' own
    losses, each row's mean over its supervised tokens (0 for a row with none), go out as `per_sample_loss`, what a
    data-selection policy (`sampler=`) reads and weighs. A policy that reads `features` and `logits` (the Data
    Agent) gets a language model's per-row view of both: `features`, each row's final hidden state (the output
    head's input, the penultimate feature of the Data Agent's state) averaged over its supervised positions, and
    `token_stats` (`token_stats`: the per-row means its reward is built from) in place of per-token logits.

    Args:
        model: the network to train, or a factory given the data's sizes; supplied by the framework at build time.
        optimizer: factory `(named_parameters) -> Optimizer`, from `optimizer=`; None: AdamW at lr 1e-3.
        scheduler: factory `(optimizer, total_steps) -> LR scheduler`, from `scheduler=`; None: a constant lr.
        vocab_size: the data's vocabulary size, handed to a model factory; supplied from the data at build time.
        prompt_length: score only the tokens after each row's first `prompt_length` (prompt masking); 0 scores all.
        chunked_loss: build the logits a few rows at a time from the head's input, never holding (batch, seq, vocab).
            They are rebuilt in the backward pass (`framework.modules.head_loss`); where the model changes its head's
            output (or FSDP shards the head), the logits are taken whole as with `chunked_loss=False`.
    """

    def __init__(self, model, optimizer=None, scheduler=None, vocab_size: int | None = None, prompt_length: int = 0,
                 chunked_loss: bool = True):
        super().__init__(model, optimizer, scheduler, **({"vocab_size": vocab_size} if vocab_size else {}))
        if prompt_length < 0:
            raise ValueError(f"prompt_length={prompt_length} must be >= 0 (0 scores every token)")
        self.prompt_length = int(prompt_length)
        self.chunked_loss = bool(chunked_loss)
        self._head_takes: bool | None = None  # whether the model's output is its head's (found on the first batch)
        self.val_nll = MeanMetric()

    def predictions(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The model's outputs at the positions that predict (batch, seq − 1[, vocab]: the logits, or inside
        `HeadSkipped` its placeholder) and their targets; targets -100 where no loss is taken."""
        if isinstance(batch, Tensor):
            targets, out = batch[:, 1:], self.model(batch[:, :-1])
        else:
            kwargs = {}
            if batch.get("position_ids") is not None:
                kwargs["position_ids"] = batch["position_ids"]
            if batch.get("attention_mask") is not None:
                kwargs["key_padding_mask"] = batch["attention_mask"].bool()
            targets, out = supervised_labels(batch)[:, 1:], self.model(batch["input_ids"], **kwargs)[:, :-1]
        if self.prompt_length > 1:
            targets = targets.clone()
            targets[:, : self.prompt_length - 1] = -100
        return out, targets

    @staticmethod
    def token_losses(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Each token's CE (0 where no loss is taken) and the mask of the supervised tokens, both (batch, seq)."""
        tokens = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="none")
        return tokens.view(targets.shape), targets != -100

    def scored(self, batch: Batch, features: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """Each token's CE and the supervised mask (`token_losses`), chunked where it applies (`chunked_loss`), and
        with `features` the final hidden states at the same positions (detached; None without)."""
        head = output_head(self.model) if self.chunked_loss and self._head_takes is not False else None
        if head is not None and head_width(head) and not is_sharded(head):
            with HeadSkipped(head) as skipped:
                out, targets = self.predictions(batch)
            if skipped.took(out):
                self._head_takes = True
                hidden = skipped.hidden[:, : targets.shape[1]]
                return head_token_losses(head, hidden, targets), targets != -100, hidden.detach()
            self._head_takes = False
            log.info("chunked_loss: %s changes its output head's logits, so they are taken whole",
                     type(self.model).__name__)
        with HeadInput(self.model, features) as taken:
            tokens, scored = self.token_losses(*self.predictions(batch))
        hidden = taken.hidden
        return tokens, scored, None if hidden is None else hidden[:, : tokens.shape[1]]

    def loss(self, batch: Batch) -> Tensor:
        """The batch's token-weighted mean next-token CE."""
        tokens, scored, _ = self.scored(batch)
        return tokens.sum() / scored.sum().clamp_min(1)

    def per_sample_loss(self, batch: Batch) -> Tensor:
        """Each row's mean next-token CE over its supervised tokens (0 for a row with none)."""
        tokens, scored, _ = self.scored(batch)
        return tokens.sum(1) / scored.sum(1).clamp_min(1)

    def training_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        """Next-token CE (logged as `train/loss`) plus the model's auxiliary loss if any (`train/aux_loss`), with the
        rows' `per_sample_loss` and, for a selection policy that reads them, `features` and `token_stats`."""
        needs = self._selection_needs()
        stats = None
        if needs & {"logits", "targets"}:  # the policy reads every logit: they are built whole
            with HeadInput(self.model, "features" in needs) as taken:
                logits, targets = self.predictions(batch)
            tokens, scored = self.token_losses(logits, targets)
            hidden = None if taken.hidden is None else taken.hidden[:, : targets.shape[1]]
            stats = token_stats(logits, targets)
        else:
            tokens, scored, hidden = self.scored(batch, "features" in needs)
        counts = scored.sum(1)
        losses = tokens.sum(1) / counts.clamp_min(1)
        loss = tokens.sum() / counts.sum().clamp_min(1)
        self.log("train/loss", loss.detach(), prog_bar=True)
        loss = tokens.sum() / self._shared_count(counts.sum())
        aux = self.pop_model_aux_loss()
        if aux is not None:
            self.log("train/aux_loss", aux.detach())
            loss = loss + aux
        out = {"loss": loss, "per_sample_loss": losses}
        if hidden is not None and "features" in needs:  # the hidden states that made the logits, same positions
            out["features"] = (hidden.float() * scored[..., None]).sum(1) / counts.clamp_min(1)[:, None]
        if stats is not None:
            out["token_stats"] = stats
        return out

    def _shared_count(self, count: Tensor) -> Tensor:
        """What this rank's CE sum is divided by, so that the data-parallel mean of the ranks' gradients is the
        gradient of the global batch's token-weighted mean: the supervised tokens of every rank over the world size
        (one all-reduce of a number; rows with more supervised tokens on one rank weigh as they would in one
        process). This rank's own count outside a distributed fit."""
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            count = count.detach().float().clone()
            torch.distributed.all_reduce(count)
            return count.clamp_min(1) / world
        return count.clamp_min(1)

    def _selection_needs(self) -> set[str]:
        """The per-sample fields a data-selection policy of this fit reads (a callback's `policy.needs`, e.g. the
        Data Agent's `features` and `logits`); empty outside a fit or without one."""
        if self._trainer is None:
            return set()
        return {key for cb in self.trainer.callbacks for key in getattr(getattr(cb, "policy", None), "needs", ())}

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        tokens, scored, _ = self.scored(batch)
        count = scored.sum()
        self.val_nll.update(tokens.sum() / count.clamp_min(1), weight=count.float())
        self.log("val/loss", self.val_nll, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        # bits per token; with byte-level data, tokens are bytes
        self.log("val/bpb", self.val_nll.compute() / math.log(2), prog_bar=True, sync_dist=True)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)
