"""The Data Agent's reward (the released code's `compute_reward` and `normalization.py`): r = a·(w·l + (1−w)·u)
for difficulty l (clipped, min-max normalised label-smoothed CE) and uncertainty u (normalised entropy), with the
tuning-free weight w = Var(l)/(Var(l)+Var(u)), then normalised by running statistics of batch means."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def difficulty(losses: Tensor, quantile: float = 0.95) -> Tensor:
    """Loss-based difficulty: clip above at the batch `quantile`, min-max normalise to [0, 1]."""
    clipped = losses.clamp(max=torch.quantile(losses, quantile))
    lo, hi = clipped.min(), clipped.max()
    return (clipped - lo) / (hi - lo + 1e-8)


def uncertainty(logits: Tensor) -> Tensor:
    """Confidence-based uncertainty: predictive entropy / log C, in [0, 1] (the code's log(p + 1e-8))."""
    p = logits.float().softmax(-1)
    return -(p * torch.log(p + 1e-8)).sum(-1) / math.log(logits.shape[-1])


def adaptive_weight(hard: Tensor, unsure: Tensor, eps: float = 1e-8) -> Tensor:
    """The tuning-free weight w = Var(l) / (Var(l) + Var(u) + ε), clamped to [0, 1] (unbiased variances), for
    difficulty l = `hard` and uncertainty u = `unsure`."""
    vl, vu = hard.var(), unsure.var()
    return (vl / (vl + vu + eps)).clamp(0.0, 1.0)


def composite_reward(
    logits: Tensor, targets: Tensor, actions: Tensor, label_smoothing: float = 0.1
) -> tuple[Tensor, dict[str, float]]:
    """r_i = a_i·(w·l_i + (1−w)·u_i), before normalisation; also returns w and the two variances."""
    losses = F.cross_entropy(logits.float(), targets.long(), reduction="none", label_smoothing=label_smoothing)
    return reward_from(losses, uncertainty(logits), actions)


def sample_pieces(step: dict[str, Tensor], label_smoothing: float = 0.1) -> tuple[Tensor, Tensor]:
    """Each sample's label-smoothed CE and uncertainty: from a classifier's `logits` and `targets`, or from a sequence
    model's per-row `token_stats` (the means over each row's supervised tokens of the token's CE, its CE against the
    uniform distribution and its uncertainty; `framework.modules.causal_lm.token_stats`): label smoothing is linear in
    the first two, so (1 − ε)·CE + ε·uniform is the row's mean label-smoothed CE exactly."""
    stats = step.get("token_stats")
    if stats is not None:
        nll, uniform, unsure = stats.float().unbind(-1)
        return (1 - label_smoothing) * nll + label_smoothing * uniform, unsure
    logits = step["logits"].detach()
    losses = F.cross_entropy(logits.float(), step["targets"].to(logits.device).long(), reduction="none",
                             label_smoothing=label_smoothing)
    return losses, uncertainty(logits)


def reward_from(losses: Tensor, unsure: Tensor, actions: Tensor) -> tuple[Tensor, dict[str, float]]:
    """`composite_reward` from each sample's label-smoothed CE and uncertainty, computed earlier (per sample, so any
    grouping of the samples gives the same values)."""
    hard = difficulty(losses)
    w = adaptive_weight(hard, unsure)
    reward = actions * (w * hard + (1 - w) * unsure)
    return reward, {"w": float(w), "var_l": float(hard.var()), "var_u": float(unsure.var())}


class RewardNormalizer:
    """`batch_RunningMeanStd` + `batch_Normalization`: running mean and (population) std of *batch means*;
    the first batch sets mean = its mean and std = its own sample std, as the released code does."""

    def __init__(self) -> None:
        self.n, self.mean, self.S, self.std = 0, 0.0, 0.0, 0.0

    def update(self, x: Tensor) -> None:
        m = float(x.mean())
        self.n += 1
        if self.n == 1:
            self.mean, self.std = m, float(x.std()) if x.numel() > 1 else 0.0
        else:
            old = self.mean
            self.mean = old + (m - old) / self.n
            self.S += (m - old) * (m - self.mean)
            self.std = math.sqrt(self.S / self.n)

    def __call__(self, x: Tensor, update: bool = True) -> Tensor:
        if update:
            self.update(x)
        return (x - self.mean) / (self.std + 1e-8)

    def state_dict(self) -> dict[str, float]:
        return {"n": self.n, "mean": self.mean, "S": self.S, "std": self.std}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.n, self.mean, self.S, self.std = int(state["n"]), state["mean"], state["S"], state["std"]
