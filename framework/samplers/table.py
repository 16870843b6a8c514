"""Per-sample scores for dynamic data selection: the last value, when it was seen, and running statistics.

Every rank keeps the whole table and feeds it the *gathered* (index, value) pairs of each step, so all ranks
hold identical tables and therefore make identical selections (InfoBatch's `concat_all_gather`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class ScoreTable:
    """Scores of `n` samples: `scores` (last value), `last_seen` (epoch, -1 if never), `count`, and an
    exponential moving mean / variance of the values (`ema_mean`, `ema_var`, momentum `ema_momentum`)."""

    def __init__(self, n: int, initial_score: float = 1.0, ema_momentum: float = 0.8):
        if n < 1:
            raise ValueError(f"a score table needs n >= 1 samples, got n={n}")
        if not 0.0 <= ema_momentum < 1.0:
            raise ValueError(f"ema_momentum={ema_momentum} must lie in [0, 1)")
        self.n, self.initial_score, self.ema_momentum = n, float(initial_score), float(ema_momentum)
        self.scores = torch.full((n,), self.initial_score, dtype=torch.float64)
        self.last_seen = torch.full((n,), -1, dtype=torch.long)
        self.count = torch.zeros(n, dtype=torch.long)
        self.ema_mean = torch.zeros(n, dtype=torch.float64)
        self.ema_var = torch.zeros(n, dtype=torch.float64)

    def update(
        self, index: Tensor, values: Tensor, epoch: int, gather: Callable[[Tensor], Tensor] | None = None
    ) -> None:
        """Record `values` for samples `index` seen in `epoch`; `gather` (e.g. an all-gather over ranks) is
        applied to both first. A sample repeated in one update keeps its last value."""
        index = index.detach().reshape(-1).long()
        values = values.detach().reshape(-1).to(torch.float64)
        if gather is not None:
            index, values = gather(index).reshape(-1).long(), gather(values).reshape(-1).to(torch.float64)
        index, values = index.cpu(), values.cpu()
        if index.numel() != values.numel():
            raise ValueError(f"{index.numel()} indices but {values.numel()} values")
        if index.numel() and (index.min() < 0 or index.max() >= self.n):
            raise IndexError(f"sample indices must lie in [0, {self.n - 1}], got {index.min()}..{index.max()}")
        index, values = _last_occurrence(index, values)
        seen = self.count[index] > 0
        old = self.ema_mean[index]
        beta = self.ema_momentum
        diff = values - old
        mean = torch.where(seen, old + (1 - beta) * diff, values)
        var = torch.where(seen, beta * (self.ema_var[index] + (1 - beta) * diff * diff), torch.zeros_like(values))
        self.scores[index] = values
        self.last_seen[index] = int(epoch)
        self.count[index] += 1
        self.ema_mean[index], self.ema_var[index] = mean, var

    def state_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "initial_score": self.initial_score,
            "ema_momentum": self.ema_momentum,
            **{k: getattr(self, k).clone() for k in ("scores", "last_seen", "count", "ema_mean", "ema_var")},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["n"]) != self.n:
            raise ValueError(f"score table of {state['n']} samples cannot be loaded into one of {self.n}")
        self.initial_score, self.ema_momentum = float(state["initial_score"]), float(state["ema_momentum"])
        for k in ("scores", "last_seen", "count", "ema_mean", "ema_var"):
            setattr(self, k, state[k].clone())

    def __len__(self) -> int:
        return self.n


def _last_occurrence(index: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Drop repeated indices, keeping each one's last value (order-independent and deterministic)."""
    uniq, inverse = torch.unique(index, return_inverse=True)
    if uniq.numel() == index.numel():
        return index, values
    pos = torch.arange(index.numel())
    last = torch.full((uniq.numel(),), -1, dtype=torch.long).scatter_reduce(0, inverse, pos, reduce="amax")
    return index[last], values[last]
