"""Selection, annealing, cost accounting, sharding and the baseline policies."""

import math

import pytest
import torch

from framework.samplers import (
    DataAgentPolicy,
    EpsGreedyPolicy,
    FullPolicy,
    IndexedDataset,
    InfoBatchPolicy,
    RandomPolicy,
    ScoreTable,
    SelectionSampler,
    TopKPolicy,
    UCBPolicy,
    epochs_for_steps,
    nominal_cost,
    planned_batches,
    pruned_epochs,
)


def sampler(n=100, policy=None, epochs=8, **kw):
    policy = policy or TopKPolicy(ratio=0.5, delta=0.875)
    return SelectionSampler(ScoreTable(n, policy.initial_score), policy, epochs, **kw)


def test_top_k_returns_exactly_floor_rho_n_and_epochs_0_and_1_cover_the_data_disjointly():
    s = sampler(n=101)
    s.set_epoch(0)
    first = list(s)
    assert len(first) == len(set(first)) == 50  # ⌊0.5·101⌋
    s.table.update(torch.tensor(first), torch.rand(50) * 0.9, epoch=0)  # agent actions are < 1
    s.set_epoch(1)
    second = list(s)
    assert not set(first) & set(second)
    s.set_epoch(2)
    assert len(set(first) | set(second)) == 100 and len(list(s)) == 50


def test_weights_are_one_over_rho_while_pruning_and_one_after_annealing():
    s = sampler(n=40, epochs=8)  # ⌊0.875·8⌋ = 7 pruning epochs
    for epoch in range(8):
        s.set_epoch(epoch)
        chosen = torch.tensor(list(s))
        expected = 2.0 if epoch < 7 else 1.0
        assert torch.equal(s.batch_weights(chosen), torch.full((len(chosen),), expected)), epoch
        assert len(chosen) == (20 if epoch < 7 else 40)


@pytest.mark.parametrize(("epochs", "cost"), [(200, 0.5625), (20, 0.575), (16, 0.5625)])
def test_nominal_cost_is_floor_delta_e_times_rho_plus_the_full_epochs(epochs, cost):
    policy = TopKPolicy(ratio=0.5, delta=0.875)
    assert pruned_epochs(0.875, epochs) == math.floor(0.875 * epochs)
    assert nominal_cost(policy, epochs) == pytest.approx(cost)


def test_planned_batches_count_ceil_of_per_rank_shards():
    policy = RandomPolicy(ratio=0.5, delta=0.5)
    assert planned_batches(policy, 101, 4, batch_size=8, world_size=2) == [4, 4, 7, 7]  # ⌈⌈50/2⌉/8⌉, ⌈⌈101/2⌉/8⌉
    assert epochs_for_steps(policy, 101, max_steps=16, batch_size=8, world_size=2) == 3


def test_selection_is_a_function_of_seed_epoch_and_scores_only():
    a, b = sampler(seed=3), sampler(seed=3)
    for s in (a, b):
        s.table.update(torch.arange(100), torch.linspace(0, 1, 100), epoch=0)
        s.set_epoch(4)
    assert list(a) == list(b)
    c = sampler(seed=4)
    c.table.update(torch.arange(100), torch.linspace(0, 1, 100), epoch=0)
    c.set_epoch(4)
    assert sorted(list(c)) == sorted(list(a)) and list(c) != list(a)  # same top-k, another order


def test_set_epoch_twice_keeps_the_cached_selection_even_when_scores_move():
    s = sampler()
    s.set_epoch(1)
    first = list(s)
    s.table.update(torch.arange(100), torch.rand(100), epoch=1)
    s.set_epoch(1)
    assert list(s) == first


@pytest.mark.parametrize("policy", [TopKPolicy(0.5), RandomPolicy(0.3), InfoBatchPolicy(0.5), FullPolicy()])
def test_ranks_get_disjoint_equal_shards_whose_union_is_the_selection_plus_padding(policy):
    world = 3
    shards = []
    for rank in range(world):
        s = sampler(n=101, policy=policy, seed=1, rank=rank, world_size=world)
        s.table.update(torch.arange(101), torch.linspace(0.0, 6.0, 101), epoch=0)
        s.set_epoch(1)
        shards.append(list(s))
    assert len({len(x) for x in shards}) == 1
    union = [i for shard in shards for i in shard]
    kept = s.kept
    assert len(set(union)) == kept and len(union) - kept <= world - 1
    assert len(union) == math.ceil(kept / world) * world


def test_state_dict_round_trip_replays_the_same_order_and_skip_resumes_mid_shard():
    s = sampler(seed=2)
    s.table.update(torch.arange(100), torch.rand(100, generator=torch.Generator().manual_seed(0)), 0)
    s.set_epoch(3)
    order = list(s)
    t = sampler(seed=2)  # fresh table: only the cached selection can reproduce the order
    t.load_state_dict(s.state_dict())
    t.skip_samples(20)
    assert list(t) == order[20:]
    assert list(t) == order  # the skip applies once
    with pytest.raises(ValueError, match="selection seed 2, this run uses 5"):
        sampler(seed=5).load_state_dict(s.state_dict())


def test_infobatch_keeps_one_minus_r_of_below_mean_losses_with_weight_two_and_is_unbiased():
    n = 100_000
    policy = InfoBatchPolicy(prune_ratio=0.5)
    table = ScoreTable(n, policy.initial_score)
    losses = torch.distributions.Exponential(1.0).sample((n,))
    table.update(torch.arange(n), losses, epoch=0)
    index, weights = policy.select(table, 1, torch.Generator().manual_seed(0))
    assert len(index) / n == pytest.approx(1 - 0.5 * (1 - math.exp(-1)), abs=0.01)  # ≈ 0.684
    low = losses[index] < losses.mean()
    assert torch.equal(weights[low], torch.full((int(low.sum()),), 2.0))
    assert torch.equal(weights[~low], torch.ones(int((~low).sum())))
    assert float((weights * losses[index]).sum() / losses.sum()) == pytest.approx(1.0, abs=0.02)


def test_infobatch_trains_on_everything_until_losses_differ():
    s = sampler(n=50, policy=InfoBatchPolicy(0.5), epochs=10)
    s.set_epoch(0)  # all scores 3: nothing is below the mean
    assert len(list(s)) == 50 and s.pruning


def test_eps_greedy_takes_the_top_losses_plus_a_random_tenth():
    policy = EpsGreedyPolicy(ratio=0.5, eps=0.1)
    table = ScoreTable(200, policy.initial_score)
    table.update(torch.arange(200), torch.arange(200.0), 0)
    index, weights = policy.select(table, 1, torch.Generator().manual_seed(0))
    assert len(index) == len(set(index.tolist())) == 100 and torch.equal(weights, torch.full((100,), 2.0))
    assert set(range(110, 200)) <= set(index.tolist())  # the 90 highest losses
    assert (index < 110).sum() == 10


def test_ucb_prefers_unseen_then_high_mean_plus_spread():
    policy = UCBPolicy(ratio=0.25, c=1.0)
    table = ScoreTable(8)
    table.update(torch.arange(6), torch.tensor([0.1, 0.1, 5.0, 0.2, 0.2, 0.2]), 0)
    table.update(torch.tensor([3]), torch.tensor([4.0]), 1)  # sample 3: low mean, high variance
    index, _ = policy.select(table, 2, torch.Generator().manual_seed(0))
    assert set(index.tolist()) == {6, 7}  # never seen
    table.update(torch.tensor([6, 7]), torch.tensor([0.0, 0.0]), 2)
    index, _ = policy.select(table, 3, torch.Generator().manual_seed(0))
    assert set(index.tolist()) == {2, 3}


def test_random_policy_is_uniform_and_ignores_scores():
    s = sampler(n=1000, policy=RandomPolicy(0.5), epochs=100, seed=0)
    counts = torch.zeros(1000)
    for epoch in range(40):
        s.set_epoch(epoch)
        counts[list(s)] += 1
    assert counts.mean() == 20 and counts.std() < 5


def test_score_table_keeps_the_last_value_of_a_repeated_index_and_tracks_ema():
    table = ScoreTable(4, ema_momentum=0.5)
    table.update(torch.tensor([1, 1, 2]), torch.tensor([3.0, 5.0, 2.0]), epoch=0)
    assert table.scores.tolist() == [1.0, 5.0, 2.0, 1.0] and table.last_seen.tolist() == [-1, 0, 0, -1]
    table.update(torch.tensor([2]), torch.tensor([4.0]), epoch=1)
    assert table.ema_mean[2] == 3.0 and table.ema_var[2] == 1.0 and table.count.tolist() == [0, 1, 2, 0]


def test_bad_arguments_name_the_value_and_the_valid_range():
    with pytest.raises(ValueError, match=r"ratio=1.5 must lie in \(0, 1\]"):
        RandomPolicy(ratio=1.5)
    with pytest.raises(ValueError, match=r"rank=2 must lie in \[0, world_size=2\)"):
        sampler(rank=2, world_size=2)
    with pytest.raises(IndexError, match=r"\[0, 3\]"):
        ScoreTable(4).update(torch.tensor([4]), torch.tensor([1.0]), 0)


def test_indexed_dataset_turns_pairs_into_dicts_with_their_index():
    ds = IndexedDataset([(torch.zeros(2), 1), (torch.ones(2), 0)])
    item = ds[1]
    assert item["index"] == 1 and item["y"] == 0 and torch.equal(item["x"], torch.ones(2))


def test_data_agent_policy_selects_like_top_k_on_its_scores():
    policy = DataAgentPolicy(ratio=0.5)
    table = ScoreTable(10)
    table.update(torch.arange(10), torch.linspace(0.1, 0.9, 10), 0)
    index, weights = policy.select(table, 1, torch.Generator().manual_seed(0))
    assert sorted(index.tolist()) == [5, 6, 7, 8, 9] and torch.equal(weights, torch.full((5,), 2.0))
