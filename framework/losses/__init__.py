"""Losses: the MDLM NELBO and the reconstructed mask-agnostic CE + TV loss (docs/mdlm.md)."""

from framework.losses.mask_agnostic import (
    DIVERGENCES,
    MaskAgnosticLoss,
    js_from_log_probs,
    kl_from_log_probs,
    mask_agnostic_views,
    tv_distance,
)
from framework.losses.mdlm import (
    LogLinearSchedule,
    NelboBound,
    bits_per_token,
    mask_tokens,
    mdlm_nelbo,
    model_logits,
    perplexity_upper_bound,
    stratified_times,
    subs_log_probs,
)

__all__ = [
    "DIVERGENCES",
    "LogLinearSchedule",
    "MaskAgnosticLoss",
    "NelboBound",
    "bits_per_token",
    "js_from_log_probs",
    "kl_from_log_probs",
    "mask_agnostic_views",
    "mask_tokens",
    "mdlm_nelbo",
    "model_logits",
    "perplexity_upper_bound",
    "stratified_times",
    "subs_log_probs",
    "tv_distance",
]
