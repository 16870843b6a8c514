"""What every head-allocation probe shares: a frozen causal LM, one gate per KV head, evaluation with the real
mixed KV cache at several sparsities, the in-place clamp, and the allocation written with the run.

A probe needs a *trained* base. With `init_from=RUN_DIR_OR_REPO` the loaded model is probed as it is; without
it, `pretrain_steps` teacher-forcing steps first train the base from the datamodule's `pretrain_dataloader()`
(only while the base still holds the random weights it was built with, so a loaded model is never altered).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_type_hints

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor, nn
from torchmetrics import MeanMetric

from framework.errors import InputError
from framework.modules.base import TrainModule
from framework.modules.data_spec import DataSpec
from framework.probes.allocation import HeadAllocation, gate_shape, select_full_heads
from framework.probes.prompts import split_prompts
from framework.probes.rewards import exact_match
from framework.serving.attention import check_window
from framework.serving.decoding import decode, decode_uncached

#: The `DataSpec` facts every probe needs, passed in or read from the datamodule in `setup`.
DATA_FACTS = ("prompt_length", "max_new_tokens", "eos_id", "pad_id")


def _fingerprint(model: nn.Module) -> Tensor:
    """Per-parameter (sum, sum of squares): changes when weights are loaded or trained."""
    with torch.no_grad():
        return torch.stack([torch.stack([p.double().sum(), p.double().square().sum()]) for p in model.parameters()])


@torch.no_grad()
def accuracy_at(model: nn.Module, prompt: Tensor, answer: Tensor, full_heads: Tensor | None, window: tuple[int, int],
                eos_id: int, pad_id: int, reward: Callable[[Tensor, Tensor], Tensor] = exact_match,
                prompt_mask: Tensor | None = None) -> Tensor:
    """Per-row reward of greedy decoding with the mixed KV cache (`full_heads` None: the standard cache);
    `prompt_mask`: left-padded prompts (`framework.probes.prompts`)."""
    out = decode(model, prompt, answer.shape[1], full_heads, window, eos_id=eos_id, pad_id=pad_id,
                 prompt_mask=prompt_mask)
    return reward(out, answer)


def inherit_options(cls: type) -> None:
    """Give `cls.__init__(self, ..., **options)` the full signature: its own parameters, then the parent's options
    (keyword-only, with their defaults and resolved type hints). A subclass without `**options` is left alone."""
    init = cls.__dict__.get("__init__")
    if init is None:
        return
    own = list(inspect.signature(init).parameters.values())
    if not own or own[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        return
    parent_init = cls.__mro__[1].__init__
    hints = {**get_type_hints(parent_init), **get_type_hints(init)}
    names = {p.name for p in own}
    inherited = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                 for p in list(inspect.signature(parent_init).parameters.values())[1:]
                 if p.name not in names and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in own[:-1] + inherited]
    init.__signature__ = inspect.Signature(params, return_annotation=None)
    init.__annotations__ = {p.name: hints[p.name] for p in params if p.name in hints} | {"return": None}


class HeadProbe(TrainModule):
    """A frozen causal LM (`self.model`) plus gates (depth, kv_heads) in [0, 1]; subclasses write `training_step`.

    Validation logs `val/acc_full` (standard cache), `val/acc_s{s}` for each of `eval_sparsities` (hard
    allocation by the gates, real mixed cache, greedy) and `val/acc_soft` (the soft-gated model). The
    allocation is saved as `head_allocation.json` in the trainer's root dir at the end of fit.

    The options below (`sink`, `sparsity`, `pretrain_steps`, ...) are written once, here. A subclass lists only
    its own and takes the rest as `**options`; `__init_subclass__` gives its `__init__` the full signature, so
    hydra-zen's `populate_full_signature` still makes every key overridable and checked (`module.sink=2`).

    Args:
        model: the causal LM to probe, frozen (or a factory of one); supplied by the framework at build time.
        optimizer: factory of the gates' optimizer, from `optimizer=`; None: AdamW at lr 1e-2, no weight decay.
        scheduler: factory `(optimizer, total_steps) -> LR scheduler`, from `scheduler=`; None: a constant lr.
        vocab_size: the data's vocabulary size, handed to a model factory; supplied from the data at build time.
        sink: first tokens every compressed (streaming) head keeps attending to, ≥ 0.
        recent: most recent tokens a compressed head attends to (its sliding window), ≥ 1.
        init_gate: starting value of every gate, in [0, 1] (1: every head fully attends).
        sparsity: fraction of KV heads compressed in the saved allocation and the progress-bar accuracy, in [0, 1].
        eval_sparsities: sparsities at which validation decodes with the real mixed cache (`val/acc_s{s}`).
        reward: `(generated, answer) -> per-row reward` scoring decoded answers; default exact match.
        pretrain_steps: teacher-forcing steps that first train a still-random base; 0: probe the base as it is.
        pretrain_lr: peak AdamW lr of that base pretraining (warm-up, then cosine).
        pretrain_batch_size: batch size of the base pretraining, from the data's `pretrain_dataloader`.
        prompt_length: prompt tokens per row; None: taken from the data.
        max_new_tokens: answer tokens decoded per prompt; None: taken from the data.
        eos_id: token id that ends an answer; None: taken from the data.
        pad_id: token id of padding; None: taken from the data.
        save_allocation: write `head_allocation.json` to the run dir at the end of fit.
    """

    method = "gates"
    #: the user's prompt/completion rows (`data=chat`) come as prompt batches (`framework.probes.prompts`)
    reads_prompts = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        inherit_options(cls)

    def __init__(self, model: nn.Module | Callable[..., nn.Module], optimizer: Any = None, scheduler: Any = None,
                 vocab_size: int | None = None, sink: int = 1, recent: int = 4, init_gate: float = 1.0,
                 sparsity: float = 0.5, eval_sparsities: Sequence[float] = (0.25, 0.5, 0.75),
                 reward: Callable[[Tensor, Tensor], Tensor] = exact_match, pretrain_steps: int = 0,
                 pretrain_lr: float = 1e-3, pretrain_batch_size: int = 64, prompt_length: int | None = None,
                 max_new_tokens: int | None = None, eos_id: int | None = None, pad_id: int | None = None,
                 save_allocation: bool = True):
        super().__init__(model, optimizer, scheduler, **({"vocab_size": vocab_size} if vocab_size else {}))
        shape = gate_shape(self.model)
        self.window = check_window((sink, recent))
        if not 0.0 <= init_gate <= 1.0:
            raise ValueError(f"init_gate={init_gate} must lie in [0, 1]")
        if pretrain_steps < 0:
            raise ValueError(f"pretrain_steps={pretrain_steps} must be >= 0")
        self.eval_sparsities = [float(s) for s in eval_sparsities]
        for s in [sparsity, *self.eval_sparsities]:
            if not 0.0 <= s <= 1.0:
                raise ValueError(f"sparsity {s} must lie in [0, 1] (the fraction of KV heads compressed)")
        self.sparsity, self.reward, self.init_gate = float(sparsity), reward, float(init_gate)
        self.pretrain_steps, self.pretrain_lr = int(pretrain_steps), float(pretrain_lr)
        self.pretrain_batch_size = int(pretrain_batch_size)
        self.prompt_length, self.max_new_tokens = prompt_length, max_new_tokens
        self.eos_id, self.pad_id = eos_id, pad_id
        self.save_allocation = save_allocation
        self.gates = nn.Parameter(torch.full(shape, float(init_gate)))
        self.model.requires_grad_(False)
        self.register_buffer("_init_fingerprint", _fingerprint(self.model), persistent=False)
        self.val_full, self.val_soft = MeanMetric(), MeanMetric()
        self.val_acc = nn.ModuleList(MeanMetric() for _ in self.eval_sparsities)
        self.pretrained_here: dict[str, float] = {}

    # -- wiring ---------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Take what the data knows (its `DataSpec`: prompt length, answer length, EOS/PAD ids) unless passed in."""
        data = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        spec = DataSpec.of(data)
        for name in DATA_FACTS:
            if getattr(self, name) is None:
                setattr(self, name, getattr(spec, name))
        prompts = bool(getattr(data, "serves_prompts", lambda: False)())  # prompt batches: no fixed prompt length
        missing = [n for n in DATA_FACTS[1 if prompts else 0:] if getattr(self, n) is None]
        if missing:
            raise ValueError(f"{type(self).__name__} needs {', '.join(missing)}: pass them, or use a datamodule that"
                             " has them (e.g. pointer_chase)")
        ends = (getattr(data, "prompt_counts", None) or {}).get("end_ids", []) if prompts else []
        if ends and ends != [self.eos_id]:
            hint = f"set module.eos_id={ends[0]}" if len(ends) == 1 else \
                "give every completion the same end token (a tokenizer with an EOS, or a chat template's end of turn)"
            raise InputError(f"{type(self).__name__} stops decoding at eos_id={self.eos_id} and matches the completion "
                             f"through its end token, but the completions end with id(s) "
                             f"{', '.join(map(str, ends[:5]))}; {hint}")

    def optimized_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Only the gates train; the base model stays frozen."""
        return [("gates", self.gates)]

    @staticmethod
    def default_optimizer(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        self.clamp_gates()

    def clamp_gates(self) -> None:
        """Project the gates back onto [0, 1] in place (an out-of-place `clamp` would silently do nothing)."""
        with torch.no_grad():
            self.gates.clamp_(0.0, 1.0)

    def split(self, batch: Tensor | dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor | None]:
        """(prompt, answer, prompt mask or None: prompts of one length) of a batch (`split_prompts`)."""
        return split_prompts(batch, self.prompt_length)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.model.eval()  # the base is frozen: no dropout while probing

    # -- pretraining the base when none was loaded ------------------------------------------------------------
    def base_is_untouched(self) -> bool:
        """True while the base holds exactly the random weights it was built with (no init_from, no checkpoint, not
        a model loaded by name: a Hugging Face model's `loaded_weights`)."""
        if getattr(self.model, "loaded_weights", False):
            return False
        now = _fingerprint(self.model).to(self._init_fingerprint.device)
        return now.shape == self._init_fingerprint.shape and bool(torch.equal(now, self._init_fingerprint))

    def on_fit_start(self) -> None:
        self.model.requires_grad_(False)  # adapters an `init_from=` attached (PEFT marks them trainable) stay as loaded
        if self.pretrain_steps and self.base_is_untouched():
            data = self.trainer.datamodule
            if not hasattr(data, "pretrain_dataloader"):
                raise ValueError(f"pretrain_steps={self.pretrain_steps} needs a datamodule with pretrain_dataloader()"
                                 f" (e.g. pointer_chase), not {type(data).__name__}; or load a trained base with"
                                 " init_from=... and set pretrain_steps=0")
            self.pretrain_base(data.pretrain_dataloader(self.pretrain_batch_size), self.pretrain_steps)

    def pretrain_base(self, loader: Any, steps: int) -> dict[str, float]:
        """Teacher-force the base on the answer tokens for `steps` batches (AdamW, warm-up + cosine)."""
        model = self.model
        params = list(model.parameters())
        model.requires_grad_(True)
        model.train()
        opt = torch.optim.AdamW(params, lr=self.pretrain_lr, betas=(0.9, 0.98), weight_decay=0.0)
        warm = min(100, max(1, steps // 20))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
        done, loss = 0, torch.tensor(float("nan"))
        with torch.enable_grad():
            while done < steps:
                for batch in loader:
                    batch = batch.to(self.device)
                    start = self.prompt_length - 1  # score the answers only, like causal_lm's prompt_length
                    logits = model(batch[:, :-1])[:, start:]
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1 + start :].flatten())
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    sched.step()
                    done += 1
                    if done >= steps:
                        break
        model.requires_grad_(False)
        self.pretrained_here = {"pretrain_steps": float(steps), "pretrain_loss": float(loss.detach())}
        return self.pretrained_here

    # -- evaluation -------------------------------------------------------------------------------------------
    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self.model.eval()
        prompt, answer, mask = self.split(batch)
        args = (self.window, self.eos_id, self.pad_id, self.reward, mask)
        self.val_full.update(accuracy_at(self.model, prompt, answer, None, *args))
        for s, metric in zip(self.eval_sparsities, self.val_acc, strict=True):
            metric.update(accuracy_at(self.model, prompt, answer, select_full_heads(self.gates, s), *args))
        soft = decode_uncached(self.model, prompt, answer.shape[1], gates=self.gates.detach(), window=self.window,
                               eos_id=self.eos_id, pad_id=self.pad_id, prompt_mask=mask)
        self.val_soft.update(self.reward(soft, answer))
        self.log("val/acc_full", self.val_full)
        self.log("val/acc_soft", self.val_soft)
        for s, metric in zip(self.eval_sparsities, self.val_acc, strict=True):
            self.log(f"val/acc_s{s:g}", metric, prog_bar=s == self.sparsity)
        self.log("val/gate_mean", self.gates.detach().mean())

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    # -- the artefact -----------------------------------------------------------------------------------------
    def allocation(self, metrics: dict[str, float] | None = None) -> HeadAllocation:
        """The learned gates as a shareable `HeadAllocation` (with the base model's registry-free config)."""
        model = {"config": dict(getattr(self.model, "init_config", {}))}
        return HeadAllocation.from_gates(self.gates, *self.window, sparsity=self.sparsity, method=self.method,
                                         model=model, metrics=dict(metrics or {}))

    @rank_zero_only
    def on_fit_end(self) -> None:
        if not self.save_allocation:
            return
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items()
                   if k.startswith("val/acc") and torch.as_tensor(v).numel() == 1}
        self.allocation(metrics).save(Path(self.trainer.default_root_dir))


class RandomHeads(HeadProbe):
    """The random-allocation baseline: gates ~ U(0, 1) from `seed`, so every sparsity compresses a random head set.

    Nothing is trained: fit stops before the first step (after pretraining the base if asked), and validation
    reports the accuracy of that random allocation.

    The options every probe shares (`sink`, `recent`, `sparsity`, `pretrain_steps`, ...) are `HeadProbe`'s.

    Args:
        model: the causal LM to probe, frozen (or a factory of one); supplied by the framework at build time.
        optimizer: ignored: nothing is trained.
        scheduler: ignored, as `optimizer`.
        seed: seed of the random gates, so one seed gives one random head ranking.
    """

    method = "random"

    def __init__(self, model: Any, optimizer: Any = None, scheduler: Any = None, seed: int = 0, **options: Any):
        super().__init__(model, optimizer, scheduler, **options)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            self.gates.copy_(torch.rand(self.gates.shape, generator=g, device=g.device))
        self.gates.requires_grad_(False)

    def configure_optimizers(self) -> Any:
        return None

    def on_train_start(self) -> None:
        self.trainer.should_stop = True

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        return None
