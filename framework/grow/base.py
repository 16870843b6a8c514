"""The growth primitives both layouts share (the framework's own models and transformers'): the depth source map,
layer copies with zeroed residual outputs, noisy copies, and the record of what a growth did (docs/growth.md)."""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from framework.rng import draw_device

DEPTH_METHODS = ("interposition", "stack")
#: Module names (relative to a layer) whose weights are zeroed in depth copies: the residual output projections
#: of attention and of every feed-forward path (framework's dense and MoE blocks).
DEFAULT_ZERO_PATTERNS = ("*attn.proj", "*ffn.proj", "*shared.proj", "*experts.*.proj")

#: new parameter → (source parameter, times the source is repeated along dim 0)
ParamMap = dict[Tensor, tuple[Tensor, int]]


@dataclass
class Growth:
    """What one growth did: the depth source map (new layer j ← source layer sources[j]) and the parameter map."""

    sources: list[int] = field(default_factory=list)
    param_map: ParamMap = field(default_factory=dict)


def depth_sources(n: int, factor: int = 2, method: str = "interposition", ignore_first: int = 0,
                  ignore_last: int = 0) -> list[int]:
    """Source layer of every new layer. Layers < ignore_first or ≥ n − ignore_last appear once.

    interposition: each other layer k times in place (2n − a − b layers for k = 2); stack: k sections, the first
    without the last b layers and the last without the first a ((n − b) + (n − a) layers for k = 2).
    """
    if method not in DEPTH_METHODS:
        raise ValueError(f"depth_method={method!r} is invalid; valid: {', '.join(DEPTH_METHODS)}")
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"depth_factor={factor!r} must be an integer >= 1")
    if ignore_first < 0 or ignore_last < 0 or ignore_first + ignore_last > n:
        raise ValueError(f"ignore_first={ignore_first}, ignore_last={ignore_last} must be >= 0 and sum to at most"
                         f" the number of layers ({n})")
    lo, hi = ignore_first, n - ignore_last
    if factor > 1 and lo >= hi:
        raise ValueError(f"depth_factor={factor} with ignore_first={ignore_first} and ignore_last={ignore_last} leaves"
                         f" no middle layer of the {n} to copy: keep ignore_first + ignore_last below {n}")
    if method == "interposition":
        return [i for i in range(n) for _ in range(factor if lo <= i < hi else 1)]
    out: list[int] = []
    for s in range(factor):
        out += list(range(lo if s > 0 else 0, hi if s < factor - 1 else n))
    return out


def zero_outputs(layer: nn.Module, patterns: Sequence[str] = DEFAULT_ZERO_PATTERNS) -> list[str]:
    """Zero the parameters of the modules in `layer` whose names match `patterns`; returns those names."""
    hits = [(name, m) for name, m in layer.named_modules() if name and any(fnmatch.fnmatchcase(name, p)
                                                                             for p in patterns)]
    if not hits:
        names = ", ".join(name for name, _ in layer.named_modules() if name)
        raise ValueError(f"zero_patterns={list(patterns)} match no module of {type(layer).__name__}; its modules:"
                         f" {names}")
    with torch.no_grad():
        for _, module in hits:
            for p in module.parameters(recurse=False):
                p.zero_()
    return [name for name, _ in hits]


def grow_depth(layers: nn.ModuleList, factor: int = 2, method: str = "interposition", ignore_first: int = 0,
               ignore_last: int = 0, zero_init_copies: bool = False,
               zero_patterns: Sequence[str] = DEFAULT_ZERO_PATTERNS) -> tuple[nn.ModuleList, Growth]:
    """A new ModuleList of `layers` and deep copies (no weight tying). The first occurrence of a source layer is
    the original module; later ones are copies, zeroed at their outputs when `zero_init_copies`."""
    sources = depth_sources(len(layers), factor, method, ignore_first, ignore_last)
    growth, seen, new = Growth(sources=sources), set(), []
    for i in sources:
        if i not in seen:
            seen.add(i)
            new.append(layers[i])
            continue
        clone = copy.deepcopy(layers[i])
        if zero_init_copies:
            zero_outputs(clone, zero_patterns)
        growth.param_map.update({c: (s, 1) for c, s in zip(clone.parameters(), layers[i].parameters(), strict=True)})
        new.append(clone)
    return nn.ModuleList(new), growth


def check_width(factor: int, alpha: float) -> None:
    """ValueError unless the width factor is an integer >= 1 and the noise scale >= 0."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"width_factor={factor!r} must be an integer >= 1")
    if alpha < 0:
        raise ValueError(f"noise_alpha={alpha} must be >= 0")


def noisy_copy(t: Tensor, alpha: float, generator: torch.Generator | None = None) -> Tensor:
    """t + N(0, (α·std(t))²) as a new tensor; exact copy when α = 0, std(t) = 0 or t is on the meta device."""
    out = t.detach().clone()
    if alpha == 0 or t.is_meta or t.numel() < 2:
        return out
    sigma = float(t.detach().double().std())
    if sigma > 0:
        where = draw_device(generator, t.device)
        noise = torch.randn(t.shape, generator=generator, dtype=torch.float64, device=where).to(t.device)
        out += (noise * (alpha * sigma)).to(t.dtype)
    return out


__all__ = ["DEFAULT_ZERO_PATTERNS", "DEPTH_METHODS", "Growth", "ParamMap", "check_width", "depth_sources", "grow_depth",
           "noisy_copy", "zero_outputs"]
