"""MDLM (Sahoo et al., NeurIPS 2024): absorbing-state forward process, SUBS parameterisation and the
continuous-time NELBO with the log-linear schedule, faithful to kuleshov-group/mdlm (arXiv 2406.07524).

No time conditioning: the optimal denoiser p(x | z_t) of the absorbing process does not depend on t, so the
model is any callable `model(tokens[, key_padding_mask=...]) -> logits (batch, seq, vocab)`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from framework.rng import draw_device

NEG_INF = -1e6  # MDLM's `neg_infinity`: finite, so 0 * (a - b) stays 0 in KL-style sums

REDUCTIONS = ("tokens", "response")


def model_logits(model: Any, tokens: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    """Call `model(tokens)`, passing `key_padding_mask` (True = real token) only when one is given."""
    if key_padding_mask is None:
        return model(tokens)
    return model(tokens, key_padding_mask=key_padding_mask)


class LogLinearSchedule:
    """Log-linear noise: sigma(t) = -log(1 - (1-eps) t), so alpha_t = 1 - (1-eps) t (MDLM's `LogLinearNoise`)."""

    def __init__(self, eps: float = 1e-3):
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps={eps} must be in [0, 1)")
        self.eps = eps

    def sigma(self, t: Tensor) -> Tensor:
        """Total noise sigma(t) = -log1p(-(1-eps) t)."""
        return -torch.log1p(-(1 - self.eps) * t)

    def dsigma(self, t: Tensor) -> Tensor:
        """Noise rate dsigma/dt = (1-eps) / (1 - (1-eps) t)."""
        return (1 - self.eps) / (1 - (1 - self.eps) * t)

    def alpha(self, t: Tensor) -> Tensor:
        """Probability that a token is still clean at time t: exp(-sigma(t)) = 1 - (1-eps) t."""
        return 1 - (1 - self.eps) * t

    def move_chance(self, t: Tensor) -> Tensor:
        """Probability that a token is masked at time t: 1 - alpha_t = (1-eps) t."""
        return (1 - self.eps) * t

    def weight(self, t: Tensor) -> Tensor:
        """NELBO weight dsigma / expm1(sigma) = -alpha'_t / (1 - alpha_t), exactly 1/t for this schedule."""
        return self.dsigma(t) / torch.expm1(self.sigma(t))

    def __repr__(self) -> str:
        return f"LogLinearSchedule(eps={self.eps})"


def mask_tokens(
    x: Tensor,
    move_chance: Tensor | float,
    mask_id: int,
    generator: torch.Generator | None = None,
    maskable: Tensor | None = None,
) -> Tensor:
    """Sample z_t ~ q(z_t | x): each maskable token independently becomes `mask_id` with prob `move_chance`."""
    u = torch.rand(x.shape, generator=generator, device=draw_device(generator, x.device)).to(x.device)
    move = u < torch.as_tensor(move_chance, device=x.device)
    if maskable is not None:
        move = move & maskable.bool()
    return torch.where(move, torch.full_like(x, mask_id), x)


def subs_log_probs(logits: Tensor, xt: Tensor, mask_id: int, never_predict: tuple[int, ...] = ()) -> Tensor:
    """SUBS: log-probs with p[MASK] = 0 (and p = 0 for `never_predict` ids, e.g. PAD); at unmasked
    positions carry the input over (log p[xt] = 0, every other entry -1e6)."""
    vocab = logits.shape[-1]
    for i in (mask_id, *never_predict):
        if not 0 <= i < vocab:
            raise ValueError(f"token id {i} is outside the logits' vocabulary [0, {vocab})")
    logits = logits.float()
    banned = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
    banned[[mask_id, *never_predict]] = True
    logits = logits + banned * NEG_INF
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    carry = torch.full_like(log_probs, NEG_INF).scatter_(-1, xt.unsqueeze(-1), 0.0)
    return torch.where((xt != mask_id).unsqueeze(-1), carry, log_probs)


def stratified_times(
    n: int, eps: float = 1e-3, generator: torch.Generator | None = None, device: torch.device | str | None = None
) -> Tensor:
    """Low-discrepancy t ~ U[eps, 1]: sample i lies in stratum [i/n, (i+1)/n) before rescaling (MDLM `_sample_t`)."""
    if n < 1:
        raise ValueError(f"n={n} must be a positive number of times")
    u = torch.rand(n, generator=generator, device=draw_device(generator, device)).to(device)
    offsets = torch.arange(n, device=u.device) / n
    return (1 - eps) * ((u / n + offsets) % 1) + eps


def mdlm_nelbo(
    model: Any,
    x: Tensor,
    mask_id: int,
    schedule: LogLinearSchedule,
    *,
    attention_mask: Tensor | None = None,
    prompt_mask: Tensor | None = None,
    t: Tensor | None = None,
    generator: torch.Generator | None = None,
    sampling_eps: float = 1e-3,
    reduction: str = "tokens",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Continuous-time MDLM NELBO, E_t[(1/t) sum_{masked l} -log p(x_l | z_t)] (MDLM's `_forward_pass_diffusion`).

    `attention_mask` (True = real token) excludes padding from masking, attention and the loss;
    `prompt_mask` (True = prompt) keeps those tokens clean (LLaDA SFT). `reduction="tokens"` is MDLM's
    sum(loss * mask) / sum(mask) over all real tokens; `"response"` is LLaDA SFT's per-row sum over the
    non-prompt real tokens divided by their count, averaged over rows.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(REDUCTIONS)}")
    batch = x.shape[0]
    real = torch.ones_like(x, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    maskable = real if prompt_mask is None else real & ~prompt_mask.bool()
    if t is None:
        t = stratified_times(batch, sampling_eps, generator=generator, device=x.device)
    t = torch.as_tensor(t, dtype=torch.float32, device=x.device).expand(batch)
    xt = mask_tokens(x, schedule.move_chance(t)[:, None], mask_id, generator, maskable)
    log_probs = subs_log_probs(model_logits(model, xt, attention_mask), xt, mask_id)
    nll = -log_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # exactly 0 at unmasked positions (carry-over)
    token_loss = nll * schedule.weight(t)[:, None] * real
    if reduction == "tokens":
        loss = token_loss.sum() / real.sum().clamp_min(1)
    else:
        loss = (token_loss.sum(-1) / maskable.sum(-1).clamp_min(1)).mean()
    is_masked = xt == mask_id
    stats = {
        "nll_sum": token_loss.detach().sum(),
        "tokens": real.sum(),
        "masked_fraction": is_masked.sum() / real.sum().clamp_min(1),
        "masked_ce": (nll.detach() * is_masked).sum() / is_masked.sum().clamp_min(1),
        "t_mean": t.mean(),
    }
    return loss, stats


def bits_per_token(nll: Tensor | float) -> Tensor:
    """Bits per token (BPD for byte vocabularies) from a NELBO in nats: nll / ln 2; an upper bound."""
    return torch.as_tensor(nll, dtype=torch.float64) / math.log(2)


def perplexity_upper_bound(nll_sum: Tensor | float, tokens: Tensor | float) -> Tensor:
    """exp(sum nll / sum tokens): the NELBO bounds the NLL, so this bounds the true perplexity (MDLM's 'ppl ≤')."""
    nll_sum, tokens = torch.as_tensor(nll_sum, dtype=torch.float64), torch.as_tensor(tokens, dtype=torch.float64)
    return torch.exp(nll_sum / tokens)


class NelboBound(Metric):
    """Accumulates NELBO nats and token counts (float64, summed across ranks); `compute()` returns the
    per-token NELBO, its bits-per-token and the perplexity upper bound, as MDLM reports them."""

    full_state_update = False

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.add_state("nll_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, nll_sum: Tensor, tokens: Tensor) -> None:
        self.nll_sum += torch.as_tensor(nll_sum, dtype=torch.float64, device=self.nll_sum.device)
        self.tokens += torch.as_tensor(tokens, dtype=torch.float64, device=self.tokens.device)

    def compute(self) -> dict[str, Tensor]:
        nll = self.nll_sum / self.tokens
        return {"nll_bound": nll, "bpt_bound": bits_per_token(nll), "ppl_bound": torch.exp(nll)}
