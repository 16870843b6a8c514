"""Optimizers (partial: completed with the model's named parameters) and learning-rate schedules."""

import torch

from framework.optim.schedulers import constant, warmup_cosine
from framework.registry import OPTIMIZERS, SCHEDULERS

OPTIMIZERS.register(torch.optim.AdamW, name="adamw", lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
OPTIMIZERS.register(torch.optim.SGD, name="sgd", lr=0.1, momentum=0.9)

SCHEDULERS.register(warmup_cosine, name="warmup_cosine", warmup_steps=20)
SCHEDULERS.register(constant, name="constant")
