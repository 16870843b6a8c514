"""Samplers for masked diffusion language models (MDLM ddpm / ddpm_cache, LLaDA generate)."""

from framework.diffusion.sampling import (
    ddpm_cache_sample,
    ddpm_sample,
    ddpm_update,
    generate,
    gumbel_norm,
    subs_probs,
    transfer_counts,
)

__all__ = [
    "ddpm_cache_sample",
    "ddpm_sample",
    "ddpm_update",
    "generate",
    "gumbel_norm",
    "subs_probs",
    "transfer_counts",
]
