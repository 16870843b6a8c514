"""Samplers for a SUBS masked diffusion LM without time conditioning (MDLM's samplers and LLaDA `generate`).

`model` is any callable `model(tokens[, key_padding_mask=...]) -> logits (batch, seq, vocab)`. Positions of
`x_init` that are not MASK stay fixed and only MASK positions are sampled, so prompts and infilling work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from framework.losses.mdlm import LogLinearSchedule, model_logits, subs_log_probs
from framework.rng import draw_device

REMASKING = ("low_confidence", "random")


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """float64 U(0,1) drawn on the generator's device (so a CPU generator drives a GPU run reproducibly)."""
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=draw_device(generator, device)).to(device)


def gumbel_norm(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """MDLM's `_sample_categorical` noise: argmax(probs / (1e-10 - log(u + 1e-10))) samples Cat(probs / sum)."""
    return 1e-10 - (_uniform(shape, generator, device) + 1e-10).log()


def subs_probs(model: Any, x: Tensor, mask_id: int, key_padding_mask: Tensor | None = None) -> Tensor:
    """p_theta(x_0 | x) under SUBS: no mass on MASK, unmasked positions copied (one network call)."""
    return subs_log_probs(model_logits(model, x, key_padding_mask), x, mask_id).exp()


def ddpm_update(x: Tensor, p_x0: Tensor, move_t: float, move_s: float, mask_id: int, noise: Tensor) -> Tensor:
    """One ancestral step t -> s: q(x_s) ∝ p_x0 * (move_t - move_s), q[MASK] = move_s; unmasked tokens are copied.

    A masked token therefore unmasks with probability (move_t - move_s) / move_t and is never re-masked.
    `noise` is a `gumbel_norm` tensor of shape (*x.shape, vocab).
    """
    q = p_x0.double() * (move_t - move_s)
    q[..., mask_id] = move_s
    sampled = (q / noise).argmax(-1)
    return torch.where(x == mask_id, sampled, x)


def _check(x_init: Tensor, mask_id: int, steps: int, eps: float) -> None:
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps={eps} (the last time of the grid) must be in (0, 1)")
    if x_init.dtype != torch.long:
        raise ValueError(f"x_init must be a LongTensor of token ids, got {x_init.dtype}")


def _noise_removal(model: Any, x: Tensor, mask_id: int, key_padding_mask: Tensor | None) -> Tensor:
    """Final argmax at t = eps: every remaining MASK gets its most likely (non-MASK) token, as MDLM's sampler ends."""
    return subs_log_probs(model_logits(model, x, key_padding_mask), x, mask_id).argmax(-1)


@torch.no_grad()
def ddpm_sample(
    model: Any,
    x_init: Tensor,
    mask_id: int,
    steps: int,
    *,
    eps: float = 1e-5,
    schedule: LogLinearSchedule | None = None,
    generator: torch.Generator | None = None,
    noise_removal: bool = True,
    key_padding_mask: Tensor | None = None,
    on_step: Callable[[int, Tensor], None] | None = None,
) -> Tensor:
    """MDLM `ddpm` sampler: time grid linspace(1, eps, steps+1), one network call and one Gumbel tensor per step.

    Move chances come from `schedule` (default log-linear, eps 1e-3): (1-eps_s) t and (1-eps_s) s.
    `on_step(i, x)` sees the tokens after step i.
    """
    _check(x_init, mask_id, steps, eps)
    schedule = schedule or LogLinearSchedule()
    times = torch.linspace(1.0, eps, steps + 1, dtype=torch.float64)
    x = x_init.clone()
    for i in range(steps):
        move_t, move_s = (float(schedule.move_chance(times[j])) for j in (i, i + 1))
        p_x0 = subs_probs(model, x, mask_id, key_padding_mask)
        noise = gumbel_norm((*x.shape, p_x0.shape[-1]), generator, x.device)
        x = ddpm_update(x, p_x0, move_t, move_s, mask_id, noise)
        if on_step is not None:
            on_step(i, x)
    return _noise_removal(model, x, mask_id, key_padding_mask) if noise_removal else x


@torch.no_grad()
def ddpm_cache_sample(
    model: Any,
    x_init: Tensor,
    mask_id: int,
    steps: int,
    *,
    eps: float = 1e-5,
    generator: torch.Generator | None = None,
    noise_removal: bool = True,
    key_padding_mask: Tensor | None = None,
    on_step: Callable[[int, Tensor], None] | None = None,
) -> tuple[Tensor, int]:
    """MDLM `ddpm_cache`: the `ddpm` transition with move chances t and s (the scale 1-eps cancels in the
    categorical draw), reusing p_x0 while x is unchanged. Returns (tokens, network calls ≤ min(steps, L) + 2),
    where L counts the masked tokens of the whole batch (the cache is shared by the batch, as in MDLM)."""
    _check(x_init, mask_id, steps, eps)
    times = torch.linspace(1.0, eps, steps + 1, dtype=torch.float64)
    x, cache, calls = x_init.clone(), None, 0
    for i in range(steps):
        if cache is None:
            cache, calls = subs_probs(model, x, mask_id, key_padding_mask), calls + 1
        noise = gumbel_norm((*x.shape, cache.shape[-1]), generator, x.device)
        x_next = ddpm_update(x, cache, float(times[i]), float(times[i + 1]), mask_id, noise)
        if not torch.equal(x_next, x):
            cache = None
        x = x_next
        if on_step is not None:
            on_step(i, x)
    if noise_removal:
        x, calls = _noise_removal(model, x, mask_id, key_padding_mask), calls + 1
    return x, calls


def transfer_counts(masked: Tensor, steps: int) -> Tensor:
    """LLaDA `get_num_transfer_tokens`: split each row's mask count evenly over `steps` (remainder first)."""
    total = masked.sum(-1, keepdim=True)
    counts = (total // steps).repeat(1, steps)
    counts += torch.arange(steps, device=masked.device)[None] < (total % steps)
    return counts


@torch.no_grad()
def generate(
    model: Any,
    prompt: Tensor,
    gen_length: int,
    steps: int,
    block_length: int | None = None,
    remasking: str = "low_confidence",
    temperature: float = 0.0,
    *,
    mask_id: int,
    generator: torch.Generator | None = None,
    never_predict: tuple[int, ...] = (),
) -> Tensor:
    """LLaDA generation: x = [prompt, MASK^gen_length]; per step, run the model on the whole sequence (all
    still-masked positions included) and commit the most confident masked positions of the current block.

    `steps` is shared evenly by the `gen_length / block_length` semi-autoregressive blocks; `temperature > 0`
    samples from softmax(logits / temperature) via Gumbel noise instead of taking the argmax. MASK (and the
    `never_predict` ids) are never committed. Returns (B, P + gen_length) token ids without MASK in the answer.
    """
    block_length, num_blocks = _check_generate(gen_length, steps, block_length, remasking, temperature)
    batch, plen = prompt.shape
    x = torch.cat([prompt, prompt.new_full((batch, gen_length), mask_id)], dim=1)
    pos = torch.arange(x.shape[1], device=x.device)
    banned = torch.tensor([mask_id, *never_predict], device=x.device)
    per_block = steps // num_blocks
    for b in range(num_blocks):
        start, end = plen + b * block_length, plen + (b + 1) * block_length
        in_block = (pos >= start) & (pos < end)
        counts = transfer_counts(x[:, start:end] == mask_id, per_block)
        for i in range(per_block):
            x = _commit_step(model, x, in_block, counts[:, i], mask_id, banned, remasking, temperature, generator)
    return x


def _check_generate(
    gen_length: int, steps: int, block_length: int | None, remasking: str, temperature: float
) -> tuple[int, int]:
    """`generate`'s arguments checked; returns the block length (default: one block) and the number of blocks."""
    if remasking not in REMASKING:
        raise ValueError(f"unknown remasking {remasking!r}; valid: {', '.join(REMASKING)}")
    block_length = gen_length if block_length is None else block_length
    if gen_length < 1 or block_length < 1 or gen_length % block_length:
        raise ValueError(f"gen_length={gen_length} must be a positive multiple of block_length={block_length}")
    num_blocks = gen_length // block_length
    if steps < num_blocks or steps % num_blocks:
        raise ValueError(f"steps={steps} must be a positive multiple of the number of blocks ({num_blocks})")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    return block_length, num_blocks


def _commit_step(
    model: Any,
    x: Tensor,
    in_block: Tensor,
    counts: Tensor,
    mask_id: int,
    banned: Tensor,
    remasking: str,
    temperature: float,
    generator: torch.Generator | None,
) -> Tensor:
    """One LLaDA step: predict every position, then commit each row's `counts[row]` most confident still-masked
    positions of the current block (`in_block`) to their prediction."""
    masked = x == mask_id
    logits = model_logits(model, x).double()
    logits[..., banned] = float("-inf")
    if temperature == 0:
        scores = logits
    else:  # Gumbel-max: argmax(logits / T + G) samples softmax(logits / T)
        u = _uniform(logits.shape, generator, x.device).clamp_min(1e-300)
        scores = logits / temperature - (-u.log()).log()
    x0 = scores.argmax(-1)
    if remasking == "low_confidence":
        confidence = F.softmax(logits, dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        confidence = _uniform(x0.shape, generator, x.device)
    confidence = torch.where(masked & in_block, confidence, float("-inf"))
    commit = torch.zeros_like(masked)
    for row in range(x.shape[0]):
        k = int(counts[row])
        if k:
            commit[row, confidence[row].topk(k).indices] = True
    return torch.where(commit, x0, x)
