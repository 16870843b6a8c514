"""Losses (partial: the framework fills `mask_id` / `pad_id` from the data).

The three mask-agnostic variants are the arms of the needle comparison (docs/mdlm.md): the same two views and CE
composition, with and without the alignment term. `loss=null` trains with the plain MDLM loss only.
"""

from framework.losses.mask_agnostic import MaskAgnosticLoss
from framework.registry import LOSSES

LOSSES.register(
    MaskAgnosticLoss, name="mask_agnostic", lam=1.0, k1=0, k_max=16, divergence="tv", stopgrad_anchor=True,
    ce_views="both", description="CE on a few-mask and a many-mask view + λ·TV between them (reconstruction).",
)
LOSSES.register(
    MaskAgnosticLoss, name="ce_many", lam=0.0, k1=0, k_max=16, ce_views="many",
    description="Ablation: CE on the many-mask view only (augmentation with appended masks, no alignment).",
)
LOSSES.register(
    MaskAgnosticLoss, name="ce_both", lam=0.0, k1=0, k_max=16, ce_views="both",
    description="Ablation: ½[CE(k1) + CE(k2)] without the alignment term (equal CE to mask_agnostic).",
)
