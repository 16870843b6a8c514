"""Dynamic data selection: a score table, one DDP-correct `SelectionSampler`, and policies behind one interface
(full, random, InfoBatch, Data Agent and its amortised variant, ε-greedy, UCB).
`framework.callbacks.selection.DataSelection` wires them into any Lightning fit."""

from framework.samplers.agent import DataAgentPolicy, PPOAgent, RewardNormalizer, composite_reward
from framework.samplers.amortised import AmortisedAgentPolicy
from framework.samplers.policies import (
    EpsGreedyPolicy,
    FullPolicy,
    InfoBatchPolicy,
    RandomPolicy,
    SelectionPolicy,
    TopKPolicy,
    UCBPolicy,
    pruned_epochs,
)
from framework.samplers.selection import (
    IndexedDataset,
    SelectionSampler,
    epoch_sizes,
    epochs_for_steps,
    nominal_cost,
    planned_batches,
)
from framework.samplers.table import ScoreTable

__all__ = [
    "AmortisedAgentPolicy", "DataAgentPolicy", "EpsGreedyPolicy", "FullPolicy", "IndexedDataset", "InfoBatchPolicy",
    "PPOAgent", "RandomPolicy", "RewardNormalizer", "ScoreTable", "SelectionPolicy", "SelectionSampler", "TopKPolicy",
    "UCBPolicy", "composite_reward", "epoch_sizes", "epochs_for_steps", "nominal_cost", "planned_batches",
    "pruned_epochs",
]
