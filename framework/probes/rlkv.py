"""RLKV: reinforcement learning as a probe for the heads that need a full KV cache (Du et al., ICML 2026).

Per-KV-head gates alpha ∈ [0, 1] mix full and streaming (sink + recent) attention in a frozen LM. Rollouts are
sampled from the gated policy itself, scored by a verifiable reward, and only the gates learn, by GRPO with
group-normalised advantages plus an adaptive L1 penalty that switches off while the reward is low:

    L = L_GRPO + c · β'(r̄, τ) · mean |alpha|,   β'(r̄, τ) = 1[r̄ > τ] · (e^r̄ − 1)

After every optimiser step the gates are clamped to [0, 1] in place. At inference the heads above the
sparsity quantile keep the full cache (`HeadAllocation.full_heads`). One policy update per batch of rollouts,
so the PPO ratio is 1 and the clip is inactive: the loss is the plain policy gradient (as RLKV's on-policy case).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from framework.probes.base import HeadProbe
from framework.serving.decoding import decode_uncached


def adaptive_penalty_weight(mean_reward: float, tau: float = 0.5) -> float:
    """β'(r̄, τ) = 1[r̄ > τ] · (e^r̄ − 1): the sparsity pressure, off while the policy is failing."""
    return math.expm1(float(mean_reward)) if float(mean_reward) > tau else 0.0


def gate_penalty(gates: Tensor, mean_reward: float, tau: float = 0.5, scale: float = 1.0) -> Tensor:
    """c · β'(r̄, τ) · mean |alpha|; its gradient is c · β' · sign(alpha) / n."""
    return scale * adaptive_penalty_weight(mean_reward, tau) * gates.abs().mean()


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-4) -> Tensor:
    """GRPO advantages: each reward minus its group's mean, over the group's std (+eps); groups are consecutive."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of group_size={group_size}")
    grouped = rewards.float().view(-1, group_size)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
    return ((grouped - grouped.mean(dim=1, keepdim=True)) / (std + eps)).flatten()


def answer_token_mask(generated: Tensor, eos_id: int) -> Tensor:
    """True for generated tokens up to and including each row's first EOS (what the policy actually chose)."""
    eos = (generated == eos_id).long()
    return (eos.cumsum(dim=1) - eos) == 0


def rollout_log_probs(policy: Callable[[Tensor], Tensor], prompt: Tensor, generated: Tensor,
                      temperature: float = 1.0) -> Tensor:
    """log π_T(generated[:, i] | prompt, generated[:, :i]) per token (rows, new tokens), π_T = softmax(logits / T).

    T is the temperature the rollouts were sampled at, so the scored policy is the one that sampled them. The
    logits at sequence position j predict token j + 1: generated token i (at position P + i) is scored by the
    logits at P + i − 1, and the last generated token is never an input.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 to score sampled rollouts (0 is greedy decoding)")
    seq = torch.cat([prompt, generated], dim=1)
    logits = policy(seq[:, :-1])[:, prompt.shape[1] - 1 :]
    return F.log_softmax(logits.float() / temperature, dim=-1).gather(-1, generated[..., None]).squeeze(-1)


def grpo_policy_loss(log_probs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """−Σ A_r · log π(token) over the scored tokens, over their count: on-policy GRPO (ratio 1, clip inactive).

    A rollout with a positive advantage has its tokens' log-probs pushed up by a descent step, a negative one down.
    """
    mask = mask.float()
    return -(advantages[:, None] * log_probs * mask).sum() / mask.sum().clamp(min=1)


class RLKVProbe(HeadProbe):
    """GRPO on the gates of a frozen causal LM; rollouts from the gated policy (`group_size` per prompt).

    Log-probs are scored at the rollouts' temperature.

    The options every probe shares (`sink`, `recent`, `sparsity`, `pretrain_steps`, ...) are `HeadProbe`'s.

    Args:
        model: the causal LM to probe, frozen (or a factory of one); supplied by the framework at build time.
        optimizer: factory of the gates' optimizer, from `optimizer=`; None: AdamW at lr 1e-2, no weight decay.
        scheduler: factory `(optimizer, total_steps) -> LR scheduler`, from `scheduler=`; None: a constant lr.
        group_size: rollouts sampled per prompt, ≥ 2; advantages are normalised within each group.
        penalty: c, the weight of the adaptive L1 pull on the gates, ≥ 0.
        tau: mean reward at or below which the L1 penalty is off (β' = 0).
        temperature: sampling temperature of the rollouts, > 0 (RLKV uses 1.0 for distilled models).
        seed: seed of the rollout sampling; each step draws from (seed, step).
    """

    method = "rlkv"

    def __init__(self, model: Any, optimizer: Any = None, scheduler: Any = None, group_size: int = 4,
                 penalty: float = 0.5, tau: float = 0.5, temperature: float = 1.0, seed: int = 0, **options: Any):
        super().__init__(model, optimizer, scheduler, **options)
        if group_size < 2:
            raise ValueError(f"group_size={group_size} must be >= 2 (advantages are normalised within a group)")
        if penalty < 0 or temperature <= 0:
            raise ValueError(f"penalty={penalty} must be >= 0 and temperature={temperature} > 0")
        self.group_size, self.penalty, self.tau = int(group_size), float(penalty), float(tau)
        self.temperature, self.seed = float(temperature), int(seed)

    def rollouts(self, prompt: Tensor, prompt_mask: Tensor | None = None) -> Tensor:
        """`group_size` samples per prompt from the current gated policy (no gradient); deterministic per step.
        `prompt_mask`: left-padded prompts, already repeated per sample."""
        g = torch.Generator(device=prompt.device).manual_seed(self.seed * 1_000_003 + self.global_step)
        return decode_uncached(self.model, prompt.repeat_interleave(self.group_size, 0), self.max_new_tokens,
                               gates=self.gates.detach(), window=self.window, eos_id=self.eos_id, pad_id=self.pad_id,
                               temperature=self.temperature, generator=g, prompt_mask=prompt_mask)

    def training_step(self, batch: Tensor | dict[str, Tensor], batch_idx: int) -> Tensor:
        prompt, answer, mask = self.split(batch)
        masks = None if mask is None else mask.repeat_interleave(self.group_size, 0)
        generated = self.rollouts(prompt, masks)
        rewards = self.reward(generated, answer.repeat_interleave(self.group_size, 0)).detach()
        adv = group_advantages(rewards, self.group_size)
        padded = {}
        if masks is not None:  # left-padded prompts: the scored sequence's mask (its last token is never an input)
            padded["key_padding_mask"] = torch.cat([masks, torch.ones_like(generated, dtype=torch.bool)], 1)[:, :-1]
        logp = rollout_log_probs(lambda seq: self.model(seq, gates=self.gates, window=self.window, **padded),
                                 prompt.repeat_interleave(self.group_size, 0), generated, self.temperature)
        policy = grpo_policy_loss(logp, adv, answer_token_mask(generated, self.eos_id))
        mean_reward = float(rewards.mean())
        penalty = gate_penalty(self.gates, mean_reward, self.tau, self.penalty)
        self.log("train/reward", mean_reward, prog_bar=True)
        self.log_dict({"train/penalty_weight": adaptive_penalty_weight(mean_reward, self.tau),
                       "train/gate_mean": self.gates.detach().mean(), "train/policy_loss": policy.detach()})
        return policy + penalty
