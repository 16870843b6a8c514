"""Mask-agnostic loss, a reconstruction (docs/mdlm.md)."""

import pytest
import torch
import torch.nn.functional as F

from framework.losses.mask_agnostic import (
    MaskAgnosticLoss,
    js_from_log_probs,
    kl_from_log_probs,
    mask_agnostic_views,
    tv_distance,
)
from framework.models.transformer import TransformerLM

torch.set_num_threads(1)

PAD, MASK, VOCAB = 0, 1, 14


def tiny_model(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(VOCAB, dim=32, depth=2, heads=4, causal=False, max_seq_len=128).eval()


def batch(b: int = 4, p: int = 7, n: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (b, p), generator=g), torch.randint(2, VOCAB, (b, n), generator=g)


class HideAppendedMasks(torch.nn.Module):
    """The invariance oracle: positions from `keep` on (the appended masks) are removed from attention."""

    def __init__(self, model: torch.nn.Module, keep: int):
        super().__init__()
        self.model, self.keep = model, keep

    def forward(self, x, key_padding_mask=None):
        visible = torch.arange(x.shape[1])[None] < self.keep
        kpm = visible if key_padding_mask is None else key_padding_mask & visible
        return self.model(x, key_padding_mask=kpm.expand(x.shape[0], -1))


class Recorder(torch.nn.Module):
    """Wraps a model and keeps every (tokens, key_padding_mask, logits) it saw."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []

    def forward(self, x, key_padding_mask=None):
        out = self.model(x) if key_padding_mask is None else self.model(x, key_padding_mask=key_padding_mask)
        if out.requires_grad:
            out.retain_grad()
        self.calls.append((x, key_padding_mask, out))
        return out


def plain_ce(model, prompt, target, k):
    """CE of the targets in [prompt, MASK^n, MASK^k] with MASK and PAD excluded from the softmax."""
    b, p = prompt.shape
    n = target.shape[1]
    x = torch.cat([prompt, torch.full((b, n + k), MASK)], 1)
    logits = model(x)[:, p : p + n].clone()
    logits[..., [MASK, PAD]] = float("-inf")
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def test_tv_is_zero_on_equal_one_on_disjoint_symmetric_and_bounded():
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(50, 9, generator=g).softmax(-1), torch.randn(50, 9, generator=g).softmax(-1)
    assert torch.equal(tv_distance(p, p), torch.zeros(50))
    eye = torch.eye(9)
    assert torch.equal(tv_distance(eye[2], eye[5]), torch.tensor(1.0))
    assert torch.equal(tv_distance(p, q), tv_distance(q, p))
    assert ((tv_distance(p, q) > 0) & (tv_distance(p, q) <= 1)).all()


def test_tv_passes_gradcheck_away_from_ties():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    q = (p.detach() + 0.05 + 0.1 * torch.rand(3, 6, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(tv_distance, (p, q))


def test_kl_and_js_vanish_on_equal_distributions_and_js_is_symmetric_and_at_most_ln2():
    g = torch.Generator().manual_seed(0)
    lp, lq = torch.randn(20, 9, generator=g).log_softmax(-1), torch.randn(20, 9, generator=g).log_softmax(-1)
    assert torch.allclose(kl_from_log_probs(lp, lp), torch.zeros(20), atol=1e-6)
    assert (kl_from_log_probs(lp, lq) > 0).all()
    assert torch.allclose(js_from_log_probs(lp, lq), js_from_log_probs(lq, lp), atol=1e-6)
    eye = torch.eye(9).clamp_min(1e-30).log()
    assert js_from_log_probs(eye[0], eye[1]).item() == pytest.approx(torch.log(torch.tensor(2.0)).item(), rel=1e-5)


def test_lambda_zero_with_k1_equal_k2_reduces_to_plain_ce():
    model, (prompt, target) = tiny_model(), batch()
    loss_fn = MaskAgnosticLoss(MASK, PAD, lam=0.0, k1=3, k_max=8)
    loss, stats = loss_fn(model, prompt, target, k2=3)
    expected = plain_ce(model, prompt, target, 3)
    assert abs(loss.item() - expected.item()) < 1e-6
    assert abs(stats["ce_k1"].item() - stats["ce_k2"].item()) < 1e-6 and stats["tv"].item() < 1e-6


@pytest.mark.parametrize("divergence", ["tv", "kl", "js"])
def test_invariance_oracle_gives_zero_divergence_and_loss_equal_to_ce(divergence):
    prompt, target = batch()
    oracle = HideAppendedMasks(tiny_model(), keep=prompt.shape[1] + target.shape[1])
    loss_fn = MaskAgnosticLoss(MASK, PAD, lam=1.0, k1=0, k_max=32, divergence=divergence, k_sampling="per_example")
    loss, stats = loss_fn(oracle, prompt, target, generator=torch.Generator().manual_seed(0))
    assert stats["tv"].item() < 1e-6 and stats[divergence].item() < 1e-6
    assert abs(loss.item() - plain_ce(oracle, prompt, target, 0).item()) < 1e-6


def test_a_plain_bidirectional_model_is_distracted_by_appended_masks():
    model, (prompt, target) = tiny_model(), batch()
    _, stats = MaskAgnosticLoss(MASK, PAD, k1=0, k_max=32)(model, prompt, target, k2=32)
    assert stats["tv"].item() > 1e-4  # the oracle test above could fail


def test_appended_masks_never_shift_prompt_or_target_positions():
    prompt, _ = batch(p=7)
    lengths = torch.tensor([7, 5, 3, 7])
    few, kpm_few, at_few = mask_agnostic_views(prompt, 2, torch.zeros(4, dtype=torch.long), MASK, PAD, lengths)
    many, kpm_many, at_many = mask_agnostic_views(prompt, 2, torch.full((4,), 32), MASK, PAD, lengths)
    assert torch.equal(at_few, at_many) and torch.equal(at_few, lengths[:, None] + torch.arange(2))
    assert torch.equal(many[:, : few.shape[1]][kpm_few], few[kpm_few])
    assert (many.gather(1, at_many) == MASK).all() and kpm_many.sum(1).tolist() == (lengths + 34).tolist()


def test_the_loss_reads_targets_at_their_absolute_positions():
    class PositionEcho(torch.nn.Module):  # predicts token 2 + (position mod 12) with certainty
        def forward(self, x, key_padding_mask=None):
            return 50.0 * F.one_hot(2 + torch.arange(x.shape[1]) % 12, VOCAB).float().expand(x.shape[0], -1, -1)

    prompt, _ = batch(p=7, n=3)
    target = (2 + torch.arange(7, 10) % 12).expand(4, -1)
    loss, stats = MaskAgnosticLoss(MASK, PAD, k1=0, k_max=32)(PositionEcho(), prompt, target, k2=32)
    assert stats["ce_k1"].item() < 1e-6 and stats["ce_k2"].item() < 1e-6 and loss.item() < 1e-6


def test_per_example_tails_are_right_padded_and_padding_is_hidden_from_attention():
    rec = Recorder(tiny_model())
    prompt, target = batch(b=6)
    MaskAgnosticLoss(MASK, PAD, k1=1, k_max=16, k_sampling="per_example")(
        rec, prompt, target, generator=torch.Generator().manual_seed(3))
    x, kpm, _ = rec.calls[0]
    assert kpm is not None and x.shape[0] == 12
    real = kpm.sum(1)
    assert (real[:6] == 7 + 2 + 1).all() and ((real[6:] >= 7 + 2 + 2) & (real[6:] <= 7 + 2 + 16)).all()
    assert (x[~kpm] == PAD).all() and (x[kpm][:, None] != PAD).all()


def test_pad_and_mask_are_never_predicted():
    class LovesPadAndMask(torch.nn.Module):
        def forward(self, x, key_padding_mask=None):
            logits = torch.zeros(*x.shape, VOCAB)
            logits[..., [PAD, MASK]] = 100.0
            return logits

    prompt, target = batch()
    loss, stats = MaskAgnosticLoss(MASK, PAD, lam=0.0)(LovesPadAndMask(), prompt, target, k2=4)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(VOCAB - 2.0)).item(), rel=1e-6)


def test_stopgrad_anchor_sends_no_gradient_through_the_few_mask_view():
    prompt, target = batch()
    grads = {}
    for divergence in ("tv", "tv_symmetric"):
        rec = Recorder(tiny_model().train())
        loss, _ = MaskAgnosticLoss(MASK, PAD, lam=1.0, ce_views="none", divergence=divergence)(
            rec, prompt, target, k2=8)
        loss.backward()
        grads[divergence] = rec.calls[0][2].grad[:4].abs().sum().item()  # rows of the k1 view
    assert grads["tv"] == 0.0 and grads["tv_symmetric"] > 0.0


def test_the_loss_trains_a_transformer_with_finite_gradients():
    model = tiny_model().train()
    prompt, target = batch()
    loss, stats = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=16, partial_target_prob=0.5)(
        model, prompt, target, generator=torch.Generator().manual_seed(0))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert set(stats) >= {"ce_k1", "ce_k2", "tv", "k2"} and 3 <= stats["k2"].item() <= 16


def test_partially_revealed_targets_show_the_same_pattern_in_both_views_and_are_not_scored():
    rec = Recorder(tiny_model())
    prompt, target = batch(b=8, n=6)
    loss_fn = MaskAgnosticLoss(MASK, PAD, k1=0, k_max=4, partial_target_prob=1.0)
    loss_fn(rec, prompt, target, generator=torch.Generator().manual_seed(1))
    x = rec.calls[0][0]
    span = slice(7, 13)
    assert torch.equal(x[:8, span], x[8:, span])
    shown = x[:8, span] != MASK
    assert shown.any() and (~shown).any() and torch.equal(x[:8, span][shown], target[shown])


def test_k2_is_drawn_from_k1_plus_one_to_k_max():
    loss_fn = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=6, k_sampling="per_example")
    k2 = loss_fn.sample_k2(2000, torch.Generator().manual_seed(0))
    assert set(k2.tolist()) == {3, 4, 5, 6}
    shared = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=6).sample_k2(10, torch.Generator().manual_seed(0))
    assert len(set(shared.tolist())) == 1


def test_invalid_settings_name_the_bad_value_and_the_valid_range():
    with pytest.raises(ValueError, match=r"k_max=2 must be >= k1 \+ 1 = 3"):
        MaskAgnosticLoss(MASK, PAD, k1=2, k_max=2)
    with pytest.raises(ValueError, match="unknown divergence 'l2'; valid: tv, tv_symmetric, kl, js"):
        MaskAgnosticLoss(MASK, PAD, divergence="l2")
    with pytest.raises(ValueError, match="unknown ce_views 'all'"):
        MaskAgnosticLoss(MASK, PAD, ce_views="all")
    with pytest.raises(ValueError, match="tv_symmetric"):
        MaskAgnosticLoss(MASK, PAD, divergence="tv_symmetric", stopgrad_anchor=True)
    with pytest.raises(ValueError, match="mask_id and pad_id must differ"):
        MaskAgnosticLoss(MASK, MASK)


def test_separate_view_passes_need_no_padding_mask_and_match_the_batched_pass():
    model, (prompt, target) = tiny_model(), batch()

    def no_padding_support(x, key_padding_mask=None):
        assert key_padding_mask is None, "a shared tail needs no padding when views run separately"
        return model(x)

    batched, stats_b = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=9)(model, prompt, target, k2=9)
    separate, stats_s = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=9, batch_views=False)(
        no_padding_support, prompt, target, k2=9)
    assert abs(batched.item() - separate.item()) < 1e-5 and abs(stats_b["tv"] - stats_s["tv"]) < 1e-5


class TorchEncoderLM(torch.nn.Module):
    """A bidirectional LM on nn.TransformerEncoder, whose key_padding_mask is PyTorch's: True = padding."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.pos = torch.nn.Embedding(VOCAB, 32), torch.nn.Embedding(128, 32)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, x, key_padding_mask=None):
        h = self.embed(x) + self.pos(torch.arange(x.shape[1]))
        return self.head(self.encoder(h, src_key_padding_mask=key_padding_mask))


@pytest.mark.parametrize("k_sampling", ["per_batch", "per_example"])
def test_a_pytorch_convention_model_gets_the_unpadded_result_with_mask_true_means_padding(k_sampling):
    model, (prompt, target) = TorchEncoderLM(), batch()
    k2 = torch.tensor([9, 9, 9, 9]) if k_sampling == "per_batch" else torch.tensor([3, 9, 5, 12])
    rec = Recorder(model)
    padded, stats = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=12, k_sampling=k_sampling, mask_true_means="padding")(
        rec, prompt, target, k2=k2)
    assert rec.calls[0][1] is not None and rec.calls[0][1].any()  # the model did get padding, marked True
    # the same loss row by row, each row alone at its own length: no padding, no mask
    ce, tv = [], []
    for r in range(4):
        loss_r, stats_r = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=12, batch_views=False)(
            model, prompt[r : r + 1], target[r : r + 1], k2=int(k2[r]))
        ce.append(0.5 * (stats_r["ce_k1"] + stats_r["ce_k2"]))
        tv.append(stats_r["tv"])
    assert abs(stats["tv"].item() - torch.stack(tv).mean().item()) < 1e-5
    assert abs(padded.item() - (torch.stack(ce).mean() + torch.stack(tv).mean()).item()) < 1e-5


def test_a_mask_read_the_other_way_round_is_refused_not_silently_wrong():
    prompt, target = batch()
    refused = r"True = real token \(mask_true_means='real'\).*Try mask_true_means='padding'"
    with pytest.raises(ValueError, match=refused):
        MaskAgnosticLoss(MASK, PAD, k1=2, k_max=12)(TorchEncoderLM(), prompt, target, k2=9)
    with pytest.raises(ValueError, match=r"True = padding \(mask_true_means='padding'\).*Try mask_true_means='real'"):
        MaskAgnosticLoss(MASK, PAD, k1=2, k_max=12, mask_true_means="padding")(tiny_model(), prompt, target, k2=9)
    with pytest.raises(ValueError, match="mask_true_means='pytorch' is invalid; valid: real, padding"):
        MaskAgnosticLoss(MASK, PAD, mask_true_means="pytorch")


def test_the_convention_check_runs_once_in_eval_mode_and_leaves_the_model_as_it_was():
    model = tiny_model().train()
    rec = Recorder(model)
    loss_fn, (prompt, target) = MaskAgnosticLoss(MASK, PAD, k1=2, k_max=12), batch()
    rng = torch.get_rng_state()
    loss_fn(rec, prompt, target, k2=9)
    assert len(rec.calls) == 3 and rec.model.training  # the loss's pass, then the check's two (no grad)
    assert not rec.calls[1][2].requires_grad and torch.equal(torch.get_rng_state(), rng)
    loss_fn(rec, prompt, target, k2=9)
    assert len(rec.calls) == 4  # checked once per loss


def test_the_mdlm_module_hands_its_nelbo_masks_to_the_model_in_the_extra_losss_convention():
    from framework.modules.mdlm import MDLMModule

    tokens = torch.randint(2, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    real = torch.ones(2, 10, dtype=torch.bool)
    real[1, 6:] = False
    for true_means, expected in (("real", real), ("padding", ~real)):
        rec = Recorder(TorchEncoderLM())
        module = MDLMModule(rec, mask_id=MASK, extra_loss=MaskAgnosticLoss(MASK, PAD, mask_true_means=true_means))
        module._mdlm_loss(rec, {"tokens": tokens, "attention_mask": real}, train=False,
                          generator=torch.Generator().manual_seed(0))
        assert torch.equal(rec.calls[0][1], expected)


def _padded_rows(vocab: int, real: int = 20, pad: int = 30):
    tokens = torch.randint(2, vocab, (2, real + pad), generator=torch.Generator().manual_seed(0))
    kpm = torch.ones_like(tokens, dtype=torch.bool)
    kpm[0, real:] = False
    return tokens, kpm


def test_the_convention_check_compares_in_fp32_under_bf16_autocast_and_still_catches_a_reversed_mask():
    from framework.losses.mask_agnostic import check_mask_convention

    torch.manual_seed(0)  # 4 layers at d=128: bf16 rounding alone moved these logits by 0.0039 (> 1e-3 of them)
    model = TransformerLM(256, dim=128, depth=4, heads=4, causal=False, max_seq_len=64).eval()
    tokens, kpm = _padded_rows(256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check_mask_convention(model, tokens, kpm)  # reads the mask right: no alarm
        with pytest.raises(ValueError, match="change by"):
            check_mask_convention(model, tokens, kpm, true_means="padding")
        with pytest.raises(ValueError, match="Try mask_true_means='padding'"):
            check_mask_convention(TorchEncoderLM(), *_padded_rows(VOCAB))


def test_a_model_with_bf16_weights_is_checked_at_a_tolerance_of_its_own_rounding():
    from framework.losses.mask_agnostic import check_mask_convention

    torch.manual_seed(0)
    model = TransformerLM(256, dim=128, depth=4, heads=4, causal=False, max_seq_len=64).eval().to(torch.bfloat16)
    tokens, kpm = _padded_rows(256)
    check_mask_convention(model, tokens, kpm)
    with pytest.raises(ValueError, match="change by"):
        check_mask_convention(model, tokens, kpm, true_means="padding")
