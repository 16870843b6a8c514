"""Orthogonal growth of MoE models (arXiv 2510.08008): depth by layer interposition, width by noisy expert copies.

    from framework.grow import grow
    grow(model, depth_factor=2, width_factor=2, zero_init_copies=True)   # in place; returns the parameter map

`python -m framework.grow CKPT_OR_RUN_DIR_OR_REPO --depth 2 --width 2 --out DIR` grows a checkpoint offline;
`framework.callbacks.growth.OrthogonalGrowth` grows during training.
"""

from framework.grow.ops import (
    DEFAULT_ZERO_PATTERNS,
    DEPTH_METHODS,
    Growth,
    count_params,
    depth_sources,
    find_moe_layers,
    grow,
    grow_depth,
    grow_width,
    noisy_copy,
    norm_profile,
    transfer_optimizer_state,
    zero_outputs,
)
from framework.grow.report import plot_norm_profiles

__all__ = [
    "DEFAULT_ZERO_PATTERNS", "DEPTH_METHODS", "Growth", "count_params", "depth_sources", "find_moe_layers", "grow",
    "grow_depth", "grow_width", "noisy_copy", "norm_profile", "plot_norm_profiles", "transfer_optimizer_state",
    "zero_outputs",
]
