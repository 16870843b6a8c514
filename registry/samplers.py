"""Data-selection policies (`sampler=data_agent`), run by the DataSelection callback that `framework.train` adds.

Partial configs: `sampler.ratio=0.3` etc. override the defaults below (the released codes' defaults: keep
ratio ρ = 0.5, full data for the last 1 − δ = 12.5% of epochs).
"""

from framework.registry import SAMPLERS
from framework.samplers import (
    AmortisedAgentPolicy,
    DataAgentPolicy,
    EpsGreedyPolicy,
    FullPolicy,
    InfoBatchPolicy,
    RandomPolicy,
    UCBPolicy,
)

SAMPLERS.register(FullPolicy, name="full", description="Every sample every epoch, weight 1 (the baseline).")
SAMPLERS.register(RandomPolicy, name="random", ratio=0.5, delta=0.875, rescale=True,
                  description="⌊ρN⌋ uniform samples per epoch, weight 1/ρ; full data after ⌊δE⌋ epochs.")
SAMPLERS.register(InfoBatchPolicy, name="infobatch", prune_ratio=0.5, delta=0.875,
                  description="InfoBatch: soft-prune below-mean-loss samples w.p. r, rescale kept by 1/(1-r).")
SAMPLERS.register(DataAgentPolicy, name="data_agent", ratio=0.5, delta=0.875, variant="faithful",
                  description="Data Agent: PPO Beta-policy scores on penultimate features, top-⌊ρN⌋ (released code).")
SAMPLERS.register(DataAgentPolicy, name="data_agent_staleness", ratio=0.5, delta=0.875, variant="faithful",
                  staleness=0.5,
                  description="Data Agent + a staleness bonus (λ per unseen epoch) so stale samples are re-scored.")
SAMPLERS.register(AmortisedAgentPolicy, name="data_agent_amortised", ratio=0.5, delta=0.875, staleness=0.5,
                  description="Data Agent acting and learning once per epoch (one batched pass), + staleness.")
SAMPLERS.register(EpsGreedyPolicy, name="eps_greedy", ratio=0.5, delta=0.875, eps=0.1,
                  description="Top (1-ε)·k by last loss plus ε·k uniform from the rest.")
SAMPLERS.register(UCBPolicy, name="ucb", ratio=0.5, delta=0.875, c=1.0,
                  description="Top-k by running mean + c·std of each sample's loss; unseen first.")
