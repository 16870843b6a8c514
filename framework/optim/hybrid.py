"""Parameter routing shared by OLion and MuonAdamW: hidden matrices to the orthogonal branch, rest to AdamW.

Spec: shared/specs/olion_growth.md §1.5 ("which parameters go to OLion"). Embeddings, heads, norms, biases,
tokens and all 1-D/scalar params go to AdamW; ≥2-D hidden weights (Linear, conv viewed as (out, in·k…)) go to
the orthogonal branch. The predicate is user-overridable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor

from framework.optim.newton_schulz import check_ns_form

Predicate = Callable[[str, Tensor], bool]

# A name is "not hidden" when any dot-separated part contains one of these substrings ...
NON_HIDDEN_SUBSTRINGS = ("emb", "norm", "bias", "token")
# ... or equals one of these module names (`output` is torchtitan's Llama head, `stem` a first conv) ...
NON_HIDDEN_PARTS = ("wte", "wpe", "lm_head", "head", "output", "final_layer", "classifier", "fc_norm", "stem")
# ... or starts with this prefix (ln_1, ln_f, ln1: GPT-style LayerNorms).
NON_HIDDEN_PREFIXES = ("ln",)


#: Options of the hybrid optimizers that must be >= 0 (None means "same as the main value").
NON_NEGATIVE_OPTIONS = ("lr", "adamw_lr", "weight_decay", "adamw_weight_decay", "eps", "adamw_eps")


def check_betas(name: str, betas: Any) -> None:
    """ValueError unless `betas` is two values, each in [0, 1)."""
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{name}={tuple(betas)!r} is invalid: need two values, each in [0, 1)")


def check_options(opts: dict[str, Any]) -> None:
    """ValueError naming the bad value and its valid range, for the options of OLion and MuonAdamW that `opts`
    holds (non-negative rates, `betas`/`adamw_betas`, `momentum`, `ns_steps`)."""
    for key in NON_NEGATIVE_OPTIONS:
        v = opts.get(key)
        if v is not None and not v >= 0.0:
            raise ValueError(f"{key}={v!r} is invalid: must be >= 0")
    if "momentum" in opts and not 0.0 <= opts["momentum"] < 1.0:
        raise ValueError(f"momentum={opts['momentum']!r} is invalid: must be in [0, 1)")
    for key in ("betas", "adamw_betas"):
        if key in opts:
            check_betas(key, opts[key])
    check_ns_form(opts.get("ns_form", "auto"))
    ns = opts.get("ns_steps", 1)
    if isinstance(ns, bool) or not isinstance(ns, int) or ns < 1:
        raise ValueError(f"ns_steps={ns!r} is invalid: must be an integer >= 1")


def is_hidden_matrix(name: str, p: Tensor) -> bool:
    """Default routing (§1.5): True for ≥2-D weights whose name marks no embedding/head/norm/bias/token.

    Names are matched per dot-separated part, so a first conv named `stem` (or `patch_embed`) goes to AdamW,
    and so does BERT's `attention.output.dense` (pass a predicate there). ≥3-D tensors count as conv kernels,
    viewed as (out, in·k…); stacked MoE expert weights (E, out, in) would be viewed the same way, so route
    those with a custom predicate. Unnamed tensors (name "") are routed by ndim alone.
    """
    if p.ndim < 2:
        return False
    for part in name.lower().split("."):
        if any(s in part for s in NON_HIDDEN_SUBSTRINGS):
            return False
        if part in NON_HIDDEN_PARTS or part.startswith(NON_HIDDEN_PREFIXES):
            return False
    return True


def param_label(name: str, p: Tensor) -> str:
    """How errors name a parameter: its name if known, else its shape."""
    shape = tuple(p.shape)
    return f"parameter {name!r} (shape {shape})" if name else f"unnamed parameter of shape {shape}"


def normalize_param_groups(params: Iterable[Any]) -> list[dict[str, Any]]:
    """Turn tensors, (name, tensor) pairs or param-group dicts into a list of group dicts (not yet split)."""
    items = list(params)
    if not items:
        raise ValueError("optimizer got an empty parameter list")
    if isinstance(items[0], dict):
        return [dict(g) for g in items]
    return [{"params": items}]


def named_params_of(group: dict[str, Any]) -> tuple[list[str], list[Tensor], bool]:
    """(names, tensors, named) of one group; names are "" for plain tensors."""
    raw = group["params"]
    raw = [raw] if isinstance(raw, Tensor) else list(raw)
    names = list(group.get("param_names", []))
    tensors: list[Tensor] = []
    for item in raw:
        if isinstance(item, tuple):
            names.append(item[0])
            tensors.append(item[1])
        else:
            tensors.append(item)
    named = bool(names)
    if named and len(names) != len(tensors):
        raise ValueError(f"got {len(names)} parameter names for {len(tensors)} parameters; name all or none")
    return (names if named else [""] * len(tensors)), tensors, named


def split_group(group: dict[str, Any], predicate: Predicate) -> dict[str, dict[str, Any]]:
    """Split one group into {"hidden", "decay", "no_decay"} sub-groups (empty ones dropped).

    hidden: predicate(name, p) is True; decay: other ≥2-D params (embeddings, heads); no_decay: 1-D and scalar
    params (norm gains, biases), which the AdamW branch never decays. Each sub-group keeps its names, if any.
    """
    names, tensors, named = named_params_of(group)
    parts: dict[str, tuple[list[str], list[Tensor]]] = {k: ([], []) for k in ("hidden", "decay", "no_decay")}
    for name, p in zip(names, tensors, strict=True):
        kind = "hidden" if predicate(name, p) else ("decay" if p.ndim >= 2 else "no_decay")
        parts[kind][0].append(name)
        parts[kind][1].append(p)
    out: dict[str, dict[str, Any]] = {}
    for kind, (ns, ps) in parts.items():
        if ps:
            out[kind] = {"params": ps, **({"param_names": ns} if named else {})}
    return out


def check_not_sharded(name: str, p: Tensor, who: str) -> None:
    """Refuse FSDP1 flat params: a flat shard mixes many parameters, so no matrix can be rebuilt from it."""
    if getattr(p, "_is_flat_param", False):
        raise NotImplementedError(
            f"{who} got a sharded {param_label(name, p)} ({type(p).__name__}), an FSDP1 flat parameter; "
            "orthogonalising a shard is not orthogonalising the matrix. Use DDP, or FSDP2 (fully_shard), whose "
            "DTensor parameters OLion gathers per matrix."
        )
