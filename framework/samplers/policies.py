"""Selection policies behind one interface: which samples train in an epoch, and with what loss weight.

A policy sees the score table and a seeded generator and returns (indices, weights); `SelectionSampler`
calls it once per pruning epoch, then anneals to full data with weight 1 after ⌊δE⌋ epochs (Data Agent and
InfoBatch both do). `observe` feeds each training step's (gathered) outputs back into the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from framework.rng import draw_device
from framework.samplers.table import ScoreTable

Step = dict[str, Tensor]


def _check_fraction(name: str, value: float, low_open: bool = True) -> float:
    value = float(value)
    if not (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name}={value} must lie in {interval}")
    return value


def pruned_epochs(delta: float, num_epochs: int) -> int:
    """⌊δE⌋: how many leading epochs prune (the released code prunes while e + 1 <= δE)."""
    return int(math.floor(delta * num_epochs + 1e-9))


def schedule_warning(policy: SelectionPolicy, num_epochs: int) -> str | None:
    """Why `policy` cannot act within a run of `num_epochs` (None if it can): it prunes the first ⌊δE⌋
    epochs, and a policy that learns from scores needs a second pruning epoch to use any."""
    if not policy.prunes(0, 1 << 30):  # a full-data policy, or delta = 0: nothing to prune by design
        return None
    k = pruned_epochs(policy.delta, num_epochs)
    learns = set(policy.needs) - {"index"}
    need = 2 if learns else 1
    if k >= need:
        return None
    at_least = next(e for e in range(1, 1 << 20) if pruned_epochs(policy.delta, e) >= need)
    name = type(policy).__name__
    what = ("never prunes: every epoch trains on full data" if k == 0 else
            "prunes only epoch 0, chosen before any score was seen (a random subset): its scores never act")
    return (f"{name} {what}. With num_epochs (max_epochs) = {num_epochs} the annealing epoch is "
            f"⌊δ·E⌋ = ⌊{policy.delta}·{num_epochs}⌋ = {k}; set max_epochs (or DataSelection(num_epochs=...)) "
            f">= {at_least}, or raise delta")


def top_k(values: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Indices of the k largest values, ties broken by a seeded random order (deterministic per generator)."""
    perm = torch.randperm(values.numel(), generator=generator, device=draw_device(generator)).to(values.device)
    order = torch.argsort(values[perm], descending=True, stable=True)
    return perm[order[:k]]


def gumbel_top_k(values: Tensor, k: int, temperature: float, generator: torch.Generator) -> Tensor:
    """k indices sampled without replacement with probability ∝ exp(z/τ), z the standardised `values`
    (Gumbel-top-k: the k largest z/τ + Gumbel noise); τ = 0 is the deterministic `top_k`."""
    if temperature == 0:
        return top_k(values, k, generator)
    z = values.double()
    z = (z - z.mean()) / z.std().clamp_min(1e-12) if z.numel() > 1 else z - z
    u = torch.rand(z.shape, generator=generator, dtype=torch.float64,
                   device=draw_device(generator, z.device)).clamp(1e-12, 1 - 1e-12).to(z.device)
    return top_k(z / temperature - torch.log(-torch.log(u)), k, generator)


class SelectionPolicy:
    """Base policy: keeps ⌊ρN⌋ samples per pruning epoch; `delta` is the fraction of epochs that prune.

    `initial_score` is what the table holds before a sample is first seen; `needs` names the step outputs
    `observe` reads (the callback gathers only these); the default records the per-sample loss.
    """

    initial_score: float = 1.0
    needs: tuple[str, ...] = ("index", "losses")

    def __init__(self, ratio: float = 0.5, delta: float = 0.875):
        self.ratio = _check_fraction("ratio", ratio)
        self.delta = _check_fraction("delta", delta, low_open=False)

    def prunes(self, epoch: int, num_epochs: int) -> bool:
        """Whether `epoch` is a pruning epoch (the first ⌊δE⌋ epochs, when ratio < 1)."""
        return self.ratio < 1.0 and epoch < pruned_epochs(self.delta, num_epochs)

    def planned_count(self, n: int) -> int:
        """Samples kept in a pruning epoch (an upper bound where the count is random)."""
        return max(1, int(math.floor(self.ratio * n)))

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def observe(self, step: Step, table: ScoreTable, epoch: int) -> dict[str, float]:
        """Record one (gathered) training step; returns scalars worth logging."""
        table.update(step["index"], step["losses"], epoch)
        return {}

    def observe_local(self, step: Step, gather: Callable[[Step], Step], table: ScoreTable, epoch: int,
                      num_epochs: int) -> dict[str, float]:
        """One training step as this rank saw it; `gather` all-gathers per-sample fields over the ranks (the identity
        on one). The default gathers every field and `observe`s the global step; a policy that needs less of each
        step overrides this to gather only that."""
        return self.observe(gather(step), table, epoch)

    def end_epoch(self, epoch: int, num_epochs: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def _rescaled(self, k: int, rescale: bool) -> Tensor:
        return torch.full((k,), 1.0 / self.ratio if rescale else 1.0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ratio={self.ratio}, delta={self.delta})"


class FullPolicy(SelectionPolicy):
    """Every sample, every epoch, weight 1: the full-data baseline run through the same machinery."""

    needs = ("index",)

    def __init__(self) -> None:
        super().__init__(ratio=1.0, delta=0.0)

    def observe(self, step: Step, table: ScoreTable, epoch: int) -> dict[str, float]:
        return {}


class RandomPolicy(SelectionPolicy):
    """⌊ρN⌋ uniform samples per epoch; weight 1/ρ when `rescale` (the same effective step as Data Agent).

    Args:
        ratio: fraction ρ of the samples kept in each pruning epoch, in (0, 1].
        delta: fraction δ of the epochs that prune, in [0, 1]; from epoch ⌊δE⌋ on, full data with weight 1.
        rescale: weight the kept samples' losses by 1/ρ, so the effective step matches full data; False: weight 1.
    """

    needs = ("index",)

    def __init__(self, ratio: float = 0.5, delta: float = 0.875, rescale: bool = True):
        super().__init__(ratio, delta)
        self.rescale = rescale

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        k = self.planned_count(table.n)
        chosen = torch.randperm(table.n, generator=generator, device=draw_device(generator))[:k]
        return chosen, self._rescaled(k, self.rescale)

    def observe(self, step: Step, table: ScoreTable, epoch: int) -> dict[str, float]:
        return {}


class TopKPolicy(SelectionPolicy):
    """The ⌊ρN⌋ highest scores (hard selection), weight 1/ρ when `rescale`: Data Agent's selection rule."""

    def __init__(self, ratio: float = 0.5, delta: float = 0.875, rescale: bool = True):
        super().__init__(ratio, delta)
        self.rescale = rescale

    def priority(self, table: ScoreTable) -> Tensor:
        return table.scores

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        k = self.planned_count(table.n)
        return top_k(self.priority(table), k, generator), self._rescaled(k, self.rescale)


class EpsGreedyPolicy(TopKPolicy):
    """Top (1-ε)·k samples by last loss plus ε·k uniform from the rest (Raju et al. 2021); unseen first.

    Args:
        ratio: fraction ρ of the samples kept in each pruning epoch, in (0, 1].
        delta: fraction δ of the epochs that prune, in [0, 1]; from epoch ⌊δE⌋ on, full data with weight 1.
        eps: fraction ε of the kept samples drawn uniformly from the rest (exploration), in [0, 1].
        rescale: weight the kept samples' losses by 1/ρ, so the effective step matches full data; False: weight 1.
    """

    initial_score = math.inf

    def __init__(self, ratio: float = 0.5, delta: float = 0.875, eps: float = 0.1, rescale: bool = True):
        super().__init__(ratio, delta, rescale)
        self.eps = _check_fraction("eps", eps, low_open=False)

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        k = self.planned_count(table.n)
        k_rand = int(round(self.eps * k))
        greedy = top_k(table.scores, k - k_rand, generator)
        rest = torch.ones(table.n, dtype=torch.bool)
        rest[greedy] = False
        pool = rest.nonzero().squeeze(1)
        explore = pool[torch.randperm(pool.numel(), generator=generator, device=draw_device(generator))[:k_rand]]
        return torch.cat([greedy, explore]), self._rescaled(k, self.rescale)


class UCBPolicy(TopKPolicy):
    """Top ⌊ρN⌋ by m + c·√v, the running mean and variance of each sample's loss; unseen samples first.
    [INFERRED from Raju et al. 2021's description; their code was not read.]

    Args:
        ratio: fraction ρ of the samples kept in each pruning epoch, in (0, 1].
        delta: fraction δ of the epochs that prune, in [0, 1]; from epoch ⌊δE⌋ on, full data with weight 1.
        c: weight of the loss's standard deviation in the bound m + c·√v, ≥ 0 (0: greedy by mean loss).
        rescale: weight the kept samples' losses by 1/ρ, so the effective step matches full data; False: weight 1.
    """

    def __init__(self, ratio: float = 0.5, delta: float = 0.875, c: float = 1.0, rescale: bool = True):
        super().__init__(ratio, delta, rescale)
        if c < 0:
            raise ValueError(f"c={c} must be >= 0")
        self.c = float(c)

    def priority(self, table: ScoreTable) -> Tensor:
        bound = table.ema_mean + self.c * table.ema_var.clamp_min(0).sqrt()
        return torch.where(table.count > 0, bound, torch.full_like(bound, math.inf))


class InfoBatchPolicy(SelectionPolicy):
    """InfoBatch (Qin et al., ICLR 2024): drop each below-mean-loss sample with probability r (exactly
    ⌊(1-r)·#low⌋ kept, as the released code), rescale the kept low-loss ones by 1/(1-r); scores start at 3.

    Args:
        prune_ratio: probability r of dropping each below-mean-loss sample, in [0, 1]; above 0.9 acts as 0.9.
        delta: fraction δ of the epochs that prune, in [0, 1]; from epoch ⌊δE⌋ on, full data with weight 1.
    """

    initial_score = 3.0

    def __init__(self, prune_ratio: float = 0.5, delta: float = 0.875):
        self.prune_ratio = _check_fraction("prune_ratio", prune_ratio, low_open=False)
        self.keep_ratio = min(1.0, max(0.1, 1.0 - self.prune_ratio))  # the released code's clamp
        super().__init__(ratio=self.keep_ratio, delta=delta)

    def planned_count(self, n: int) -> int:
        return n  # the kept count depends on the loss distribution: full data is the only safe bound

    def prunes(self, epoch: int, num_epochs: int) -> bool:
        return self.prune_ratio > 0 and epoch < pruned_epochs(self.delta, num_epochs)

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        low = table.scores < table.scores.mean()
        low_idx, high_idx = low.nonzero().squeeze(1), (~low).nonzero().squeeze(1)
        keep = int(self.keep_ratio * low_idx.numel())
        kept = low_idx[torch.randperm(low_idx.numel(), generator=generator, device=draw_device(generator))[:keep]]
        weights = torch.cat([torch.ones(high_idx.numel()), torch.full((keep,), 1.0 / self.keep_ratio)])
        return torch.cat([high_idx, kept]), weights

    def __repr__(self) -> str:
        return f"InfoBatchPolicy(prune_ratio={self.prune_ratio}, delta={self.delta})"
