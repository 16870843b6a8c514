"""Parameter routing shared by OLion and MuonAdamW: hidden matrices to the orthogonal branch, rest to AdamW.

Embeddings, heads, norms, biases, tokens, a convnet's stem and classifier and all 1-D/scalar params go to AdamW
(names matched by whole words; `convnet_edges` by position); ≥2-D hidden weights (Linear, conv viewed as
(out, in·k…)) go to the orthogonal branch. The predicate is user-overridable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import Tensor

from framework.optim.newton_schulz import check_ns_form

Predicate = Callable[[str, Tensor], bool]

# A name is "not hidden" when one of its words (each dot-separated part split at "_", digits and case changes:
# `patch_embed` → patch, embed; `norm1` → norm; `LayerNorm` → layer, norm) is one of these: embeddings, learned
# tokens, norms, biases (whole words, so `member_proj` or `assembly` stays hidden) ...
NOT_A_LAYER_WORDS = frozenset({
    "emb", "embed", "embeds", "embedding", "embeddings", "wte", "wpe", "token", "tokens",
    "norm", "layernorm", "rmsnorm", "groupnorm", "batchnorm", "ln", "bias",
})  # fmt: skip
NON_HIDDEN_WORDS = NOT_A_LAYER_WORDS | {"stem"}  # `stem`, `conv_stem`: a first conv
# ... or a whole part is one of these module names (`output` is torchtitan's Llama head).
NON_HIDDEN_PARTS = frozenset({"lm_head", "head", "output", "final_layer", "classifier"})

#: AdamW branch's lr of OLion and MuonAdamW unless `adamw_lr` is given: a fixed value, so raising the orthogonal
#: branch's lr leaves embeddings, heads, norms and biases where AdamW wants them (`adamw_lr=None` ties it to `lr`).
DEFAULT_ADAMW_LR = 1e-3

#: A convnet's stem reads the raw input: RGB(A) or grey images.
STEM_MAX_IN_CHANNELS = 4

_CASE_CHANGE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NOT_LETTERS = re.compile(r"[^a-z]+")


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


def name_words(part: str) -> list[str]:
    """The lower-case words of one dot-separated name part: split at non-letters and lower→upper case changes."""
    return [w for w in _NOT_LETTERS.split(_CASE_CHANGE.sub("_", part).lower()) if w]


def _has_word(name: str, words: frozenset[str]) -> bool:
    return any(w in words for part in name.split(".") for w in name_words(part))


def is_hidden_matrix(name: str, p: Tensor) -> bool:
    """Name routing: True for ≥2-D weights whose name marks no embedding, token, norm, bias, stem or head.

    Whole words and parts are matched, never substrings (`NON_HIDDEN_WORDS`, `NON_HIDDEN_PARTS`): `patch_embed`,
    `cls_token`, `conv_stem`, `lm_head` go to AdamW, `member_proj` stays hidden; BERT's `attention.output.dense`
    stays hidden (`output` counts only as the module owning the weight, torchtitan's `output.weight`). ≥3-D tensors
    count as conv kernels, viewed as (out, in·k…), except stacked MoE experts (`is_expert_stack`: 3-D under an
    `experts` module, (E, out, in)), which are orthogonalised per expert. Unnamed tensors (name "") are routed by
    ndim alone. OLion and MuonAdamW also send a convnet's stem and classifier to AdamW when they route by default
    (`convnet_edges`).
    """
    if p.ndim < 2:
        return False
    return not (_has_word(name, NON_HIDDEN_WORDS) or _is_head(name))


def _is_head(name: str) -> bool:
    """A head part anywhere in the name (`lm_head.weight`, timm's `head.fc.weight`), or `output` as the module that
    owns the parameter (torchtitan's `output.weight`; BERT's `attention.output.dense` is a hidden layer)."""
    parts = name.split(".")
    owner = parts[-2].lower() if len(parts) >= 2 else ""
    return owner in ("output",) or any(part.lower() in NON_HIDDEN_PARTS - {"output"} for part in parts)


#: the module name under which transformers 5 stores an MoE layer's experts as fused 3-D tensors
#: (`mlp.experts.gate_up_proj` of shape (experts, out, in)): Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, ...
EXPERTS_PART = "experts"


def is_expert_stack(name: str, p: Tensor) -> bool:
    """True for a 3-D tensor of stacked MoE experts (a part of its name is `experts`): each expert's (out, in)
    matrix is orthogonalised on its own, in one batched Newton–Schulz call, never flattened to one matrix."""
    return p.ndim == 3 and EXPERTS_PART in name.split(".")


def expert_stack_flags(group: dict[str, Any]) -> list[bool]:
    """One bool per parameter of a group: `is_expert_stack` by its name (unnamed tensors: False)."""
    names = group.get("param_names") or [""] * len(group["params"])
    return [is_expert_stack(str(n), p) for n, p in zip(names, group["params"], strict=True)]


def convnet_edges(named: Sequence[tuple[str, Tensor]]) -> list[int]:
    """Positions in `named` (registration order) of a convnet's stem and classifier, which go to AdamW (Muon's
    convention: the network's input and output layers are not hidden layers).

    Only layer weights count: ≥2-D parameters whose name marks no embedding, token, norm or bias. The stem is the
    first of them when it is a conv kernel reading at most `STEM_MAX_IN_CHANNELS` channels, an image's (ResNet's
    `conv1`: a frozen stem or part of a network starts with a wider conv, which stays hidden); the classifier is the
    last when it is a matrix right after a conv kernel (ResNet's `fc` on pooled conv features). Unnamed parameters
    are skipped.
    """
    layers = [i for i, (name, p) in enumerate(named) if name and p.ndim >= 2 and not _has_word(name, NOT_A_LAYER_WORDS)]
    edges = []
    if layers and named[layers[0]][1].ndim >= 3 and named[layers[0]][1].shape[1] <= STEM_MAX_IN_CHANNELS:
        edges.append(layers[0])
    if len(layers) >= 2 and named[layers[-1]][1].ndim == 2 and named[layers[-2]][1].ndim >= 3:
        edges.append(layers[-1])
    return edges


def edge_ids(groups: list[Any]) -> set[int]:
    """`id()`s of the tensors `convnet_edges` picks among all named parameters of `groups` (materialised groups:
    dicts whose "params" are lists, or (name, tensor) pairs / tensors)."""
    named: list[tuple[str, Tensor]] = []
    for group in groups:
        items = group["params"] if isinstance(group, dict) else [group]
        items = [items] if isinstance(items, Tensor) else items
        names = list(group.get("param_names", [])) if isinstance(group, dict) else []
        for k, item in enumerate(items):
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Tensor):
                named.append((str(item[0]), item[1]))
            elif isinstance(item, Tensor):
                named.append((names[k] if k < len(names) else "", item))
    return {id(named[i][1]) for i in convnet_edges(named)}


def materialise(params: Any) -> Any:
    """`params` as lists (a generator read once here is still there for torch), groups copied; a tensor or
    anything else torch refuses is returned unchanged, for torch's own error."""
    if isinstance(params, Tensor) or not isinstance(params, Iterable):
        return params
    items = list(params)
    keep = Tensor | set | None  # torch wraps a tensor and refuses a set itself
    return [{**g, "params": g["params"] if isinstance(g.get("params"), keep) else list(g["params"])}
            if isinstance(g, dict) else g for g in items]


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
