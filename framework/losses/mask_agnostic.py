"""Mask-agnostic loss for masked diffusion LMs (Piskorz et al., "Masks Can Be Distracting", ICML 2026).

RECONSTRUCTION, not the authors' equation: the paper text was unavailable; the abstract and summaries say only
"cross-entropy with a distributional alignment term (CE + TV)" that makes predictions invariant to the number of
appended masks. The form below is our inference:

    L = 1/2 [CE(y, p^(k1)) + CE(y, p^(k2))] + lam * D(p^(k1), p^(k2)),   x(k) = [prompt, MASK^n, MASK^k]

with p^(k) the SUBS distribution at the n target positions (identical absolute positions in both views) and
D = TV by default, p^(k1) detached (the few-mask view is the teacher; chosen on the needle task).
The model is any callable `model(tokens[, key_padding_mask=...]) -> logits`; the caller adds the MDLM loss.
Key-padding masks here are True = real token (framework models, Hugging Face's attention_mask); a model that
reads PyTorch's convention (True = padding, as nn.MultiheadAttention) needs `mask_true_means="padding"`, and
a model that reads the mask the other way round from what it is given is refused on the first padded batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from einops import repeat
from torch import Tensor, nn

from framework.losses.mdlm import model_logits, subs_log_probs
from framework.rng import draw_device

DIVERGENCES = ("tv", "tv_symmetric", "kl", "js")
CE_VIEWS = ("both", "few", "many", "none")
K_SAMPLING = ("per_batch", "per_example")
#: What True means in the key-padding mask the model is given: a real token, or padding (PyTorch's convention).
MASK_TRUE_MEANS = ("real", "padding")


def _check_true_means(value: str) -> None:
    if value not in MASK_TRUE_MEANS:
        raise ValueError(f"mask_true_means={value!r} is invalid; valid: {', '.join(MASK_TRUE_MEANS)}"
                         " (what True means in the model's key_padding_mask)")


def follow_mask_convention(model: Any, true_means: str = "real") -> Callable[..., Tensor]:
    """`model` as a callable taking a True = real key-padding mask: returned as is for "real"; for "padding"
    (PyTorch's convention: nn.MultiheadAttention, nn.TransformerEncoder) the mask is inverted on the way in."""
    _check_true_means(true_means)
    if true_means == "real":
        return model

    def padding_true(tokens: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        return model_logits(model, tokens, None if key_padding_mask is None else ~key_padding_mask.bool())

    return padding_true


def tv_distance(p: Tensor, q: Tensor) -> Tensor:
    """Total variation 1/2 sum_v |p_v - q_v| along the last dim; in [0, 1] for distributions."""
    return 0.5 * (p - q).abs().sum(-1)


def kl_from_log_probs(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) along the last dim from log-probs; entries with p = 0 (SUBS' -1e6) contribute 0."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def js_from_log_probs(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Jensen-Shannon divergence 1/2 KL(p || m) + 1/2 KL(q || m), m = (p + q) / 2, from log-probs."""
    log_m = torch.logaddexp(log_p, log_q) - math.log(2)
    return 0.5 * (kl_from_log_probs(log_p, log_m) + kl_from_log_probs(log_q, log_m))


def mask_agnostic_views(
    prompt: Tensor,
    n_targets: int,
    tails: Tensor,
    mask_id: int,
    pad_id: int,
    prompt_lengths: Tensor | None = None,
    revealed: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Rows `[prompt_r, MASK^n, MASK^tails_r, PAD...]` for prompts (R, P) and tail lengths (R,).

    Returns tokens (R, T), key_padding_mask (R, T; True = real) and the ABSOLUTE target positions (R, n),
    which depend on the prompt length only, never on the tail. `revealed` (R, n) holds target ids to show
    in place of the mask, or -1 to keep the mask.
    """
    rows, width = prompt.shape
    device = prompt.device
    lengths = torch.full((rows,), width, device=device) if prompt_lengths is None else prompt_lengths.to(device)
    tails = tails.to(device)
    if (tails < 0).any():
        raise ValueError(f"tail lengths must be >= 0, got min {int(tails.min())}")
    if (lengths < 0).any() or (lengths > width).any():
        raise ValueError(f"prompt_lengths must lie in [0, {width}], got {lengths.tolist()}")
    real_len = lengths + n_targets + tails
    total = int(real_len.max())
    pos = torch.arange(total, device=device)
    tokens = torch.full((rows, total), pad_id, dtype=prompt.dtype, device=device)
    in_prompt = pos[None] < lengths[:, None]
    w = min(width, total)
    tokens[:, :w] = torch.where(in_prompt[:, :w], prompt[:, :w], tokens[:, :w])
    key_padding_mask = pos[None] < real_len[:, None]
    tokens[key_padding_mask & ~in_prompt] = mask_id
    targets_at = lengths[:, None] + torch.arange(n_targets, device=device)[None]
    if revealed is not None:
        shown = tokens.gather(1, targets_at)
        tokens.scatter_(1, targets_at, torch.where(revealed >= 0, revealed.to(tokens.dtype), shown))
    return tokens, key_padding_mask, targets_at


def _logits_at(model: Any, tokens: Tensor, kpm: Tensor, at: Tensor) -> tuple[Tensor, bool]:
    """Logits (R, n, V) at absolute positions `at`, and whether a key-padding mask was passed: the rows are cut
    to their longest real length first and the mask (True = real) is passed only if some padding remains."""
    width = int(kpm.sum(1).max())
    tokens, kpm = tokens[:, :width], kpm[:, :width]
    padded = not bool(kpm.all())
    logits = model_logits(model, tokens, kpm if padded else None)
    return logits.gather(1, repeat(at, "r n -> r n v", v=logits.shape[-1])), padded


@torch.no_grad()
def check_mask_convention(model: Any, tokens: Tensor, kpm: Tensor, true_means: str = "real") -> None:
    """ValueError unless the model's logits at the real positions of the most padded row are the same with its
    padding (masked) as without it: a model reading the mask the other way round attends to the padding only.

    Runs `model` in eval mode (restored after) without gradients or RNG use; `kpm` is True = real token. Autocast
    is off inside, so a bf16-mixed run compares fp32 logits; a model whose weights are themselves in a low
    precision is compared at a tolerance of a few of its rounding steps (`_convention_tolerance`).
    """
    row = int(kpm.sum(1).argmin())
    n, width = int(kpm[row].sum()), int(kpm.sum(1).max())
    call = follow_mask_convention(model, true_means)
    modules = [model] if isinstance(model, nn.Module) else []
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.autocast(tokens.device.type, enabled=False):
            alone = model_logits(call, tokens[row : row + 1, :n])
            padded = model_logits(call, tokens[row : row + 1, :width], kpm[row : row + 1, :width])[:, :n]
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.train(mode)
    tolerance = _convention_tolerance(alone.dtype) * (1.0 + float(alone.float().abs().max()))
    alone, padded = alone.float(), padded.float()
    change = float((padded - alone).abs().max()) if bool(torch.isfinite(padded).all()) else float("inf")
    if not change <= tolerance:
        shown = "real token" if true_means == "real" else "padding"
        other = "padding" if true_means == "real" else "real"
        raise ValueError(
            f"the model's logits at real positions change by {change:.3g} when {width - n} PAD positions are"
            f" appended and marked in its key_padding_mask with True = {shown} (mask_true_means={true_means!r}):"
            f" the model reads the mask the other way round, or ignores it. Try mask_true_means={other!r}: 'padding'"
            " when True marks padding in the model (PyTorch's convention: nn.MultiheadAttention,"
            " nn.TransformerEncoder), 'real' when True marks real tokens (framework models, Hugging Face attention"
            " masks). A model without padding support needs batch_views=False with k_sampling='per_batch'."
        )


def _convention_tolerance(dtype: torch.dtype) -> float:
    """Relative change of the logits that `check_mask_convention` accepts: 1e-3 in fp32 (and wider types), four
    rounding steps in a narrower one (bf16: 0.031; padding changes the order of a sum, so low bits may move)."""
    return max(1e-3, 4 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-3


class MaskAgnosticLoss(nn.Module):
    """CE on the targets in a few-mask view x(k1) and a many-mask view x(k2), plus lam * D(p^(k1), p^(k2)).

    A reconstruction from the paper's abstract and summaries (inferred); see the module docstring. The first padded
    batch checks that padding hidden as `mask_true_means` says leaves the model's real positions unchanged.

    Args:
        mask_id: token id of [MASK]; supplied from the data (or the mdlm module's appended one) at build time.
        pad_id: token id of padding, different from `mask_id`; supplied from the data at build time.
        lam: weight λ of the divergence between the two views, ≥ 0; 0 leaves the CE terms alone (the ablations).
        k1: extra [MASK] tokens appended after the targets in the few-mask view, ≥ 0.
        k_max: most extra masks in the many-mask view: k2 ~ U{k1+1..k_max}.
        divergence: D between the views' predictions: "tv", "tv_symmetric", "kl" or "js".
        stopgrad_anchor: detach the few-mask view inside D (it is the teacher); None: True unless "tv_symmetric".
        ce_views: views that get the cross-entropy: "both" (their mean), "few", "many" or "none".
        k_sampling: draw k2 once per batch ("per_batch") or per row ("per_example").
        partial_target_prob: probability that a row shows a random fraction of its targets in both views, in [0, 1].
        batch_views: run both views in one forward pass of 2B rows, right-padded and hidden by a key-padding mask.
            False gives each view its own pass, so a model without a key-padding mask works with `per_batch`.
        mask_true_means: what True means in the model's key-padding mask: "real" (a real token) or "padding" (PyTorch).
    """

    def __init__(
        self,
        mask_id: int,
        pad_id: int,
        lam: float = 1.0,
        k1: int = 0,
        k_max: int = 16,
        divergence: str = "tv",
        stopgrad_anchor: bool | None = None,
        ce_views: str = "both",
        k_sampling: str = "per_batch",
        partial_target_prob: float = 0.0,
        batch_views: bool = True,
        mask_true_means: str = "real",
    ):
        super().__init__()
        _check_true_means(mask_true_means)
        if mask_id == pad_id:
            raise ValueError(f"mask_id and pad_id must differ, both are {mask_id}")
        if divergence not in DIVERGENCES:
            raise ValueError(f"unknown divergence {divergence!r}; valid: {', '.join(DIVERGENCES)}")
        if ce_views not in CE_VIEWS:
            raise ValueError(f"unknown ce_views {ce_views!r}; valid: {', '.join(CE_VIEWS)}")
        if k_sampling not in K_SAMPLING:
            raise ValueError(f"unknown k_sampling {k_sampling!r}; valid: {', '.join(K_SAMPLING)}")
        if k1 < 0:
            raise ValueError(f"k1={k1} must be >= 0")
        if k_max < k1 + 1:
            raise ValueError(f"k_max={k_max} must be >= k1 + 1 = {k1 + 1} so that k2 ~ U{{k1+1..k_max}} exists")
        if lam < 0:
            raise ValueError(f"lam={lam} must be >= 0")
        if not 0.0 <= partial_target_prob <= 1.0:
            raise ValueError(f"partial_target_prob={partial_target_prob} must be in [0, 1]")
        if divergence == "tv_symmetric" and stopgrad_anchor:
            raise ValueError("divergence='tv_symmetric' sends gradients through both views; it needs stopgrad_anchor "
                             "False or None, got True (use divergence='tv' for a detached anchor)")
        self.mask_id, self.pad_id, self.lam, self.k1, self.k_max = mask_id, pad_id, lam, k1, k_max
        self.divergence, self.ce_views, self.k_sampling = divergence, ce_views, k_sampling
        self.stopgrad_anchor = divergence != "tv_symmetric" if stopgrad_anchor is None else stopgrad_anchor
        self.partial_target_prob, self.batch_views = partial_target_prob, batch_views
        self.mask_true_means, self._mask_checked = mask_true_means, False

    def extra_repr(self) -> str:
        return (f"lam={self.lam}, k1={self.k1}, k_max={self.k_max}, divergence={self.divergence!r}, "
                f"stopgrad_anchor={self.stopgrad_anchor}, ce_views={self.ce_views!r}, k_sampling={self.k_sampling!r}, "
                f"mask_true_means={self.mask_true_means!r}")

    def sample_k2(self, batch: int, generator: torch.Generator | None = None, device: Any = None) -> Tensor:
        """k2 ~ U{k1+1..k_max}: one draw shared by the batch (`per_batch`) or one per row (`per_example`)."""
        draws = 1 if self.k_sampling == "per_batch" else batch
        k2 = torch.randint(self.k1 + 1, self.k_max + 1, (draws,), generator=generator,
                           device=draw_device(generator, device))
        return k2.expand(batch).to(device)

    def _reveal(self, target: Tensor, generator: torch.Generator | None) -> Tensor:
        """Partial targets: with prob `partial_target_prob` a row shows a random fraction t of its
        targets (the same pattern in both views); returns the shown ids, -1 where the mask stays."""
        batch, n = target.shape
        where = draw_device(generator, target.device)
        rows_on = torch.rand(batch, generator=generator, device=where) < self.partial_target_prob
        frac = torch.rand(batch, 1, generator=generator, device=where)
        shown = (torch.rand(batch, n, generator=generator, device=where) < frac) & rows_on[:, None]
        return torch.where(shown.to(target.device), target, torch.full_like(target, -1))

    def forward(
        self,
        model: Any,
        prompt: Tensor,
        target: Tensor,
        prompt_lengths: Tensor | None = None,
        *,
        target_mask: Tensor | None = None,
        k2: Tensor | int | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss over a batch: `prompt` (B, P) (right-padded if `prompt_lengths` is given), `target` (B, n).

        `target_mask` (B, n; True = score) drops positions from CE and the divergence (e.g. EOS padding);
        `k2` overrides the sampled tail of the many-mask view (an int or one value per row, may equal k1).
        """
        batch, n = target.shape
        device = target.device
        if prompt.shape[0] != batch:
            raise ValueError(f"prompt has {prompt.shape[0]} rows but target has {batch}")
        if k2 is None:
            k2 = self.sample_k2(batch, generator, device)
        k2 = torch.as_tensor(k2, device=device).expand(batch)
        k1 = torch.full((batch,), self.k1, device=device)
        revealed = self._reveal(target, generator) if self.partial_target_prob > 0 else None
        scored = torch.ones_like(target, dtype=torch.bool) if target_mask is None else target_mask.bool()
        if revealed is not None:
            scored = scored & (revealed < 0)
            revealed = repeat(revealed, "b n -> (v b) n", v=2)
        lengths = None if prompt_lengths is None else repeat(prompt_lengths, "b -> (v b)", v=2)
        tokens, kpm, at = mask_agnostic_views(
            repeat(prompt, "b p -> (v b) p", v=2), n, torch.cat([k1, k2]), self.mask_id, self.pad_id, lengths, revealed
        )
        log_probs = subs_log_probs(self._view_logits(model, tokens, kpm, at, batch), tokens.gather(1, at),
                                   self.mask_id, never_predict=(self.pad_id,))
        return self._loss_terms(log_probs, target, scored, k2)

    def _view_logits(self, model: Any, tokens: Tensor, kpm: Tensor, at: Tensor, batch: int) -> Tensor:
        """Logits (2B, n, V) of both views at the targets, in one pass or one per view (`batch_views`); the
        first batch that hands the model a key-padding mask also checks the mask convention."""
        call = follow_mask_convention(model, self.mask_true_means)
        if self.batch_views:
            picked, padded = _logits_at(call, tokens, kpm, at)
            checks = [slice(None)] if padded else []
        else:  # one pass per view, each cut to its own length: no padding when tails are shared
            halves = (slice(0, batch), slice(batch, None))
            passes = [_logits_at(call, tokens[h], kpm[h], at[h]) for h in halves]
            picked = torch.cat([logits for logits, _ in passes])
            checks = [h for h, (_, padded) in zip(halves, passes, strict=True) if padded]
        if checks and not self._mask_checked:  # once, on the first batch that hands the model a mask
            check_mask_convention(model, tokens[checks[0]], kpm[checks[0]], self.mask_true_means)
            self._mask_checked = True
        return picked

    def _loss_terms(
        self, log_probs: Tensor, target: Tensor, scored: Tensor, k2: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss from both views' SUBS log-probs (2B, n, V): the chosen CE term plus lam * D over the scored
        targets, and the logged stats."""
        lp1, lp2 = log_probs.chunk(2)
        weight = scored.float() / scored.sum().clamp_min(1)
        ce = -torch.cat([lp1, lp2]).gather(-1, repeat(target, "b n -> (v b) n 1", v=2)).squeeze(-1)
        ce1, ce2 = ((c * weight).sum() for c in ce.chunk(2))
        anchor = lp1.detach() if self.stopgrad_anchor else lp1
        tv = (tv_distance(anchor.exp(), lp2.exp()) * weight).sum()
        if self.divergence in ("tv", "tv_symmetric"):
            div = tv
        elif self.divergence == "kl":
            div = (kl_from_log_probs(anchor, lp2) * weight).sum()
        else:
            div = (js_from_log_probs(anchor, lp2) * weight).sum()
        ce_term = {"both": 0.5 * (ce1 + ce2), "few": ce1, "many": ce2, "none": torch.zeros_like(ce1)}[self.ce_views]
        loss = ce_term + self.lam * div
        stats = {"ce_k1": ce1.detach(), "ce_k2": ce2.detach(), "tv": tv.detach(), "k2": k2.float().mean(),
                 self.divergence: div.detach()}
        return loss, stats
