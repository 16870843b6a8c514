"""Masked diffusion LM training (MDLM: SUBS, log-linear schedule, 1/t NELBO) with an optional extra loss.

The extra loss (e.g. the mask-agnostic loss) switches on at `extra_loss_after` steps, so one run can
pretrain and then fine-tune; or the run starts from a pretrained model (`init_from=...` on the CLI).
Evaluation uses EMA weights when `ema_decay > 0` (MDLM's default practice). `lora_rank > 0` fine-tunes
PEFT's LoRA adapters only (`framework.models.peft_adapters`; the same as `peft=lora` with `peft.r=lora_rank`,
`peft.alpha=lora_alpha`, `peft.target_modules=lora_targets`, no dropout), added in `setup`, i.e. after `init_from`
weights are loaded.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import Tensor, nn

from framework.losses.mask_agnostic import follow_mask_convention
from framework.losses.mdlm import LogLinearSchedule, NelboBound, mdlm_nelbo
from framework.models.documents import document_ids
from framework.modules.base import TrainModule
from framework.rng import draw_device
from framework.strategies import reshard


def user_rows(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """The dict batch of user text as MDLM reads it: (tokens, real tokens, prompt, position ids). Real: padded rows'
    `attention_mask`; in packed rows every document with a supervised token, which leaves out the padding that ends
    a row (all -100; so does a one-token piece of a split document). Prompt: the real tokens with label -100 (a chat
    row's prompt, a text document's first token), kept clean in the `sft_fraction` rows."""
    tokens, labels, positions = batch["input_ids"], batch.get("labels"), batch.get("position_ids")
    real = batch.get("attention_mask")
    if real is not None:
        real = real.bool()
    elif positions is not None and labels is not None:
        doc = document_ids(positions)
        supervised = torch.zeros(doc.shape[0], doc.shape[1] + 1, dtype=torch.long, device=doc.device)
        real = supervised.scatter_add_(1, doc, (labels != -100).long()).gather(1, doc) > 0
    prompt = None if labels is None else (labels == -100) if real is None else (labels == -100) & real
    return tokens, real, prompt, positions


def user_prompts(batch: dict[str, Tensor], target_len: int, pad_id: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """An extra loss's (prompt, target, prompt lengths, target mask) from user rows: each row's prompt is the leading
    run of its tokens with label -100 (a chat row's prompt; a text document's first token), at least one token; its
    targets the `target_len` tokens right after, scored where they are supervised and in the prompt's document."""
    tokens, labels, positions = batch["input_ids"], batch.get("labels"), batch.get("position_ids")
    t = tokens.shape[1]
    unsupervised = torch.zeros_like(tokens, dtype=torch.bool) if labels is None else labels == -100
    lengths = unsupervised.long().cumprod(1).sum(1).clamp(1, t - 1)
    width = int(lengths.max())
    prompt = tokens[:, :width].masked_fill(torch.arange(width, device=tokens.device) >= lengths[:, None], pad_id)
    at = lengths[:, None] + torch.arange(target_len, device=tokens.device)
    index = at.clamp(max=t - 1)
    scored = (at < t) & ~unsupervised.gather(1, index)
    if batch.get("attention_mask") is not None:
        scored = scored & batch["attention_mask"].bool().gather(1, index)
    if positions is not None:
        doc = document_ids(positions)
        scored = scored & (doc.gather(1, index) == doc[:, :1])
    return prompt, tokens.gather(1, index), lengths, scored


class MDLMModule(TrainModule):
    """Trains a bidirectional tokens→logits model as a masked diffusion LM (docs/mdlm.md), plus `extra_loss`.

    Batches are dicts with `tokens` and optionally `attention_mask` (True = real token) and `prompt_mask`
    (True = prompt), or the dict batch of user text (`input_ids`, `labels`, `position_ids` or `attention_mask`;
    `user_rows`): only real tokens are masked and scored, a packed row's documents attend only within themselves.
    A fraction `sft_fraction` of rows keeps its prompt clean (LLaDA SFT masking); validation reports the NELBO bound
    of every token, or of the response given the prompt when `sft_fraction=1`. With `extra_loss` (a callable
    `(model, prompt, target, prompt_lengths) -> (loss, stats)`, such as `MaskAgnosticLoss`; on user rows it also
    gets `target_mask=`, `user_prompts`), the `target_len` tokens right after each prompt are its targets. The model
    gets key-padding masks as True = real token, unless the extra loss says otherwise (`mask_true_means="padding"`,
    PyTorch's convention): then the NELBO's masks are inverted for it too. An MoE model's balance loss is added in
    training.

    Args:
        model: the network to train, or a factory given the data's sizes; supplied by the framework at build time.
        optimizer: factory `(named_parameters) -> Optimizer`, from `optimizer=`; None: AdamW at lr 1e-3.
        scheduler: factory `(optimizer, total_steps) -> LR scheduler`, from `scheduler=`; None: a constant lr.
        vocab_size: the data's vocabulary size, handed to a model factory; supplied from the data at build time.
        mask_id: token id of [MASK]; None appends one after the data's vocabulary (id `vocab_size`, vocabulary + 1).
        sampling_eps: ε of the log-linear noise schedule: at t = 1 a token stays unmasked with probability ε.
        sft_fraction: fraction of rows, in [0, 1], that keep their prompt unmasked (LLaDA SFT masking).
        ema_decay: decay of an EMA copy of the weights used to evaluate and sample, in [0, 1); 0: no EMA.
        extra_loss: a loss `(model, prompt, target, prompt_lengths) -> (loss, stats)` added to the NELBO; None: none.
        extra_loss_weight: multiplier of `extra_loss` in the training loss.
        extra_loss_after: global step from which `extra_loss` is added; before it only the NELBO trains.
        mdlm_weight: multiplier of the NELBO in the training loss; 0 trains on the extra loss alone.
        target_len: tokens right after each prompt that are the extra loss's targets (≥ 1).
        reduction: training NELBO average: "tokens" (over all real tokens, MDLM) or "response" (per row, LLaDA SFT).
        lora_rank: rank of LoRA adapters added to the model before training; 0: full fine-tuning.
        lora_alpha: LoRA scale numerator (adapters scaled by alpha / rank); used only when `lora_rank` > 0.
        lora_targets: names of the layers that get LoRA adapters when `lora_rank` > 0.
    """

    def __init__(
        self,
        model: nn.Module | Any,
        optimizer: Any = None,
        scheduler: Any = None,
        vocab_size: int | None = None,
        mask_id: int | None = None,
        sampling_eps: float = 1e-3,
        sft_fraction: float = 0.0,
        ema_decay: float = 0.0,
        extra_loss: nn.Module | None = None,
        extra_loss_weight: float = 1.0,
        extra_loss_after: int = 0,
        mdlm_weight: float = 1.0,
        target_len: int = 1,
        reduction: str = "tokens",
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        lora_targets: tuple[str, ...] = ("q", "kv", "proj", "fc"),
    ):
        if mask_id is None:  # no [MASK] in the data's vocabulary: append one (MDLM's convention)
            mask_id, vocab_size = vocab_size, (vocab_size + 1 if vocab_size else None)
        super().__init__(model, optimizer, scheduler, **({"vocab_size": vocab_size} if vocab_size else {}))
        if not 0.0 <= sft_fraction <= 1.0:
            raise ValueError(f"sft_fraction={sft_fraction} must be in [0, 1]")
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay={ema_decay} must be in [0, 1) (0 turns EMA off)")
        if extra_loss_after < 0 or target_len < 1:
            raise ValueError(f"extra_loss_after={extra_loss_after} must be >= 0 and target_len={target_len} >= 1")
        if lora_rank < 0:
            raise ValueError(f"lora_rank={lora_rank} must be >= 0 (0 = full fine-tuning)")
        self.lora_rank, self.lora_alpha, self.lora_targets, self._prepared = lora_rank, lora_alpha, lora_targets, False
        if reduction not in ("tokens", "response"):
            raise ValueError(f"reduction={reduction!r} is invalid; valid: tokens (MDLM), response (LLaDA SFT)")
        self.reduction = reduction
        self.mask_id, self.schedule = mask_id, LogLinearSchedule(sampling_eps)
        self.sampling_eps, self.sft_fraction = sampling_eps, sft_fraction
        self.extra_loss, self.extra_loss_weight = extra_loss, extra_loss_weight
        self.extra_loss_after, self.mdlm_weight, self.target_len = extra_loss_after, mdlm_weight, target_len
        self.ema_decay = ema_decay
        self.ema = copy.deepcopy(self.model).requires_grad_(False) if ema_decay > 0 else None
        self.val_bound = NelboBound()
        self.noise_seed = torch.initial_seed()  # set by seed_everything; masks are drawn from (seed, step, rank)

    def setup(self, stage: str) -> None:
        """Once, before any step (and before a resumed checkpoint is restored): add LoRA adapters when
        `lora_rank > 0`, and start the EMA copy from the weights as they are now (e.g. loaded by `init_from`)."""
        if self._prepared:
            return
        self._prepared = True
        from framework.models.peft_adapters import LoRA, attach, peft_spec

        if self.lora_rank > 0 and peft_spec(self.model) is None:  # `peft=lora` may have attached them already
            attach(self.model, LoRA(r=self.lora_rank, alpha=self.lora_alpha, dropout=0.0,
                                    target_modules=list(self.lora_targets)))
        if self.ema is not None:
            self.ema = copy.deepcopy(self.model).requires_grad_(False)

    def _noise(self) -> torch.Generator:
        """The step's own random stream, so a resumed run draws the same times and masks as an unbroken one."""
        rank = self.trainer.global_rank if self._trainer is not None else 0
        seed = (self.noise_seed * 1_000_003 + self.global_step * 7_919 + rank) % (2**63)
        return torch.Generator(device=self.device).manual_seed(seed)

    def sharded_modules(self) -> list[nn.Module]:
        """The model and its EMA copy: under FSDP2 both are sharded alike, so the EMA update stays shard-local."""
        return [self.model] + ([self.ema] if self.ema is not None else [])

    @property
    def eval_model(self) -> nn.Module:
        """The weights to evaluate and sample with: the EMA copy when there is one."""
        return self.ema if self.ema is not None else self.model

    @staticmethod
    def _unpack(batch: Tensor | dict[str, Tensor]) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """(tokens, attention mask (True = real token), prompt mask (True = prompt), position ids (packed rows))."""
        if isinstance(batch, dict) and "input_ids" in batch:
            return user_rows(batch)
        if isinstance(batch, dict):
            return batch["tokens"], batch.get("attention_mask"), batch.get("prompt_mask"), None
        return batch, None, None, None

    def _mdlm_loss(
        self, model: nn.Module, batch: Any, train: bool, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        tokens, attention, prompt, positions = self._unpack(batch)
        if positions is not None:  # packed rows: the model keeps attention inside each document
            model = functools.partial(model, position_ids=positions)
        if prompt is not None and train and self.sft_fraction < 1.0:
            keep = (torch.rand(tokens.shape[0], 1, device=draw_device(generator, tokens.device), generator=generator)
                    < self.sft_fraction).to(tokens.device)
            prompt = prompt & keep
        elif prompt is not None and not train and self.sft_fraction < 1.0:
            prompt = None  # validation: the unconditional NELBO bound over every token
        # (sft_fraction=1: a purely prompt-conditional model; validation bounds the response given the prompt)
        model = follow_mask_convention(model, getattr(self.extra_loss, "mask_true_means", "real"))
        return mdlm_nelbo(
            model, tokens, self.mask_id, self.schedule,
            attention_mask=attention, prompt_mask=prompt, sampling_eps=self.sampling_eps, generator=generator,
            reduction=self.reduction if train else "tokens",
        )

    def _extra(self, batch: Any, generator: torch.Generator | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        if isinstance(batch, dict) and "input_ids" in batch:
            prompt, target, lengths, scored = user_prompts(batch, self.target_len, self.extra_loss.pad_id)
            return self.extra_loss(self.model, prompt, target, lengths, target_mask=scored, generator=generator)
        tokens, _, prompt_mask, _ = self._unpack(batch)
        if prompt_mask is None:
            raise ValueError("extra_loss needs batches with a `prompt_mask` to find the prompt and its targets")
        lengths = prompt_mask.sum(1)
        width = int(lengths.max())
        prompt = tokens[:, :width].masked_fill(~prompt_mask[:, :width], self.extra_loss.pad_id)
        index = lengths[:, None] + torch.arange(self.target_len, device=tokens.device)[None]
        target = tokens.gather(1, index)
        return self.extra_loss(self.model, prompt, target, lengths, generator=generator)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        noise = self._noise()
        loss, stats = self._mdlm_loss(self.model, batch, train=True, generator=noise)
        self.log("train/nelbo", loss, prog_bar=True)
        loss = self.mdlm_weight * loss
        if self.extra_loss is not None and self.global_step >= self.extra_loss_after:
            extra, extra_stats = self._extra(batch, generator=noise)
            loss = loss + self.extra_loss_weight * extra
            self.log("train/extra_loss", extra)
            for key in ("ce_k1", "ce_k2", "tv"):
                if key in extra_stats:
                    self.log(f"train/{key}", extra_stats[key])
        aux = self.pop_model_aux_loss()  # e.g. an MoE's balance loss, from every forward of this step
        if aux is not None:
            self.log("train/aux_loss", aux.detach())
            loss = loss + aux
        self.log("train/loss", loss)
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        # EMA moves right after the weights do, before any callback (e.g. a checkpoint) sees the step
        super().optimizer_step(*args, **kwargs)
        self.update_ema()

    def update_ema(self) -> None:
        """ema ← decay·ema + (1−decay)·weights."""
        if self.ema is not None:
            if self.device_mesh is not None:  # FSDP2 keeps a root's weights gathered after an evaluation forward
                reshard(self.ema)
            with torch.no_grad():
                for e, p in zip(self.ema.parameters(), self.model.parameters(), strict=True):
                    e.lerp_(p, 1.0 - self.ema_decay)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        # a fixed stream per batch: the NELBO bound of the same weights is the same number every time
        noise = torch.Generator(device=self.device).manual_seed(1_000_003 + batch_idx)
        _, stats = self._mdlm_loss(self.eval_model, batch, train=False, generator=noise)
        self.val_bound.update(stats["nll_sum"], stats["tokens"])

    def on_validation_epoch_end(self) -> None:
        bound = self.val_bound.compute()
        self.log("val/nelbo", bound["nll_bound"], prog_bar=True, sync_dist=True)
        self.log("val/bpt_bound", bound["bpt_bound"], sync_dist=True)
        self.val_bound.reset()

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self.on_validation_epoch_end()
