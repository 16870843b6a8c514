"""Learning-rate schedules as `LambdaLR` factories: (optimizer, total_steps) → scheduler."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(
    optimizer: Optimizer, total_steps: int, warmup_steps: int = 100, min_lr_ratio: float = 0.1
) -> LambdaLR:
    """Linear warm-up to the base lr over `warmup_steps`, then cosine decay to `min_lr_ratio`·lr.

    Args:
        optimizer: the optimizer whose lr is scheduled; supplied by the framework at build time.
        total_steps: optimizer steps of the whole run (≥ 1); supplied by the framework from the trainer's limits.
        warmup_steps: steps of linear warm-up from lr/warmup_steps to lr; 0 starts at the base lr.
        min_lr_ratio: the final lr as a fraction of the base lr, in [0, 1]; 1 keeps the lr flat after warm-up.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps} must be ≥ 1 (set trainer.max_steps or max_epochs)")
    if warmup_steps < 0 or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"warmup_steps={warmup_steps} must be ≥ 0 and min_lr_ratio={min_lr_ratio} in [0, 1]")
    warmup = min(warmup_steps, max(total_steps - 1, 0))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def constant(optimizer: Optimizer, total_steps: int = 0) -> LambdaLR:
    """The base lr at every step.

    Args:
        optimizer: the optimizer whose lr is held; supplied by the framework at build time.
        total_steps: accepted for a uniform scheduler signature and ignored.
    """
    return LambdaLR(optimizer, lambda step: 1.0)
