"""The amortised Data Agent (`data_agent_amortised`, issues 28 and 34): each step reduced to a few numbers per sample,
actions drawn and at most one PPO update per epoch, bitwise reproducible under a seed, independent of how steps and
ranks group the samples (up to the actor matmul's rounding); its memory per sample bounded; and no selection policy
touches the global torch, NumPy or Python RNGs."""

import random

import numpy as np
import pytest
import torch

from framework.registry import SAMPLERS, load_catalog
from framework.samplers import AmortisedAgentPolicy, ScoreTable, SelectionSampler
from framework.samplers.amortised import index_order

N, DIM, CLASSES = 96, 8, 4


def fields(index: torch.Tensor, epoch: int) -> dict[str, torch.Tensor]:
    """What a model would report for samples `index` in `epoch`: a function of the sample and the epoch only."""
    g = torch.Generator().manual_seed(0)
    feats, y, w = torch.randn(N, DIM, generator=g), torch.randint(0, CLASSES, (N,), generator=g), torch.randn(DIM, 4,
                                                                                                            generator=g)
    logits = feats @ w + 0.3 * epoch * torch.nn.functional.one_hot(y, CLASSES)
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    return {"index": index, "features": feats[index], "logits": logits[index], "targets": y[index],
            "losses": losses[index]}


def drive(policy, epochs: int = 6, batch: int = 16, world_size: int = 1, seed: int = 0, stop=None):
    """Run `policy` through `epochs` epochs of selection as the DataSelection callback does: select, then observe
    each (gathered) step, then end the epoch. Under `world_size` ranks a step's gathered batch is every rank's shard
    slice, rank by rank. Returns the sampler (its table and policy) and each epoch's selection (unpadded)."""
    table = ScoreTable(N, policy.initial_score)
    sampler = SelectionSampler(table, policy, epochs, seed=seed, world_size=world_size)
    selections = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        kept = policy.planned_count(N) if sampler.pruning else N
        selections.append(sampler.selection[:kept].clone())
        shards = [sampler.selection[r::world_size] for r in range(world_size)]
        for start in range(0, shards[0].numel(), batch):
            index = torch.cat([s[start : start + batch] for s in shards])
            if set(policy.needs) - {"index"}:
                policy.observe(fields(index, epoch), table, epoch)
        policy.end_epoch(epoch, epochs)
        if stop is not None and epoch == stop:
            return sampler, selections
    return sampler, selections


def actor(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.agent.actor.parameters()]


@pytest.mark.parametrize("name", ["full", "random", "infobatch", "data_agent", "data_agent_staleness",
                                  "data_agent_amortised", "eps_greedy", "ucb"])
def test_an_epoch_of_selection_leaves_the_global_torch_numpy_and_python_rngs_untouched(name):
    load_catalog()
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    before = torch.get_rng_state(), np.random.get_state(), random.getstate()
    extra = {"update_every": 2} if name in ("data_agent", "data_agent_staleness") else {}
    policy = SAMPLERS.build(name, seed=0, **extra) if "agent" in name else SAMPLERS.build(name)
    drive(policy, epochs=4)  # selections, steps, PPO updates (the agents') and epoch ends
    after = torch.get_rng_state(), np.random.get_state(), random.getstate()
    assert torch.equal(before[0], after[0])
    assert before[1][0] == after[1][0] and np.array_equal(before[1][1], after[1][1]) and before[1][2:] == after[1][2:]
    assert before[2] == after[2]


def test_the_selection_is_the_same_on_one_rank_and_on_two_and_for_any_step_size():
    one = drive(AmortisedAgentPolicy(seed=0, learn_every=1), batch=16)
    two = drive(AmortisedAgentPolicy(seed=0, learn_every=1), batch=8, world_size=2)  # gathered 2 × 8 per step
    odd = drive(AmortisedAgentPolicy(seed=0, learn_every=1), batch=7)
    for other in (two, odd):
        assert all(torch.equal(a, b) for a, b in zip(one[1], other[1], strict=True))
        # the actor acts on each step's rows: a matmul over 7 rows may round otherwise than over 16 (one ulp)
        torch.testing.assert_close(one[0].table.scores, other[0].table.scores, rtol=0, atol=1e-6)
        for a, b in zip(actor(one[0].policy), actor(other[0].policy), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_epoch_order_drops_padding_duplicates_and_orders_samples_by_index():
    steps = [{"index": torch.tensor([5, 1, 7])}, {"index": torch.tensor([3, 5])}]
    index, order = index_order(steps)
    assert index.tolist() == [1, 3, 5, 7] and order.tolist() == [1, 3, 4, 2]  # 5: its last occurrence, row 4


def test_a_step_keeps_a_few_numbers_per_sample_and_the_epoch_end_draws_and_learns_without_another_actor_pass():
    policy = AmortisedAgentPolicy(seed=0, learn_every=2, update_size=16)
    table = ScoreTable(N)
    index = torch.arange(48)
    rows: list[int] = []
    for start in range(0, 48, 16):
        assert policy.observe(fields(index[start : start + 16], 0), table, 0) == {}
        if start == 0:  # the agent is built at the first step (it does not change within an epoch)
            policy.agent.actor.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    assert rows == [16, 16] and torch.equal(table.scores, torch.ones(N))  # each step's own rows; no table change
    # a learning epoch keeps (α, β, CE, uncertainty) per sample and the features of the update's 16 samples only
    assert [r["values"].shape for r in policy.records] == [torch.Size([16, 4])] * 3
    assert policy.subsample["features"].shape == (16, DIM) and policy.subsample["index"].unique().numel() == 16
    rows.clear()
    assert "actor_loss" in policy.end_epoch(0, 10)  # epoch 0 learns (learn_every=2): the K update passes only
    assert rows == [16] * policy.ppo["k_epochs"] and policy.records == [] and policy.subsample is None
    rows.clear()
    policy.observe(fields(index, 1), table, 1)  # a non-learning epoch keeps (α, β) and no features at all
    assert [r["values"].shape for r in policy.records] == [torch.Size([48, 2])] and policy.subsample is None
    assert "actor_loss" not in policy.end_epoch(1, 10) and rows == [48]
    policy.select(table, 2, torch.Generator().manual_seed(0))
    assert (table.last_seen[:48] == 1).all() and (table.scores[:48] < 1).all()  # the drawn actions, in (0, 1)


def test_the_agent_learns_and_its_scores_move_away_from_the_frozen_agents():
    learned, frozen = AmortisedAgentPolicy(seed=0, learn_every=1), AmortisedAgentPolicy(seed=0, learn=False)
    (s_learned, _), (s_frozen, _) = drive(learned), drive(frozen)
    assert not all(torch.equal(a, b) for a, b in zip(actor(learned), actor(frozen), strict=True))
    assert not torch.equal(s_learned.table.scores, s_frozen.table.scores)


def test_nothing_is_scored_after_the_last_pruning_epoch():
    policy = AmortisedAgentPolicy(seed=0, delta=0.5)
    _, selections = drive(policy, epochs=4)
    assert [s.numel() for s in selections] == [48, 48, 96, 96]
    assert policy.pending is None and policy.agent_s > 0
    calls = []
    policy.agent.actor.register_forward_hook(lambda *a: calls.append(1))
    policy.observe(fields(torch.arange(N), 3), ScoreTable(N), 3)
    assert policy.end_epoch(3, 4) == {} and calls == [] and policy.records == []


def test_a_seed_reproduces_the_run_bitwise_and_another_seed_changes_it():
    runs = [drive(AmortisedAgentPolicy(seed=s, learn_every=1), seed=s) for s in (0, 0, 1)]
    (a, sel_a), (b, sel_b), (c, sel_c) = runs
    assert all(torch.equal(x, y) for x, y in zip(sel_a, sel_b, strict=True))
    assert torch.equal(a.table.scores, b.table.scores)
    assert all(torch.equal(x, y) for x, y in zip(actor(a.policy), actor(b.policy), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(sel_a, sel_c, strict=True))


def test_state_round_trip_mid_epoch_continues_bitwise():
    whole = drive(AmortisedAgentPolicy(seed=0, learn_every=1), epochs=6)
    first, _ = drive(AmortisedAgentPolicy(seed=0, learn_every=1), epochs=6, stop=2)
    first.set_epoch(3)
    half = first.selection[:24]
    first.policy.observe(fields(half, 3), first.table, 3)  # a checkpoint half-way through epoch 3
    state = {"policy": first.policy.state_dict(), "table": first.table.state_dict(), "sampler": first.state_dict()}
    policy = AmortisedAgentPolicy(seed=0, learn_every=1)
    policy.load_state_dict(state["policy"])
    table = ScoreTable(N)
    table.load_state_dict(state["table"])
    sampler = SelectionSampler(table, policy, 6, seed=0)
    sampler.load_state_dict(state["sampler"])
    policy.observe(fields(sampler.selection[24:48], 3), table, 3)
    policy.end_epoch(3, 6)
    for epoch in (4, 5):
        sampler.set_epoch(epoch)
        policy.observe(fields(sampler.selection, epoch), table, epoch)
        policy.end_epoch(epoch, 6)
    assert torch.equal(table.scores, whole[0].table.scores) and torch.equal(sampler.selection, whole[0].selection)
    assert all(torch.equal(x, y) for x, y in zip(actor(policy), actor(whole[0].policy), strict=True))


@pytest.mark.parametrize(("bad", "message"), [(dict(update_size=1), r"update_size=1 must be >= 2"),
                                              (dict(learn_every=0), r"learn_every=0 must be >= 1"),
                                              (dict(hidden=0), r"hidden=0 must be >= 1"),
                                              (dict(staleness=-1.0), r"staleness=-1\.0 must be a finite number")])
def test_bad_values_are_refused_naming_the_value(bad, message):
    with pytest.raises(ValueError, match=message):
        AmortisedAgentPolicy(**bad)


def test_the_update_subsample_is_the_smallest_keys_with_each_samples_last_features_for_any_grouping():
    """The features kept for the PPO update are those of the `update_size` samples with the smallest seeded keys
    among the epoch's, each from its last occurrence, whatever the steps: copied, never computed, so bitwise."""
    index = torch.tensor([5, 1, 7, 3, 5, 0, 9, 2, 8, 1])  # 5 and 1 twice: their later rows must win
    feats = torch.randn(index.numel(), DIM, generator=torch.Generator().manual_seed(1))
    kept = []
    for size in (10, 3, 1):
        policy = AmortisedAgentPolicy(seed=0, learn_every=1, update_size=4)
        for start in range(0, index.numel(), size):
            part = slice(start, start + size)
            policy.observe({**fields(index[part], 0), "features": feats[part]}, ScoreTable(N), 0)
        kept.append(policy.subsample)
    keys = policy._epoch_keys(N, 0)
    unique = index.unique()
    expected = unique[keys[unique].argsort()[:4]].sort().values
    last = {int(i): row for row, i in enumerate(index.tolist())}
    for sub in kept:
        assert torch.equal(sub["index"], expected)
        assert torch.equal(sub["features"], feats[[last[int(i)] for i in expected]])


def test_per_sample_state_is_a_few_numbers_and_the_checkpoint_holds_no_epoch_of_features():
    """What a step leaves behind is 24 bytes a sample (index, α, β, CE, uncertainty) plus the update's subsample in
    the features' own dtype, not the sample's feature and logits: a mid-epoch state dict holds no epoch of features."""
    wide = 4096
    policy = AmortisedAgentPolicy(seed=0, learn_every=1, update_size=8)
    g = torch.Generator().manual_seed(0)
    for start in range(0, 96, 16):
        step = {"index": torch.arange(start, start + 16), "features": torch.randn(16, wide, generator=g).bfloat16(),
                "logits": torch.randn(16, 1000, generator=g), "targets": torch.randint(0, 1000, (16,), generator=g)}
        policy.observe(step, ScoreTable(N), 0)
    state = policy.state_dict()
    records = sum(t.nbytes for r in state["records"] for t in r.values())
    assert records == 96 * (8 + 4 * 4)
    assert state["subsample"]["features"].shape == (8, wide)  # the update's rows only, in their own dtype
    assert state["subsample"]["features"].dtype == torch.bfloat16 and state["subsample"]["index"].numel() == 8


def test_a_mid_epoch_state_of_the_old_layout_is_refused_saying_what_to_resume_from():
    old = {**AmortisedAgentPolicy(seed=0).state_dict(), "steps": [fields(torch.arange(4), 0)]}
    with pytest.raises(ValueError, match="resume from a checkpoint written at an epoch's end"):
        AmortisedAgentPolicy(seed=0).load_state_dict(old)


def test_the_written_out_beta_log_density_is_torchs():
    from framework.samplers.amortised import beta_log_prob

    g = torch.Generator().manual_seed(0)
    alpha, beta = 1 + 3 * torch.rand(200, generator=g), 1 + 3 * torch.rand(200, generator=g)
    x = torch.rand(200, generator=g).clamp(1e-4, 1 - 1e-4)
    expected = torch.distributions.Beta(alpha, beta).log_prob(x)
    torch.testing.assert_close(beta_log_prob(x, alpha, beta), expected, rtol=1e-5, atol=1e-5)


def test_actions_are_beta_distributed_and_drawn_from_the_agents_own_generator():
    from framework.samplers.amortised import LeanPPOAgent

    agent = LeanPPOAgent(DIM, seed=3)
    alpha, beta = torch.full((40_000,), 2.0), torch.full((40_000,), 5.0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = agent.sample_beta(alpha, beta)
    assert torch.equal(torch.get_rng_state(), before)
    assert abs(float(a.mean()) - 2 / 7) < 0.005  # Beta(2, 5): mean 2/7, variance 10/392
    assert abs(float(a.var()) - 10 / 392) < 0.002
    b = LeanPPOAgent(DIM, seed=3).sample_beta(alpha, beta)
    assert torch.equal(a, b) and not torch.equal(a, agent.sample_beta(alpha, beta))  # seeded, and the stream moves on


def test_the_lean_update_is_the_released_ppo_update_on_one_batch_of_one_step_transitions():
    from framework.samplers.agent import PPOAgent
    from framework.samplers.amortised import LeanPPOAgent, beta_log_prob

    g = torch.Generator().manual_seed(1)
    states, reward = torch.randn(64, DIM, generator=g), torch.randn(64, generator=g)
    reference, lean = PPOAgent(DIM, seed=0, hidden=16, k_epochs=3), LeanPPOAgent(DIM, seed=0, hidden=16, k_epochs=3)
    with torch.no_grad():
        alpha, beta = lean.actor(states)
        actions = lean.sample_beta(alpha, beta)
        old, values = beta_log_prob(actions, alpha, beta), lean.critic(states)
    reference.store(states, actions, reference.actor.dist(states).log_prob(actions).detach(), values, reward)
    info_ref, info = reference.update(), lean.learn(states, actions, old, values, reward)
    for net in ("actor", "critic"):
        for a, b in zip(getattr(reference, net).parameters(), getattr(lean, net).parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert info == pytest.approx(info_ref, rel=1e-4)
    initial = PPOAgent(DIM, seed=0, hidden=16).actor.parameters()
    assert all(not torch.equal(a, b) for a, b in zip(lean.actor.parameters(), initial, strict=True))  # it learned
