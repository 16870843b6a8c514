"""Orthogonal growth operators (arXiv 2510.08008; docs/growth.md).

Depth: interpositional layer copying (l1 l1 l2 l2 …) or stacking (l1 l2 … l1 l2 …), optionally with the copies'
output projections zeroed (each copy starts as the identity, so the function is preserved exactly). Width:
noisy expert duplication (E → m·E experts, top-k → m·k, copies = originals + N(0, (α·σ_tensor)²), router rows
duplicated the same way). Every operator returns a map {new parameter: (source parameter, repeats)} so an
optimizer's state can follow the weights. Works on any model whose layers are an `nn.ModuleList` and whose MoE
layers have `router` (Linear dim→E), `experts` (ModuleList), `num_experts` and `top_k`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from framework.grow.base import (  # noqa: F401 - re-exported: framework.grow.ops has always offered them
    DEFAULT_ZERO_PATTERNS,
    DEPTH_METHODS,
    Growth,
    ParamMap,
    check_width,
    depth_sources,
    grow_depth,
    noisy_copy,
    zero_outputs,
)
from framework.grow.hf import (
    decoder_layers,
    expert_matrices,
    grow_hf,
    inactive_expert_params,
    moe_blocks,
    transformers_model,
)

NORM_PARTS = ("experts", "attn", "all")


def is_moe(module: nn.Module) -> bool:
    """Duck-typed MoE layer: has `router`, `experts`, `num_experts` and `top_k`."""
    return all(hasattr(module, a) for a in ("router", "experts", "num_experts", "top_k"))


def find_moe_layers(model: nn.Module) -> list[nn.Module]:
    """Every MoE layer in `model`, in module order."""
    return [m for m in model.modules() if is_moe(m)]


def grow_width(moe: nn.Module, factor: int = 2, alpha: float = 0.01, generator: torch.Generator | None = None,
               top_k_factor: int | None = None) -> Growth:
    """E → factor·E experts: copy j of expert i sits at i + j·E; router rows [j·E, (j+1)·E) = rows [0, E) + noise.

    top_k is multiplied by `top_k_factor` (default `factor`); only then is the α = 0 growth function-preserving.
    """
    check_width(factor, alpha)
    growth = Growth()
    if factor == 1:
        return growth
    old, n = moe.router, moe.num_experts
    with torch.no_grad():
        router = nn.Linear(old.in_features, n * factor, bias=old.bias is not None, device=old.weight.device,
                           dtype=old.weight.dtype)
        for name in ("weight", "bias"):
            src = getattr(old, name)
            if src is not None:
                getattr(router, name).copy_(torch.cat([src] + [noisy_copy(src, alpha, generator)
                                                                for _ in range(factor - 1)]))
                growth.param_map[getattr(router, name)] = (src, factor)
        bias = getattr(moe, "expert_bias", None)  # aux-loss-free balancing bias (DeepSeek-V3), if the layer has one
        if isinstance(bias, Tensor):
            grown = torch.cat([bias] + [noisy_copy(bias, alpha, generator) for _ in range(factor - 1)])
            if isinstance(bias, nn.Parameter):
                grown = nn.Parameter(grown, requires_grad=bias.requires_grad)
                growth.param_map[grown] = (bias, factor)
            moe.expert_bias = grown
        copies = []
        for _ in range(factor - 1):
            for expert in list(moe.experts)[:n]:
                clone = copy.deepcopy(expert)
                for c, s in zip(clone.parameters(), expert.parameters(), strict=True):
                    c.copy_(noisy_copy(s, alpha, generator))
                    growth.param_map[c] = (s, 1)
                copies.append(clone)
    moe.router = router
    moe.experts.extend(copies)
    moe.num_experts = n * factor
    moe.top_k = moe.top_k * (factor if top_k_factor is None else top_k_factor)
    return growth


def grow(model: nn.Module, *, depth_factor: int = 1, depth_method: str = "interposition", ignore_first: int = 0,
         ignore_last: int = 0, zero_init_copies: bool = False, width_factor: int = 1, noise_alpha: float = 0.01,
         seed: int = 0, layers_attr: str = "blocks", zero_patterns: Sequence[str] = DEFAULT_ZERO_PATTERNS,
         top_k_factor: int | None = None) -> Growth:
    """Grow `model` in place: depth first (its `layers_attr` ModuleList), then every MoE layer's width.

    Noise comes from a generator seeded with `seed` (identical on every rank and on replay). A recorded
    `init_config` is updated (`depth`, `num_experts`, `top_k`), so the grown model can be rebuilt by name. A
    transformers MoE model (or the `hf_causal_lm` wrapper holding one) grows in its own layout
    (`framework.grow.hf.grow_hf`; `layers_attr` is not used there).
    """
    if transformers_model(model) is not None:
        return grow_hf(model, depth_factor=depth_factor, depth_method=depth_method, ignore_first=ignore_first,
                       ignore_last=ignore_last, zero_init_copies=zero_init_copies, width_factor=width_factor,
                       noise_alpha=noise_alpha, seed=seed, zero_patterns=zero_patterns, top_k_factor=top_k_factor)
    layers = layer_list(model, layers_attr)
    result = Growth(sources=list(range(len(layers))))
    if depth_factor != 1 or ignore_first or ignore_last:
        new, result = grow_depth(layers, depth_factor, depth_method, ignore_first, ignore_last, zero_init_copies,
                                 zero_patterns)
        setattr(model, layers_attr, new)
    if width_factor != 1:
        moes = find_moe_layers(model)
        if not moes:
            raise ValueError(f"width_factor={width_factor} but {type(model).__name__} has no MoE layer (a module with"
                             " router, experts, num_experts, top_k)")
        generator = torch.Generator().manual_seed(int(seed))
        for moe in moes:
            result.param_map.update(grow_width(moe, width_factor, noise_alpha, generator, top_k_factor).param_map)
    config = getattr(model, "init_config", None)
    if isinstance(config, dict):
        if "depth" in config:
            config["depth"] = len(getattr(model, layers_attr))
        moes = find_moe_layers(model)
        for key in ("num_experts", "top_k"):
            values = {getattr(m, key) for m in moes}
            if key in config and len(values) == 1:
                config[key] = values.pop()
    return result


def layer_list(model: nn.Module, layers_attr: str = "blocks") -> nn.ModuleList:
    """The layers growth copies: `model.<layers_attr>`, or a transformers model's decoder layers."""
    hf = transformers_model(model)
    layers = decoder_layers(hf) if hf is not None else getattr(model, layers_attr, None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__}.{layers_attr} is not an nn.ModuleList of layers (got"
                         f" {type(layers).__name__}); pass layers_attr= naming the model's layer list")
    return layers


def count_params(model: nn.Module) -> dict[str, int]:
    """Total and active (per token) parameters: an MoE layer's experts count top_k/num_experts of their size."""
    total = sum(p.numel() for p in model.parameters())
    hf = transformers_model(model)
    inactive = inactive_expert_params(hf) if hf is not None else 0
    for moe in find_moe_layers(model):
        experts = sum(p.numel() for p in moe.experts.parameters())
        inactive += experts - experts * moe.top_k // moe.num_experts
    return {"total": total, "active": total - inactive}


def _rms(p: Tensor) -> float:
    return float(p.detach().double().norm() / math.sqrt(p.numel()))


def norm_profile(layers: Iterable[nn.Module], part: str = "experts") -> list[float]:
    """The paper's per-layer weight norm ‖W‖_F/sqrt(numel), averaged over matrices (and experts) of each layer.

    part: `experts` (every expert matrix of the layer's MoE), `attn` (attention matrices), `all` (every ≥2-D
    parameter of the layer).
    """
    if part not in NORM_PARTS:
        raise ValueError(f"part={part!r} is invalid; valid: {', '.join(NORM_PARTS)}")
    profile = []
    for layer in layers:
        if part == "experts":
            mats = [p for moe in find_moe_layers(layer) for p in moe.experts.parameters() if p.ndim >= 2]
            mats += [m for block in moe_blocks(layer) for m in expert_matrices(block)]  # transformers' fused
        else:
            mats = [p for name, p in layer.named_parameters() if p.ndim >= 2 and (part == "all" or "attn" in name)]
        if not mats:
            raise ValueError(f"layer {type(layer).__name__} has no {part} matrices for the norm profile")
        profile.append(sum(_rms(p) for p in mats) / len(mats))
    return profile


def _root(p: Tensor, param_map: ParamMap, known: Any) -> tuple[Tensor, int] | None:
    reps = 1
    while p not in known:
        if p not in param_map:
            return None
        p, r = param_map[p]
        reps *= r
    return p, reps


def _repeat(value: Any, source: Tensor, reps: int) -> Any:
    if not isinstance(value, Tensor):
        return copy.deepcopy(value)
    if reps > 1 and value.ndim >= 1 and value.shape == source.shape:
        return value.repeat(reps, *([1] * (value.ndim - 1)))
    return value.clone()


def transfer_optimizer_state(old: torch.optim.Optimizer, new: torch.optim.Optimizer, param_map: ParamMap) -> int:
    """Give every parameter of `new` the state of its source in `old` (originals keep theirs, copies get a
    clone, row-duplicated tensors the state repeated along dim 0; no noise). Returns how many got state."""
    moved = 0
    for group in new.param_groups:
        for p in group["params"]:
            found = _root(p, param_map, old.state)
            if found is None:
                continue
            src, reps = found
            state = old.state[src]
            new.state[p] = state if src is p else {k: _repeat(v, src, reps) for k, v in state.items()}
            moved += 1
    return moved
