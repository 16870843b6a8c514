"""The Data Agent's pieces against the released code's definitions."""

import math

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from framework.samplers import DataAgentPolicy, ScoreTable
from framework.samplers.agent import (
    BetaActor,
    PPOAgent,
    RewardNormalizer,
    adaptive_weight,
    batch_rank,
    composite_reward,
    difficulty,
    uncertainty,
)


def test_uniform_logits_have_uncertainty_one_and_a_confident_one_hot_almost_zero():
    assert torch.allclose(uncertainty(torch.zeros(3, 10)), torch.ones(3), atol=1e-6)
    confident = torch.zeros(2, 10)
    confident[:, 4] = 20.0
    assert (uncertainty(confident) < 1e-3).all()


def test_difficulty_clips_at_the_95th_percentile_and_normalises_to_unit_range():
    losses = torch.cat([torch.linspace(0.0, 1.0, 99), torch.tensor([50.0])])
    hard = difficulty(losses)
    assert float(hard.min()) == 0.0 and abs(float(hard.max()) - 1.0) < 1e-6
    cap = torch.quantile(losses, 0.95)
    expected = losses.clamp(max=cap) / cap
    assert torch.allclose(hard, expected, atol=1e-6)
    assert (hard == hard.max()).sum() >= 2  # the outlier is clipped to the same value as the percentile


def test_adaptive_weight_is_the_variance_ratio_and_stays_in_unit_interval():
    g = torch.Generator().manual_seed(0)
    hard, unsure = torch.rand(64, generator=g), 0.3 * torch.rand(64, generator=g)
    w = adaptive_weight(hard, unsure)
    assert math.isclose(float(w), float(hard.var() / (hard.var() + unsure.var() + 1e-8)), rel_tol=1e-6)
    assert 0.0 <= float(adaptive_weight(torch.zeros(8), torch.zeros(8))) <= 1.0
    assert float(adaptive_weight(torch.rand(8, generator=g), torch.zeros(8))) > 0.99


def test_zero_action_gives_zero_reward_and_reward_scales_with_the_action():
    g = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(32, 10, generator=g), torch.randint(0, 10, (32,), generator=g)
    zero, _ = composite_reward(logits, targets, torch.zeros(32))
    assert torch.equal(zero, torch.zeros(32))
    half, info = composite_reward(logits, targets, torch.full((32,), 0.5))
    one, _ = composite_reward(logits, targets, torch.ones(32))
    assert torch.allclose(2 * half, one) and 0.0 <= info["w"] <= 1.0


def test_normaliser_tracks_batch_means_like_batch_running_mean_std():
    norm = RewardNormalizer()
    for m in (1.0, 2.0, 3.0):
        norm.update(torch.tensor([m - 0.5, m + 0.5]))
    assert norm.mean == pytest.approx(2.0) and norm.std == pytest.approx(math.sqrt(2 / 3))
    first = RewardNormalizer()
    out = first(torch.tensor([1.0, 3.0]))  # first batch: its own mean and sample std
    assert torch.allclose(out, torch.tensor([-1.0, 1.0]) / math.sqrt(2), atol=1e-6)


def test_initial_policy_is_beta_with_mean_one_half_and_actions_inside_unit_interval():
    actor = BetaActor(512, generator=torch.Generator().manual_seed(0))
    states = torch.randn(4096, 512, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        alpha, beta = actor(states)
    assert abs(float((alpha / (alpha + beta)).mean()) - 0.5) < 0.01
    agent = PPOAgent(512, seed=0)
    actions, log_probs, _ = agent.act(states)
    assert actions.min() > 0 and actions.max() < 1 and torch.isfinite(log_probs).all()
    assert abs(float(actions.mean()) - 0.5) < 0.02


def test_action_sampling_uses_a_private_rng_and_leaves_the_global_one_alone():
    agent = PPOAgent(8, seed=3)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a1, _, _ = agent.act(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(torch.get_rng_state(), before)
    again = PPOAgent(8, seed=3)
    a2, _, _ = again.act(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(a1, a2)


@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_learns_to_rank_high_utility_states_higher_in_a_contextual_bandit(seed):
    # a toy task: 8-d states, utility 1[s_0 > 0], reward a·u, batch 128, 300 steps = 30 PPO updates
    g = torch.Generator().manual_seed(seed)
    agent = PPOAgent(8, seed=seed)
    for _ in range(300):
        s = torch.randn(128, 8, generator=g)
        a, log_prob, value = agent.act(s)
        agent.store(s, a, log_prob, value, a * (s[:, 0] > 0).float())
        if len(agent) >= 10:
            agent.update()
    s = torch.randn(4000, 8, generator=g)
    with torch.no_grad():
        alpha, beta = agent.actor(s)
    auc = float(binary_auroc(alpha / (alpha + beta), (s[:, 0] > 0).long()))
    assert auc >= 0.75, auc


def test_gae_runs_over_the_sequence_of_batches_aligned_by_position():
    agent = PPOAgent(2, seed=0, gamma=0.5, gae_lambda=1.0)
    s = torch.zeros(3, 2)
    for r, v in ((1.0, 0.0), (2.0, 0.0)):
        agent.store(s, torch.full((3,), 0.5), torch.zeros(3), torch.full((3,), v), torch.full((3,), r))
    # A_1 = r_1 + γ·0 − V_1 = 2;  A_0 = r_0 + γV_1 − V_0 + γλA_1 = 1 + 0.5·2 = 2
    assert torch.allclose(agent.advantages(), torch.full((6,), 2.0))


def test_policy_scores_are_the_agent_actions_and_only_trained_samples_are_rescored():
    policy, table = DataAgentPolicy(seed=0, update_every=2), ScoreTable(20)
    g = torch.Generator().manual_seed(0)
    step = {"index": torch.arange(8), "logits": torch.randn(8, 10, generator=g),
            "targets": torch.randint(0, 10, (8,), generator=g), "features": torch.randn(8, 16, generator=g)}
    policy.observe(step, table, epoch=0)
    assert (table.scores[:8] < 1).all() and (table.scores[:8] > 0).all()
    assert torch.equal(table.scores[8:], torch.ones(12, dtype=torch.float64))  # stale until selected
    before = [p.clone() for p in policy.agent.actor.parameters()]
    policy.observe(step, table, epoch=0)  # second batch: a PPO update (update_every=2)
    assert len(policy.agent) == 0
    assert any(not torch.equal(b, p) for b, p in zip(before, policy.agent.actor.parameters(), strict=True))


def test_agent_state_round_trips_with_rng_buffer_and_optimisers():
    policy, table = DataAgentPolicy(seed=0), ScoreTable(10)
    step = {"index": torch.arange(4), "logits": torch.randn(4, 3), "targets": torch.tensor([0, 1, 2, 0]),
            "features": torch.randn(4, 5)}
    policy.observe(step, table, 0)
    clone = DataAgentPolicy(seed=0)
    clone.load_state_dict(policy.state_dict())
    a, b = ScoreTable(10), ScoreTable(10)
    policy.observe(step, a, 0)
    clone.observe(step, b, 0)
    assert torch.equal(a.scores, b.scores)
    assert clone.normalizer.state_dict() == policy.normalizer.state_dict()


def test_bad_variant_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid: 'faithful', 'ranked'"):
        DataAgentPolicy(variant="improved")


def test_ranked_variant_scores_by_rank_within_the_batch():
    assert batch_rank(torch.tensor([0.9, 0.1, 0.5, 0.7])).tolist() == [1.0, 0.25, 0.5, 0.75]
    policy, table = DataAgentPolicy(seed=0, variant="ranked"), ScoreTable(8)
    step = {"index": torch.arange(8), "logits": torch.randn(8, 3), "targets": torch.zeros(8, dtype=torch.long),
            "features": torch.randn(8, 5)}
    policy.observe(step, table, 0)
    assert sorted(table.scores.tolist()) == [i / 8 for i in range(1, 9)]
