"""Peer optimizers from other packages, imported only when built (so the catalog loads without them)."""

from __future__ import annotations

from typing import Any

import torch


def lion(
    params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """Lion (Chen et al. 2023) from lucidrains' `lion-pytorch`, the reference peer for OLion.

    Args:
        params: parameters or parameter groups to optimise; supplied by the framework at build time.
        lr: step size of the sign update; must be > 0 (Lion wants roughly 3-10x less than AdamW).
        betas: (β1, β2), each in [0, 1): β1 mixes gradient and momentum for the update, β2 is the momentum EMA decay.
        weight_decay: decoupled weight decay, multiplied by `lr`; 0 turns it off.
    """
    try:
        from lion_pytorch import Lion
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("optimizer 'lion' needs lion-pytorch, a dependency of framework: "
                          "pip install lion-pytorch") from err
    if not lr > 0:
        raise ValueError(f"lr={lr} is invalid: must be > 0")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas={tuple(betas)} is invalid: need two values, each in [0, 1)")
    if weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay} is invalid: must be >= 0")
    return Lion(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
