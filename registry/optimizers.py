"""Optimizers (partial: completed with the model's named parameters) and learning-rate schedules.

The hybrid optimizers (`olion`, `muon`, `ortho_momentum`) route hidden matrices to their own update and
everything else (embeddings, heads, norms, biases) to an internal AdamW, in one optimizer object. Their lr is
not AdamW's: swapping `optimizer=adamw` for `optimizer=olion` needs a larger `optimizer.lr` (BENCHMARKS.md's
optimizers section measures by how much; README's OLion section says where to start).
"""

import torch

from framework.optim import MuonAdamW, OLion
from framework.optim.peers import lion
from framework.optim.schedulers import constant, warmup_cosine
from framework.registry import OPTIMIZERS, SCHEDULERS

OPTIMIZERS.register(torch.optim.AdamW, name="adamw", lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
OPTIMIZERS.register(torch.optim.SGD, name="sgd", lr=0.1, momentum=0.9)
OPTIMIZERS.register(OLion, name="olion", lr=1e-3, weight_decay=0.1)
OPTIMIZERS.register(MuonAdamW, name="muon", lr=1e-3, weight_decay=0.1)
OPTIMIZERS.register(
    OLion, name="ortho_momentum", lr=1e-3, weight_decay=0.1, sign=False,
    description="OLion minus the sign step (ablation): Newton-Schulz momentum with RMS-matched scale.",
)
OPTIMIZERS.register(lion, name="lion", lr=3e-4, betas=(0.9, 0.99), weight_decay=0.1)

SCHEDULERS.register(warmup_cosine, name="warmup_cosine", warmup_steps=20)
SCHEDULERS.register(constant, name="constant")
