"""The Data Agent beyond the released code (issue 18): staleness, Gumbel-top-k and centred advantages, each off by
default; the variant `data_agent_staleness` does not freeze onto one half of the data as the faithful port does."""

import pytest
import torch

from framework.samplers import DataAgentPolicy, ScoreTable, SelectionSampler
from framework.samplers.agent import PPOAgent
from framework.samplers.policies import gumbel_top_k, top_k


def repeat_share(policy: DataAgentPolicy, n: int = 200, epochs: int = 7, batch: int = 25, seed: int = 0) -> float:
    """Drive `policy` through its pruned epochs on a fixed synthetic set (4 classes, 8-d features, logits that
    sharpen over epochs) and return the mean share of each selection that was also selected the epoch before
    (from epoch 2 on, as tools/bench/selection.py measures it; uniform random selection gives ρ = 0.5)."""
    g = torch.Generator().manual_seed(seed)
    feats, y, w = torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g), torch.randn(8, 4, generator=g)
    table = ScoreTable(n, policy.initial_score)
    sampler = SelectionSampler(table, policy, epochs, seed=seed)
    previous, shares = None, []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        chosen = set(sampler.selection.tolist())
        if previous is not None and epoch > 1:
            shares.append(len(chosen & previous) / len(chosen))
        previous = chosen
        for i in range(0, sampler.selection.numel(), batch):
            idx = sampler.selection[i : i + batch]
            logits = feats[idx] @ w + 0.2 * epoch * torch.nn.functional.one_hot(y[idx], 4)
            policy.observe({"index": idx, "features": feats[idx], "logits": logits, "targets": y[idx]}, table, epoch)
        policy.end_epoch(epoch, epochs)
    return sum(shares) / len(shares)


def test_the_staleness_variant_repeats_less_of_its_selection_than_the_faithful_agent():
    kw = dict(ratio=0.5, delta=1.0, update_every=2, seed=0)
    faithful = repeat_share(DataAgentPolicy(**kw))
    stale = repeat_share(DataAgentPolicy(staleness=0.5, **kw))
    assert stale < faithful and stale <= 0.6 < faithful, (stale, faithful)


def test_staleness_brings_back_the_samples_unseen_longest():
    table = ScoreTable(6)
    table.update(torch.arange(6), torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), epoch=0)
    table.update(torch.arange(3), torch.tensor([0.9, 0.8, 0.7]), epoch=2)  # 0..2 fresh, 3..5 unseen for 2 epochs
    g = torch.Generator().manual_seed(0)
    assert sorted(DataAgentPolicy(ratio=0.5).select(table, 3, g)[0].tolist()) == [0, 1, 2]  # faithful: top-k
    picked, weights = DataAgentPolicy(ratio=0.5, staleness=2.0).select(table, 3, g)
    assert sorted(picked.tolist()) == [3, 4, 5] and torch.equal(weights, torch.full((3,), 2.0))


def test_gumbel_top_k_is_top_k_at_zero_temperature_and_otherwise_samples_in_proportion_to_the_scores():
    scores = torch.linspace(0.0, 1.0, 20, dtype=torch.float64)
    assert torch.equal(gumbel_top_k(scores, 5, 0.0, torch.Generator().manual_seed(3)),
                       top_k(scores, 5, torch.Generator().manual_seed(3)))
    counts = torch.zeros(20)
    for seed in range(300):
        pick = gumbel_top_k(scores, 5, 1.0, torch.Generator().manual_seed(seed))
        assert pick.unique().numel() == 5
        counts[pick] += 1
    assert counts[15:].sum() > 2 * counts[:5].sum() and (counts[:5] > 0).any()  # tilted, not deterministic
    again = gumbel_top_k(scores, 5, 1.0, torch.Generator().manual_seed(7))
    assert torch.equal(again, gumbel_top_k(scores, 5, 1.0, torch.Generator().manual_seed(7)))


def test_centred_advantages_give_no_push_when_every_action_did_equally_well():
    def log_prob_gain(centre: bool) -> float:
        agent = PPOAgent(4, seed=0, centre=centre, gamma=0.0, lr_actor=1e-2)  # γ = 0, V = 0: advantage = reward
        s = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        a, logp, _ = agent.act(s)
        agent.store(s, a, logp, torch.zeros(64), torch.ones(64))
        agent.update()
        with torch.no_grad():
            return float((agent.actor.dist(s).log_prob(a) - logp).mean())

    assert log_prob_gain(centre=False) > 0.01  # the uncentred advantage says "every action was good": all pushed up
    assert abs(log_prob_gain(centre=True)) < 1e-3  # centred: zero advantage, only Adam's weight decay moves it


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(staleness=float("nan"))])
def test_bad_temperature_or_staleness_names_the_value_and_what_is_valid(bad):
    (name, value), = bad.items()
    with pytest.raises(ValueError, match=rf"{name}={value} must be a finite number >= 0"):
        DataAgentPolicy(**bad)


def test_skipping_the_beta_argument_checks_leaves_the_faithful_agent_bitwise_unchanged(monkeypatch):
    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        policy, table, g = DataAgentPolicy(seed=0, update_every=2), ScoreTable(64), torch.Generator().manual_seed(0)
        for i in range(6):  # three PPO updates
            idx = torch.arange(16) + 16 * (i % 4)
            step = {"index": idx, "logits": torch.randn(16, 5, generator=g),
                    "features": torch.randn(16, 8, generator=g), "targets": torch.randint(0, 5, (16,), generator=g)}
            policy.observe(step, table, 0)
        return table.scores, [p.detach().clone() for p in policy.agent.actor.parameters()]

    fast = run()
    import framework.samplers.agent as agent_module

    checked = agent_module.Beta
    monkeypatch.setattr(agent_module, "Beta", lambda a, b, validate_args=None: checked(a, b, validate_args=True))
    slow = run()
    assert torch.equal(fast[0], slow[0]) and all(torch.equal(x, y) for x, y in zip(fast[1], slow[1], strict=True))
