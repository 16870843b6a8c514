"""Samplers for a SUBS MDLM (MDLM's `ddpm` / `ddpm_cache`) and LLaDA-style generation."""

import math

import pytest
import torch

from framework.diffusion.sampling import (
    ddpm_cache_sample,
    ddpm_sample,
    ddpm_update,
    generate,
    gumbel_norm,
    transfer_counts,
)
from framework.losses.mdlm import LogLinearSchedule, mdlm_nelbo
from framework.models.transformer import TransformerLM

torch.set_num_threads(1)

VOCAB, MASK = 13, 12


def tiny_model(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(VOCAB, dim=32, depth=2, heads=4, causal=False, max_seq_len=64).eval()


def all_masks(b: int, n: int) -> torch.Tensor:
    return torch.full((b, n), MASK)


@pytest.mark.parametrize("sampler", ["ddpm", "ddpm_cache"])
def test_a_token_once_unmasked_never_changes(sampler):
    history = []
    kwargs = dict(generator=torch.Generator().manual_seed(0), on_step=lambda i, x: history.append(x.clone()))
    x0 = all_masks(3, 16)
    if sampler == "ddpm":
        ddpm_sample(tiny_model(), x0, MASK, 32, **kwargs)
    else:
        ddpm_cache_sample(tiny_model(), x0, MASK, 32, **kwargs)
    states = torch.stack([x0, *history])
    for before, after in zip(states[:-1], states[1:], strict=True):
        fixed = before != MASK
        assert torch.equal(after[fixed], before[fixed])
    assert (states[-1] != MASK).any() and (states[len(states) // 2] == MASK).any()


def test_expected_number_of_unmasked_tokens_is_n_masked_times_t_minus_s_over_t():
    runs, n, t, s = 1000, 20, 0.8, 0.5
    g = torch.Generator().manual_seed(0)
    x = all_masks(runs, n)
    p_x0 = torch.full((runs, n, VOCAB), 1.0 / (VOCAB - 1))
    p_x0[..., MASK] = 0
    x_next = ddpm_update(x, p_x0, t, s, MASK, gumbel_norm((runs, n, VOCAB), g, x.device))
    p = (t - s) / t
    z = ((x_next != MASK).sum().item() - runs * n * p) / math.sqrt(runs * n * p * (1 - p))
    assert abs(z) < 3, z
    assert ((x_next == MASK) | (x_next < MASK)).all()


def test_noise_removal_leaves_no_mask():
    # stopping the time grid at t = 0.5 leaves about half the tokens masked before noise removal
    x0, kw = all_masks(4, 16), dict(eps=0.5)
    kept = ddpm_sample(tiny_model(), x0, MASK, 2, generator=torch.Generator().manual_seed(0), noise_removal=False, **kw)
    assert (kept == MASK).any()  # so the checks below can fail
    out = ddpm_sample(tiny_model(), x0, MASK, 2, generator=torch.Generator().manual_seed(0), **kw)
    cached, _ = ddpm_cache_sample(tiny_model(), x0, MASK, 2, generator=torch.Generator().manual_seed(0), **kw)
    for tokens in (out, cached):
        assert tokens.dtype == torch.long and not (tokens == MASK).any()
        assert torch.equal(tokens[kept != MASK], kept[kept != MASK])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ddpm_and_ddpm_cache_give_identical_tokens_at_the_same_seed(seed):
    model, x0 = tiny_model(seed), all_masks(4, 12)
    a = ddpm_sample(model, x0, MASK, 32, generator=torch.Generator().manual_seed(seed))
    b, calls = ddpm_cache_sample(model, x0, MASK, 32, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(a, b)
    other = ddpm_sample(model, x0, MASK, 32, generator=torch.Generator().manual_seed(seed + 100))
    assert not torch.equal(a, other)


def test_ddpm_cache_calls_the_network_at_most_min_steps_length_plus_two_times():
    model = tiny_model()
    for length, steps in [(6, 64), (10, 128), (20, 8)]:
        _, calls = ddpm_cache_sample(model, all_masks(1, length), MASK, steps, generator=torch.Generator())
        assert calls <= min(steps, length) + 2, (length, steps, calls)
    _, calls = ddpm_cache_sample(model, all_masks(4, 6), MASK, 64, generator=torch.Generator())
    assert calls <= min(64, 4 * 6) + 2  # the cache is per batch: L counts every masked token in it


def test_given_tokens_stay_fixed_so_infilling_works():
    x0 = torch.randint(0, MASK, (3, 14), generator=torch.Generator().manual_seed(0))
    holes = torch.zeros_like(x0, dtype=torch.bool)
    holes[:, 4:9] = True
    x0 = torch.where(holes, MASK, x0)
    out = ddpm_sample(tiny_model(), x0, MASK, 16, generator=torch.Generator().manual_seed(1))
    cached, _ = ddpm_cache_sample(tiny_model(), x0, MASK, 16, generator=torch.Generator().manual_seed(1))
    for tokens in (out, cached):
        assert torch.equal(tokens[~holes], x0[~holes]) and not (tokens == MASK).any()


def test_overfit_one_sequence_then_ddpm_cache_reproduces_it():
    # RoPE is relative and an all-MASK input carries no absolute position, so a clean BOS at position 0 (a
    # one-token prompt, never masked) anchors positions; everything after it is generated.
    bos = 11
    seq = torch.tensor([[bos, 3, 7, 0, 9, 3, 5, 1]])
    prompt = torch.zeros_like(seq, dtype=torch.bool)
    prompt[:, 0] = True
    torch.manual_seed(0)
    model = TransformerLM(VOCAB, dim=32, depth=2, heads=4, causal=False, max_seq_len=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g, schedule = torch.Generator().manual_seed(0), LogLinearSchedule()
    for _ in range(300):
        loss, _ = mdlm_nelbo(model, seq.expand(32, -1), MASK, schedule, prompt_mask=prompt.expand(32, -1), generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        final, _ = mdlm_nelbo(model, seq.expand(512, -1), MASK, schedule, prompt_mask=prompt.expand(512, -1),
                              generator=g)
    assert final.item() < 0.02, final.item()
    x0 = all_masks(8, seq.shape[1])
    x0[:, 0] = bos
    out, calls = ddpm_cache_sample(model, x0, MASK, 128, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, seq.expand(8, -1)) and calls <= 8 * 7 + 2


def test_transfer_counts_split_masks_evenly_over_steps():
    masked = torch.zeros(2, 10, dtype=torch.bool)
    masked[0, :10] = True
    masked[1, :7] = True
    counts = transfer_counts(masked, 4)
    assert counts.tolist() == [[3, 3, 2, 2], [2, 2, 2, 1]]


class ConfidenceGrowsWithPosition(torch.nn.Module):
    """Predicts token 2 everywhere (MASK and id 0 get the largest logits); confidence rises with position."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x, key_padding_mask=None):
        self.seen.append(x.clone())
        logits = torch.zeros(*x.shape, VOCAB)
        logits[..., 2] = torch.arange(x.shape[1], dtype=torch.float32)
        logits[..., [0, MASK]] = 1e3
        return logits


def test_generate_commits_the_most_confident_masks_block_by_block():
    model = ConfidenceGrowsWithPosition()
    prompt = torch.tensor([[5, 6, 7]])
    out = generate(model, prompt, gen_length=8, steps=4, block_length=4, mask_id=MASK, never_predict=(0,))
    assert out.dtype == torch.long and out.shape == (1, 11)
    assert torch.equal(out[:, :3], prompt) and (out[:, 3:] == 2).all()
    assert len(model.seen) == 4
    first_block, second_block = slice(3, 7), slice(7, 11)
    assert (model.seen[1][0, first_block] != MASK).tolist() == [False, False, True, True]  # most confident first
    assert (model.seen[1][0, second_block] == MASK).all()  # semi-AR: later blocks wait
    assert (model.seen[2][0, first_block] != MASK).all()


def test_generate_samples_with_temperature_and_random_remasking_reproducibly():
    prompt = torch.randint(0, MASK, (2, 5), generator=torch.Generator().manual_seed(0))
    run = lambda seed: generate(tiny_model(), prompt, 6, 6, remasking="random", temperature=1.0, mask_id=MASK,  # noqa: E731
                                generator=torch.Generator().manual_seed(seed))
    a, b = run(0), run(0)
    assert torch.equal(a, b) and not (a == MASK).any() and torch.equal(a[:, :5], prompt)
    assert not torch.equal(a, run(1))


def test_generate_rejects_block_and_step_counts_that_do_not_divide():
    with pytest.raises(ValueError, match="gen_length=10 must be a positive multiple of block_length=4"):
        generate(tiny_model(), all_masks(1, 2), 10, 10, 4, mask_id=MASK)
    with pytest.raises(ValueError, match=r"steps=3 must be a positive multiple of the number of blocks \(2\)"):
        generate(tiny_model(), all_masks(1, 2), 8, 3, 4, mask_id=MASK)
    with pytest.raises(ValueError, match="unknown remasking 'top_k'; valid: low_confidence, random"):
        generate(tiny_model(), all_masks(1, 2), 8, 8, remasking="top_k", mask_id=MASK)
