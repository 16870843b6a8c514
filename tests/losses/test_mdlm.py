"""MDLM baseline: schedule, SUBS, the NELBO and its bounds (docs/mdlm.md)."""

import math

import pytest
import torch

from framework.losses.mdlm import (
    LogLinearSchedule,
    NelboBound,
    bits_per_token,
    mask_tokens,
    mdlm_nelbo,
    perplexity_upper_bound,
    stratified_times,
    subs_log_probs,
)
from framework.models.transformer import TransformerLM

torch.set_num_threads(1)


class ZeroLogits(torch.nn.Module):
    """A uniform predictor: logits 0 over `vocab` ids, whatever the input."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, x, key_padding_mask=None):
        return torch.zeros(*x.shape, self.vocab)


def test_log_linear_schedule_matches_mdlm_values_in_float64():
    s = LogLinearSchedule(eps=1e-3)
    t = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    assert torch.allclose(s.move_chance(t), torch.tensor([0.0999, 0.4995, 0.8991], dtype=torch.float64),
                          rtol=0, atol=1e-9)
    assert torch.allclose(s.weight(t), torch.tensor([10.0, 2.0, 1 / 0.9], dtype=torch.float64), rtol=0, atol=1e-9)
    assert torch.allclose(s.alpha(t), torch.exp(-s.sigma(t)), rtol=0, atol=1e-12)
    assert torch.allclose(1 - s.alpha(t), s.move_chance(t), rtol=0, atol=1e-12)


def test_dsigma_is_the_derivative_of_sigma_and_the_weight_is_one_over_t():
    s = LogLinearSchedule()
    t = torch.linspace(1e-3, 1.0, 101, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(s.sigma(t).sum(), t)
    assert torch.allclose(grad, s.dsigma(t.detach()), rtol=1e-10)
    assert torch.allclose(s.weight(t.detach()), 1 / t.detach(), rtol=1e-9)


def test_subs_log_probs_are_normalised_never_predict_mask_and_copy_unmasked_tokens():
    g = torch.Generator().manual_seed(0)
    vocab, mask_id = 11, 10
    logits = 5 * torch.randn(3, 9, vocab, generator=g)
    x = torch.randint(0, 10, (3, 9), generator=g)
    xt = mask_tokens(x, 0.5, mask_id, generator=g)
    out = subs_log_probs(logits, xt, mask_id)
    assert (xt == mask_id).any() and (xt != mask_id).any()
    assert torch.allclose(torch.logsumexp(out, -1), torch.zeros(3, 9), atol=1e-5)
    assert (out[..., mask_id].exp() == 0).all()
    clean = xt != mask_id
    assert (out.gather(-1, xt.unsqueeze(-1)).squeeze(-1)[clean] == 0).all()
    others = out.clone().scatter_(-1, xt.unsqueeze(-1), -1e9)
    assert (others[clean] <= -1e5).all()
    masked = ~clean  # at masked positions SUBS is the softmax of the logits without the MASK entry
    expected = torch.log_softmax(logits[..., :mask_id], -1)
    assert torch.allclose(out[masked][:, :mask_id], expected[masked], atol=1e-5)


def test_subs_gives_zero_probability_to_never_predict_ids():
    logits = torch.zeros(2, 4, 6)
    logits[..., 0] = 50.0  # the model loves id 0 (PAD), which must never be predicted
    out = subs_log_probs(logits, torch.full((2, 4), 5), mask_id=5, never_predict=(0,))
    assert (out[..., 0].exp() == 0).all()
    assert torch.allclose(out[..., 1:5].exp(), torch.full((2, 4, 4), 0.25))


def test_nelbo_is_exactly_zero_when_nothing_is_masked():
    model = TransformerLM(12, dim=16, depth=1, heads=2, causal=False)
    x = torch.randint(0, 11, (4, 10))
    everything_prompt = torch.ones_like(x, dtype=torch.bool)
    loss, stats = mdlm_nelbo(model, x, 11, LogLinearSchedule(), prompt_mask=everything_prompt, t=torch.tensor(0.9))
    assert loss.item() == 0.0 and stats["masked_fraction"].item() == 0.0


def test_nelbo_is_the_one_over_t_weighted_masked_ce_over_all_real_tokens():
    vocab, mask_id = 101, 100
    x = torch.randint(0, 100, (6, 20), generator=torch.Generator().manual_seed(1))
    real = torch.ones_like(x, dtype=torch.bool)
    real[:, 15:] = False  # padding: never masked, not in the denominator
    t = torch.linspace(0.2, 0.9, 6)
    loss, stats = mdlm_nelbo(ZeroLogits(vocab), x, mask_id, LogLinearSchedule(), attention_mask=real, t=t,
                             generator=torch.Generator().manual_seed(2))
    # a uniform predictor over the 100 non-mask ids costs ln(100) per masked token, 0 elsewhere
    masked_per_row = torch.tensor(stats["masked_fraction"].item() * real.sum().item())
    assert abs(masked_per_row - round(masked_per_row.item())) < 1e-3
    g = torch.Generator().manual_seed(2)  # replay the same masks
    xt = mask_tokens(x, LogLinearSchedule().move_chance(t)[:, None], mask_id, g, real)
    expected = ((xt == mask_id).sum(-1) / t * math.log(100)).sum() / real.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert not (xt[:, 15:] == mask_id).any()


def test_uniform_predictor_nelbo_is_one_minus_eps_times_log_v():
    # E[loss] = E_t[(1/t) (1-eps) t ln V] = (1-eps) ln V; per-token variance ln(V)^2 (ln(1/eps) - (1-eps)^2)
    # (rows share t, but E[loss | t] is constant, so only the masking noise counts); accept 3 sigma
    def mc(vocab, batch, length, repeats, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.zeros(batch, length, dtype=torch.long)
        runs = [mdlm_nelbo(ZeroLogits(vocab + 1), x, vocab, LogLinearSchedule(), generator=g) for _ in range(repeats)]
        sigma = math.log(vocab) * math.sqrt((math.log(1e3) - 0.999**2) / (batch * length * repeats))
        return sum(loss.item() for loss, _ in runs) / repeats, sigma, runs[0][1]

    value, sigma, stats = mc(50257, 8, 64, 1, seed=0)  # V = 50257 content ids (+ MASK): expect 10.814
    assert 0.999 * math.log(50257) == pytest.approx(10.814, abs=1e-3)
    assert stats["masked_ce"].item() == pytest.approx(math.log(50257), abs=1e-4)
    assert abs(value - 10.814) < 3 * sigma, (value, sigma)
    value, sigma, _ = mc(50, 1024, 64, 8, seed=1)  # a small vocabulary allows a tight check
    assert sigma < 0.015 and abs(value - 0.999 * math.log(50)) < 3 * sigma, (value, sigma)


def test_stratified_times_put_one_sample_in_each_stratum():
    eps = 1e-3
    for seed in range(20):
        t = stratified_times(8, eps, generator=torch.Generator().manual_seed(seed)).double()
        lo = eps + (1 - eps) * torch.arange(8, dtype=torch.float64) / 8
        hi = eps + (1 - eps) * torch.arange(1, 9, dtype=torch.float64) / 8
        s = t.sort().values
        assert ((s >= lo - 1e-6) & (s < hi + 1e-6)).all(), s


def test_mask_tokens_masks_each_maskable_token_at_the_move_chance():
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(200, 100, dtype=torch.long)
    maskable = torch.ones_like(x, dtype=torch.bool)
    maskable[:, :10] = False
    xt = mask_tokens(x, 0.3, 7, generator=g, maskable=maskable)
    assert not (xt[:, :10] == 7).any()
    n = maskable.sum().item()
    z = ((xt == 7).sum().item() - 0.3 * n) / math.sqrt(n * 0.3 * 0.7)
    assert abs(z) < 3


def test_prompt_tokens_stay_clean_and_response_reduction_divides_by_response_length():
    vocab, mask_id = 21, 20
    x = torch.randint(0, 20, (4, 12))
    prompt = torch.zeros_like(x, dtype=torch.bool)
    prompt[:, :5] = True
    seen = []

    class Spy(ZeroLogits):
        def forward(self, xt, key_padding_mask=None):
            seen.append(xt)
            return super().forward(xt)

    t = torch.full((4,), 0.99)
    tok, _ = mdlm_nelbo(Spy(vocab), x, mask_id, LogLinearSchedule(), prompt_mask=prompt, t=t,
                        generator=torch.Generator().manual_seed(0))
    resp, _ = mdlm_nelbo(Spy(vocab), x, mask_id, LogLinearSchedule(), prompt_mask=prompt, t=t,
                         generator=torch.Generator().manual_seed(0), reduction="response")
    assert not (seen[0][:, :5] == mask_id).any()
    assert torch.equal(seen[0], seen[1])
    assert resp.item() == pytest.approx(tok.item() * 12 / 7, rel=1e-6)  # 12 real tokens, 7 in the response
    with pytest.raises(ValueError, match="unknown reduction 'mean'; valid: tokens, response"):
        mdlm_nelbo(Spy(vocab), x, mask_id, LogLinearSchedule(), reduction="mean")


def test_perplexity_bound_is_exp_of_summed_nll_over_tokens_and_bpd_is_nll_over_ln2():
    metric = NelboBound()
    metric.update(torch.tensor(30.0), torch.tensor(10))
    metric.update(torch.tensor(12.0), torch.tensor(20))
    out = metric.compute()
    assert out["nll_bound"].item() == pytest.approx(42 / 30)
    assert out["ppl_bound"].item() == pytest.approx(math.exp(42 / 30))
    assert out["bpt_bound"].item() == pytest.approx(42 / 30 / math.log(2))
    assert perplexity_upper_bound(42.0, 30).item() == pytest.approx(math.exp(42 / 30))
    assert bits_per_token(math.log(2)).item() == pytest.approx(1.0)


def test_initial_perplexity_bound_of_a_uniform_predictor_is_about_v():
    vocab = 64
    g = torch.Generator().manual_seed(0)
    metric = NelboBound()
    for _ in range(20):
        _, stats = mdlm_nelbo(ZeroLogits(vocab + 1), torch.zeros(64, 32, dtype=torch.long), vocab,
                              LogLinearSchedule(), generator=g)
        metric.update(stats["nll_sum"], stats["tokens"])
    assert metric.compute()["ppl_bound"].item() == pytest.approx(vocab ** 0.999, rel=0.05)


def test_schedule_rejects_eps_outside_unit_interval():
    with pytest.raises(ValueError, match=r"eps=1.5 must be in \[0, 1\)"):
        LogLinearSchedule(1.5)
