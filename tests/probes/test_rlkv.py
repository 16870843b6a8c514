"""RLKV's objective pieces and the probe modules: selection counts, the adaptive penalty,
GRPO advantages, the in-place clamp, and probes that train only the gates of a frozen model."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from framework.data.pointer_chase import PointerChaseData
from framework.models.transformer import TransformerLM
from framework.probes.allocation import full_head_count, select_full_heads
from framework.probes.base import RandomHeads
from framework.probes.duo_attention import DuoAttentionProbe
from framework.probes.rlkv import (
    RLKVProbe,
    adaptive_penalty_weight,
    answer_token_mask,
    gate_penalty,
    group_advantages,
    grpo_policy_loss,
    rollout_log_probs,
)


# ---- selection -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [8, 16, 7])
@pytest.mark.parametrize("s", [0.0, 0.2, 0.25, 0.5, 0.6, 0.75, 0.875, 1.0])
def test_selection_keeps_exactly_round_one_minus_s_times_n_heads_and_the_top_gates(n, s):
    gates = torch.rand(n, generator=torch.Generator().manual_seed(n)).view(1, n)
    full = select_full_heads(gates, s)
    keep = math.floor((1 - s) * n + 0.5)
    assert full.shape == gates.shape and full.sum() == keep == full_head_count(n, s)
    if 0 < keep < n:
        assert gates[full].min() > gates[~full].max()


def test_selection_extremes_and_ties_broken_by_seeded_noise():
    gates = torch.zeros(4, 4)
    assert select_full_heads(gates, 0.0).all() and not select_full_heads(gates, 1.0).any()
    picks = {tuple(select_full_heads(gates, 0.5, seed=k).flatten().tolist()) for k in range(6)}
    assert all(sum(p) == 8 for p in picks) and len(picks) > 1  # equal gates split at random, exact count
    assert torch.equal(select_full_heads(gates, 0.5, seed=3), select_full_heads(gates, 0.5, seed=3))
    with pytest.raises(ValueError, match="sparsity=1.5"):
        select_full_heads(gates, 1.5)


# ---- the adaptive L1 penalty and advantages ---------------------------------------------------------------------
def test_adaptive_penalty_is_off_below_tau_and_e_to_the_reward_minus_one_above():
    assert adaptive_penalty_weight(0.4, tau=0.5) == 0.0
    assert adaptive_penalty_weight(0.5, tau=0.5) == 0.0  # strictly above tau
    assert adaptive_penalty_weight(0.8, tau=0.5) == pytest.approx(1.2255, abs=1e-4)
    assert adaptive_penalty_weight(1.0, tau=0.5) == pytest.approx(math.e - 1)


def test_penalty_gradient_is_c_times_beta_times_sign_over_n():
    gates = torch.tensor([[0.3, 0.9, 0.0], [1.0, 0.5, 0.2]], requires_grad=True)
    gate_penalty(gates, mean_reward=0.8, tau=0.5, scale=2e-3).backward()
    expected = 2e-3 * (math.exp(0.8) - 1) * torch.sign(gates.detach()) / gates.numel()
    assert torch.allclose(gates.grad, expected)
    assert gates.grad[0, 2] == 0  # sign(0) = 0: a closed gate feels no pull
    off = torch.ones(2, 3, requires_grad=True)
    gate_penalty(off, mean_reward=0.3, tau=0.5).backward()
    assert torch.equal(off.grad, torch.zeros(2, 3))


def test_group_advantages_are_normalised_within_consecutive_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, 4)
    first = (rewards[:4] - 0.25) / (rewards[:4].std() + 1e-4)
    assert torch.allclose(adv[:4], first)
    assert torch.equal(adv[4:], torch.zeros(4))  # a group that always succeeds teaches nothing
    with pytest.raises(ValueError, match="group_size=3"):
        group_advantages(rewards, 3)


def test_answer_token_mask_covers_tokens_up_to_and_including_the_first_eos():
    generated = torch.tensor([[5, 6, 3, 0, 0], [3, 0, 0, 0, 0], [5, 5, 5, 5, 5]])
    assert answer_token_mask(generated, eos_id=3).long().tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1] * 5]


# ---- GRPO scoring: log-prob alignment, temperature, advantage signs -------------------------------------------
class Bigram(torch.nn.Module):
    """logits[b, j] = table[seq[b, j]] + step[j]: depends on the token at j and on j, so an off-by-one shows."""

    def __init__(self, vocab: int = 9, width: int = 16, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 2)
        self.step = torch.nn.Parameter(torch.randn(width, vocab, generator=g))

    def forward(self, seq):
        return self.table[seq] + self.step[: seq.shape[1]]


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_each_sampled_token_is_scored_by_the_position_that_predicted_it_at_the_sampling_temperature(temperature):
    policy = Bigram()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    generated = torch.tensor([[7, 8, 0, 2], [3, 1, 4, 8]])
    got = rollout_log_probs(policy, prompt, generated, temperature)
    seq = torch.cat([prompt, generated], 1)
    p = prompt.shape[1]

    def by_hand(shift):  # the log-prob of generated[r, i] read from the logits at position p + i - 1 + shift
        out = torch.empty(generated.shape)
        for r in range(2):
            for i in range(generated.shape[1]):
                j = min(max(p + i - 1 + shift, 0), seq.shape[1] - 1)
                logits = policy.table[seq[r, j]] + policy.step[j]
                out[r, i] = torch.log_softmax(logits / temperature, -1)[generated[r, i]]
        return out.detach()

    torch.testing.assert_close(got.detach(), by_hand(0), rtol=0, atol=1e-6)
    for shift in (-1, 1):  # an off-by-one either way gives clearly different numbers
        assert (got.detach() - by_hand(shift)).abs().max() > 0.1
    if temperature != 1.0:
        assert (got.detach() - rollout_log_probs(policy, prompt, generated, 1.0).detach()).abs().max() > 0.1
    with pytest.raises(ValueError, match="temperature=0"):
        rollout_log_probs(policy, prompt, generated, 0.0)


def test_a_rollout_better_than_its_group_gains_log_prob_and_worse_ones_lose_it():
    policy = Bigram(vocab=12)
    prompt = torch.tensor([[0], [1], [2], [3]])  # every row has its own contexts, so rows do not interact
    generated = torch.tensor([[4, 8], [5, 9], [6, 10], [7, 11]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5])
    adv = group_advantages(rewards, 4)
    assert adv[0] > 0 and adv[3] > 0 and adv[1] < 0 and adv[2] < 0  # above / below the group mean
    before = rollout_log_probs(policy, prompt, generated).sum(1).detach()
    grpo_policy_loss(rollout_log_probs(policy, prompt, generated), adv, torch.ones(4, 2, dtype=torch.bool)).backward()
    with torch.no_grad():
        for param in policy.parameters():
            param -= 0.1 * param.grad
    change = rollout_log_probs(policy, prompt, generated).sum(1).detach() - before
    assert torch.equal(torch.sign(change), torch.sign(adv))


def test_tokens_after_eos_get_no_gradient_and_the_loss_is_the_token_mean():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    loss = grpo_policy_loss(logp, adv, mask)
    assert loss.item() == pytest.approx(-(2.0 * (-3.0) + -1.0 * (-1.5)) / 5)
    loss.backward()
    assert logp.grad[0, 2] == 0 and logp.grad[0, 0] == pytest.approx(-2.0 / 5) and logp.grad[1, 0] == pytest.approx(0.2)


def test_the_probe_scores_its_rollouts_at_its_sampling_temperature():
    data = tiny_data()
    probe = RLKVProbe(tiny_base(data), group_size=2, penalty=0.0, temperature=0.5, save_allocation=False,
                      reward=lambda generated, answer: torch.arange(generated.shape[0]).remainder(2).float())
    probe.prompt_length, probe.max_new_tokens = data.prompt_length, data.max_new_tokens
    probe.eos_id, probe.pad_id = data.eos_id, data.pad_id
    batch = data.train_set.rows[:3]
    prompt = batch[:, : data.prompt_length].repeat_interleave(2, 0)
    generated = probe.rollouts(batch[:, : data.prompt_length])
    with torch.no_grad():
        logits = probe.model(torch.cat([prompt, generated], 1), gates=probe.gates, window=probe.window)
    logits = logits[:, data.prompt_length - 1 : -1]
    logp = torch.log_softmax(logits / 0.5, -1).gather(-1, generated[..., None]).squeeze(-1)
    mask = answer_token_mask(generated, data.eos_id).float()
    adv = torch.tensor([-0.5, 0.5]).repeat(3) / (torch.tensor([0.0, 1.0]).std() + 1e-4)  # rewards 0, 1 per group
    expected = -(adv[:, None] * logp * mask).sum() / mask.sum()
    with pytest.warns(UserWarning, match="self.log"):  # no trainer attached: logging is skipped
        loss = probe.training_step(batch, 0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


# ---- the probe modules -------------------------------------------------------------------------------------------
def tiny_data(**kw) -> PointerChaseData:
    data = PointerChaseData(n_pairs=4, n_symbols=8, n_train=256, n_val=32, batch_size=8, val_batch_size=32, **kw)
    data.setup()
    return data


def tiny_base(data: PointerChaseData) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(vocab_size=data.vocab_size, dim=32, depth=2, heads=4, kv_heads=2, max_seq_len=32)


def fit(probe, data, steps: int = 3, tmp_path=None) -> L.Trainer:
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                        num_sanity_val_steps=0, default_root_dir=str(tmp_path) if tmp_path else None)
    trainer.fit(probe, datamodule=data)
    return trainer


def test_rlkv_probe_trains_only_the_gates_and_clamps_them_in_place_to_the_unit_interval(tmp_path):
    data = tiny_data()
    base = tiny_base(data)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    # a pluggable reward that always pays 1 (so the L1 is on) and a huge lr: unclamped gates would leave [0, 1]
    probe = RLKVProbe(base, optimizer=lambda ps: torch.optim.SGD([p for _, p in ps], lr=50.0), penalty=1.0,
                      group_size=2, reward=lambda generated, answer: torch.ones(generated.shape[0]))
    parameter = probe.gates
    fit(probe, data, steps=3, tmp_path=tmp_path)
    assert probe.gates is parameter  # clamped in place: the very same Parameter the optimizer holds
    assert probe.gates.min() >= 0.0 and probe.gates.max() <= 1.0 and probe.gates.min() == 0.0
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())
    assert probe.gates.shape == (2, 2)  # one gate per KV head under GQA


def test_an_out_of_place_clamp_would_leave_the_gates_outside_the_interval():
    probe = RLKVProbe(TransformerLM(vocab_size=12, dim=16, depth=1, heads=2, max_seq_len=16))
    with torch.no_grad():
        probe.gates.fill_(1.7)
    probe.gates.clamp(0, 1)  # the easy bug: returns a new tensor, changes nothing
    assert probe.gates.max().item() == pytest.approx(1.7)
    probe.clamp_gates()
    assert probe.gates.max() == 1.0


def test_duo_attention_distils_at_answer_positions_only_and_moves_the_gates(tmp_path):
    data = tiny_data(train_task="lookup")
    probe = DuoAttentionProbe(tiny_base(data), optimizer=lambda ps: torch.optim.Adam([p for _, p in ps], lr=0.05))
    probe.prompt_length, probe.pad_id = data.prompt_length, data.pad_id
    batch = data.train_set.rows[:4]
    where = probe.answer_positions(batch)
    assert where.sum(dim=1).tolist() == [2, 2, 2, 2]  # predicting f(s) and EOS in a one-hop lookup row
    fit(probe, data, steps=3, tmp_path=tmp_path)
    assert not torch.equal(probe.gates, torch.ones(2, 2))


def test_random_heads_train_nothing_and_save_their_allocation_with_the_run(tmp_path):
    data = tiny_data()
    probe = RandomHeads(tiny_base(data), seed=3)
    gates = probe.gates.detach().clone()
    trainer = fit(probe, data, steps=5, tmp_path=tmp_path)
    assert trainer.global_step == 0 and torch.equal(probe.gates, gates)
    saved = (tmp_path / "head_allocation.json").read_text()
    assert '"method": "random"' in saved


def test_pretraining_runs_only_while_the_base_holds_its_initial_weights(tmp_path):
    data = tiny_data()
    fresh = RLKVProbe(tiny_base(data), pretrain_steps=3, group_size=2, save_allocation=False)
    assert fresh.base_is_untouched()
    fit(fresh, data, steps=1, tmp_path=tmp_path)
    assert fresh.pretrained_here["pretrain_steps"] == 3 and not fresh.base_is_untouched()

    loaded = RLKVProbe(tiny_base(data), pretrain_steps=3, group_size=2, save_allocation=False)
    loaded.model.load_state_dict(fresh.model.state_dict())  # what init_from does after construction
    weights = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    fit(loaded, data, steps=1, tmp_path=tmp_path)
    assert loaded.pretrained_here == {}
    assert all(torch.equal(weights[k], v) for k, v in loaded.model.state_dict().items())
