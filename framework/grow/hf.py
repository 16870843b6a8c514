"""Orthogonal growth of transformers MoE models in transformers' own layouts (docs/growth.md, its table of families).

transformers 5 keeps a sparse MoE block in a decoder layer (`mlp`, GraniteMoE's `block_sparse_moe`): a router (`gate`,
or `router` in gpt-oss and GraniteMoE: a 2-D `weight` (E, hidden), `top_k`, `num_experts`, maybe a bias or an
expert-indexed buffer) and `experts`, fused tensors with the expert on dim 0 ((E, out, in), gpt-oss's (E, in, out)
with biases); beside them maybe shared experts, and plain-MLP dense layers. Growth is written once against this
layout, duck-typed, without importing transformers:

* depth: the decoder layers grow by `framework.grow.base.grow_depth`, every `layer_idx` renumbered (KV cache);
* width: expert tensors and router rows repeated along the expert dim (copy j of expert i at i + j·E), each copy
  plus N(0, (α·σ)²) (σ: that expert's tensor, or the router's whole weight / bias), expert-indexed buffers repeated
  exactly, top-k and group-limited routing's groups × factor (the copies form groups mirroring the originals);
  `check_routing` first proves the routing kept at α = 0, else the family is refused by name;
* the config follows (layer count and types, dense layers, expert counts, groups, scale), so do the attributes the
  modules copied from it, and the wrapper's recorded config.

`zero_init_copies` zeroes each copied layer's residual outputs (`HF_ZERO_PATTERNS`), in the families a test proves
(`ZERO_INIT_FAMILIES`), so the grown model computes the same logits.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from framework.grow.base import DEFAULT_ZERO_PATTERNS, Growth, check_width, depth_sources, grow_depth, noisy_copy

#: parameter or module names, relative to a decoder layer, of its residual outputs (zeroed in depth copies)
HF_ZERO_PATTERNS = ("self_attn.o_proj", "mlp.experts.down_proj", "mlp.experts.down_proj_bias",
                    "mlp.shared_expert.down_proj", "mlp.shared_experts.down_proj", "mlp.down_proj",
                    "block_sparse_moe.experts.down_proj", "shared_mlp.output_linear", "mamba.out_proj")
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "top_k")
#: the families whose residual outputs HF_ZERO_PATTERNS names, each proven by a test to keep the logits (issue 43)
ZERO_INIT_FAMILIES = frozenset({"mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "granitemoe",
                                "granitemoeshared", "granitemoehybrid"})
#: group-limited routing (DeepSeek-V3): groups of experts, and how many groups a token may pick from (config, router)
GROUP_KEYS = ("n_group", "num_group", "topk_group")
ROUTER_NAMES = ("gate", "router")


def transformers_model(model: nn.Module) -> nn.Module | None:
    """The transformers model in `model` (a framework `hf_causal_lm` wrapper's `.hf`, or `model` itself), else None."""
    inner = getattr(model, "hf", model)
    config = getattr(inner, "config", None)
    if isinstance(inner, nn.Module) and isinstance(getattr(config, "model_type", None), str) \
            and hasattr(inner, "base_model"):
        return inner
    return None


def decoder_layers(hf: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (`model.layers`)."""
    layers = getattr(hf.base_model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(hf).__name__} ({hf.config.model_type}) keeps no decoder layers at "
                         "base_model.layers; orthogonal growth knows transformers' decoder-only layouts")
    return layers


def router_of(module: nn.Module) -> nn.Module | None:
    """The router of a sparse MoE block: its `gate` (Mixtral, OLMoE, Qwen-MoE, DeepSeek-V3) or `router` (gpt-oss,
    GraniteMoE), a module with a 2-D `weight` (E, hidden); None if it has neither."""
    for name in ROUTER_NAMES:
        weight = getattr(getattr(module, name, None), "weight", None)
        if isinstance(weight, Tensor) and weight.ndim == 2:
            return getattr(module, name)
    return None


def is_moe_block(module: nn.Module) -> bool:
    """A transformers sparse MoE block: a router (`router_of`), `experts` holding fused 3-D tensors (expert on dim 0,
    whether each is (E, out, in) or gpt-oss's (E, in, out))."""
    router, experts = router_of(module), getattr(module, "experts", None)
    return (router is not None and isinstance(experts, nn.Module)
            and any(p.ndim == 3 and p.shape[0] == router.weight.shape[0] for p in experts.parameters(recurse=False)))


def moe_blocks(module: nn.Module) -> list[nn.Module]:
    """Every transformers sparse MoE block in `module`, in module order."""
    return [m for m in module.modules() if is_moe_block(m)]


def block_counts(block: nn.Module) -> tuple[int, int]:
    """(experts, experts per token) of a sparse MoE block."""
    router = router_of(block)
    return int(router.weight.shape[0]), int(router.top_k)


def expert_matrices(block: nn.Module) -> list[Tensor]:
    """Each expert's matrices of a sparse MoE block (slices of the fused tensors)."""
    return [m for p in block.experts.parameters(recurse=False) if p.ndim == 3 for m in p.detach().unbind(0)]


def check_moe(hf: nn.Module) -> list[nn.Module]:
    """The model's sparse MoE blocks; ValueError for a dense model (orthogonal growth grows MoE models)."""
    blocks = moe_blocks(hf)
    if not blocks:
        raise ValueError(f"{type(hf).__name__} (model_type {hf.config.model_type!r}) is a dense model: orthogonal"
                         " growth grows mixture-of-experts models (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3,"
                         " gpt-oss, GraniteMoE, ...), whose layers have a router (`gate` or `router`) and fused"
                         " `experts`")
    return blocks


def _set_counts(modules: Sequence[Any], keys: Sequence[str], old: int, new: int) -> None:
    """Set every int attribute named in `keys` that holds `old` to `new` (aliases set once: the second reads new)."""
    for module in modules:
        for key in keys:
            if isinstance(getattr(module, key, None), int) and not isinstance(getattr(module, key), bool) \
                    and getattr(module, key) == old:
                setattr(module, key, new)


def _noisy_rows(t: Tensor, factor: int, alpha: float, generator: torch.Generator | None, per_row: bool) -> Tensor:
    """[t, t + noise, ...] along dim 0 (`factor` blocks); the noise scale is each row's std (`per_row`: an expert's
    matrix) or the whole tensor's (a router)."""
    blocks = [t.detach().clone()]
    for _ in range(factor - 1):
        if per_row:
            blocks.append(torch.stack([noisy_copy(row, alpha, generator) for row in t.detach().unbind(0)]))
        else:
            blocks.append(noisy_copy(t, alpha, generator))
    return torch.cat(blocks)


def sums_own_scores(router: nn.Module) -> bool:
    """A DeepSeek-V3 router (sigmoid scores, a score-correction bias) without `norm_topk_prob`: each chosen expert
    weighs its own score, so both copies of an expert would carry its full weight; growth divides
    `routed_scaling_factor` by the factor (`check_routing` verifies it)."""
    return (getattr(router, "norm_topk_prob", True) is False and hasattr(router, "e_score_correction_bias")
            and isinstance(getattr(router, "routed_scaling_factor", None), (int, float)))


def _carry_routing(modules: Sequence[Any], factor: int, own_scores: bool) -> None:
    """Group-limited routing's group counts × factor (copy j of expert i sits at i + j·E: the copies form groups of
    their own that mirror the originals, so twice the groups are picked); a sum of own scores ÷ factor."""
    for module in modules:
        for key in GROUP_KEYS:
            if isinstance(getattr(module, key, None), int) and not isinstance(getattr(module, key), bool):
                setattr(module, key, getattr(module, key) * factor)
        if own_scores and isinstance(getattr(module, "routed_scaling_factor", None), (int, float)):
            module.routed_scaling_factor = module.routed_scaling_factor / factor


def grow_block_width(block: nn.Module, factor: int = 2, alpha: float = 0.01, generator: torch.Generator | None = None,
                     top_k_factor: int | None = None) -> Growth:
    """E → factor·E experts in one sparse MoE block: the fused expert tensors (and their biases) and the router's
    rows (weight, bias) repeated along dim 0 with noise, a router buffer indexed by expert (DeepSeek-V3's
    score-correction bias) repeated exactly; top-k × factor, and the routing's groups and scale carried."""
    check_width(factor, alpha)
    growth = Growth()
    if factor == 1:
        return growth
    router = router_of(block)
    n, k = block_counts(block)
    own_scores = sums_own_scores(router)
    with torch.no_grad():
        for owner, per_expert in ((router, False), (block.experts, True)):
            for name, p in list(owner.named_parameters(recurse=False)):
                if p.shape[0] != n:
                    continue
                grown = nn.Parameter(_noisy_rows(p, factor, alpha, generator, per_expert and p.ndim >= 2),
                                     requires_grad=p.requires_grad)
                setattr(owner, name, grown)
                growth.param_map[grown] = (p, factor)
            for name, b in list(owner.named_buffers(recurse=False)):
                if b is not None and b.ndim >= 1 and b.shape[0] == n:
                    owner.register_buffer(name, torch.cat([b] * factor),
                                          persistent=name not in owner._non_persistent_buffers_set)
    k_new = k * (factor if top_k_factor is None else top_k_factor)
    parts = [block, router, block.experts]
    _set_counts(parts, EXPERT_COUNT_KEYS, n, n * factor)
    _set_counts(parts, TOP_K_KEYS, k, k_new)
    _carry_routing(parts, factor, own_scores)
    return growth


def check_routing(hf: nn.Module, block: nn.Module, factor: int, tokens: int = 64) -> None:
    """ValueError naming the family unless width growth at α = 0 keeps what `block`'s router does: on random tokens
    (their own generator), the weight each expert gets equals the sum over its copies after growth. Runs on a copy
    of the router alone (fp32); skipped on the meta device."""
    router = router_of(block)
    if router.weight.is_meta:
        return
    n, _ = block_counts(block)
    probe = nn.Module()
    probe.gate, probe.experts = copy.deepcopy(router).float(), nn.Module()
    probe.experts.w = nn.Parameter(torch.zeros(n, 1, 1, device=router.weight.device))
    before = copy.deepcopy(probe.gate)
    grow_block_width(probe, factor, 0.0)
    generator = torch.Generator(router.weight.device).manual_seed(0)
    x = torch.randn(tokens, router.weight.shape[1], generator=generator, device=generator.device)
    name = f"{hf.config.model_type} ({type(router).__name__})"
    with torch.no_grad():
        try:
            ref, new = (_expert_weights(r, x.to(router.weight.device), e) for r, e in
                        ((before, n), (probe.gate, n * factor)))
        except (TypeError, ValueError, IndexError, RuntimeError) as err:
            raise ValueError(f"{name}: its router, grown, does not give (logits, weights, indices) per token ({err}),"
                             " so width growth cannot show that it keeps the function; grow it in depth only") from err
    err = (new.view(tokens, factor, n).sum(1) - ref).abs().max().item()
    if err > 1e-5 * max(1.0, ref.abs().max().item()):
        raise ValueError(f"{name}: width growth would change its routing (an expert's weight and the sum over its "
                         f"copies differ by up to {err:.3g} at noise 0); orthogonal growth keeps the function only for "
                         "routers whose copies share their original's weight; grow it in depth only")


def _expert_weights(router: nn.Module, x: Tensor, n: int) -> Tensor:
    """(tokens, n): the weight `router` gives each expert (0 where not chosen)."""
    _, weights, indices = router(x)[:3]
    return torch.zeros(x.shape[0], n, device=x.device).scatter_add_(1, indices.long(), weights.float())


def zero_parameters(layer: nn.Module, patterns: Sequence[str] = HF_ZERO_PATTERNS) -> list[str]:
    """Zero the parameters of `layer` named by `patterns` (a module's name: its own parameters; a parameter's name:
    that tensor); ValueError if none matches. Returns the parameter names zeroed."""
    hits = []
    with torch.no_grad():
        for name, p in layer.named_parameters():
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            if any(fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(owner, pat) for pat in patterns):
                p.zero_()
                hits.append(name)
    if not hits:
        raise ValueError(f"zero_patterns={list(patterns)} match no parameter of {type(layer).__name__}")
    return hits


def grow_hf(model: nn.Module, *, depth_factor: int = 1, depth_method: str = "interposition", ignore_first: int = 0,
            ignore_last: int = 0, zero_init_copies: bool = False, width_factor: int = 1, noise_alpha: float = 0.01,
            seed: int = 0, zero_patterns: Sequence[str] = HF_ZERO_PATTERNS, top_k_factor: int | None = None) -> Growth:
    """Grow a transformers MoE model (or the framework wrapper holding it) in place: depth, then every block's
    width; the config, the attention layers' `layer_idx`, and the wrapper's recorded config follow. ValueError,
    before anything changes, where the grown config cannot say the dense layers, the routing would not be kept at
    α = 0 (`check_routing`), or zero_init_copies meets a family not in ZERO_INIT_FAMILIES with the default patterns."""
    hf = transformers_model(model)
    if hf is None:
        raise ValueError(f"{type(model).__name__} is not a transformers model")
    blocks = check_moe(hf)
    config = hf.config
    layers = decoder_layers(hf)
    dense = [not moe_blocks(layer) for layer in layers]
    result = Growth(sources=list(range(len(layers))))
    if tuple(zero_patterns) == DEFAULT_ZERO_PATTERNS:  # the framework's own names: use transformers'
        zero_patterns = HF_ZERO_PATTERNS
    deep = depth_factor != 1 or ignore_first or ignore_last
    if deep:  # every refusal before the model changes
        unproven = config.model_type not in ZERO_INIT_FAMILIES
        if zero_init_copies and tuple(zero_patterns) == HF_ZERO_PATTERNS and unproven:
            raise ValueError(f"zero_init_copies: the residual outputs of {config.model_type} are not known to be named "
                             f"by HF_ZERO_PATTERNS (proven for {', '.join(sorted(ZERO_INIT_FAMILIES))}); name them "
                             "with zero_patterns=, or grow without zero_init_copies")
        sources = depth_sources(len(layers), depth_factor, depth_method, ignore_first, ignore_last)
        layer_config = _grown_layer_config(config, sources, dense)
    if width_factor != 1:
        check_width(width_factor, noise_alpha)
        if top_k_factor in (None, width_factor):  # another top-k asks for another function
            check_routing(hf, blocks[0], width_factor)
    if deep:
        new, result = grow_depth(layers, depth_factor, depth_method, ignore_first, ignore_last, False)
        seen: set[int] = set()
        for layer, source in zip(new, result.sources, strict=True):
            if source in seen and zero_init_copies:
                zero_parameters(layer, zero_patterns)
            seen.add(source)
        hf.base_model.layers = new
        _renumber(new)
        for key, value in layer_config.items():
            setattr(config, key, value)
    if width_factor != 1:
        generator = torch.Generator().manual_seed(int(seed))
        blocks = moe_blocks(hf)
        n, k = block_counts(blocks[0])
        own_scores = sums_own_scores(router_of(blocks[0]))
        for block in blocks:
            result.param_map.update(grow_block_width(block, width_factor, noise_alpha, generator,
                                                     top_k_factor).param_map)
        n_new, k_new = block_counts(blocks[0])
        _set_counts([config, hf], EXPERT_COUNT_KEYS, n, n_new)
        _set_counts([config, hf], TOP_K_KEYS, k, k_new)
        _carry_routing([config], width_factor, own_scores)
    _record(model, hf)
    return result


def _renumber(layers: nn.ModuleList) -> None:
    """Every module of layer j that carries a `layer_idx` (its attention: the KV cache's index) gets j."""
    for j, layer in enumerate(layers):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = j


def _grown_layer_config(config: Any, sources: list[int], dense: list[bool]) -> dict[str, Any]:
    """num_hidden_layers, layer_types and the dense layers (Qwen-MoE's list, DeepSeek-V3's first k) of the grown
    stack (new layer j ← sources[j]), as config values to set; ValueError where the config cannot say them."""
    updates: dict[str, Any] = {"num_hidden_layers": len(sources)}
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == len(dense):
        updates["layer_types"] = [layer_types[s] for s in sources]
    grown = [dense[s] for s in sources]
    if hasattr(config, "mlp_only_layers"):
        updates["mlp_only_layers"] = [j for j, d in enumerate(grown) if d]
        if hasattr(config, "decoder_sparse_step"):
            updates["decoder_sparse_step"] = 1  # the explicit list says which layers are dense
    elif isinstance(getattr(config, "first_k_dense_replace", None), int):
        k = sum(grown)
        if grown != [j < k for j in range(len(grown))]:
            raise ValueError(f"{config.model_type}: its dense layers are the first first_k_dense_replace="
                             f"{config.first_k_dense_replace}, and this growth puts dense layers after MoE ones "
                             f"(grown layers from {sources}); interpose, or stack with ignore_first >= "
                             f"{config.first_k_dense_replace}")
        updates["first_k_dense_replace"] = k
    elif any(dense):
        raise ValueError(f"{config.model_type}: a dense layer among MoE layers that its config cannot list "
                         "(no mlp_only_layers); grow it in width only")
    return updates


def _record(model: nn.Module, hf: nn.Module) -> None:
    """The wrapper's recorded config describes the grown model: its transformers config, the tokenizer still from
    the source; the cached gate shape (RLKV) is dropped."""
    model.__dict__.pop("_gate_shape", None)
    recorded = getattr(model, "init_config", None)
    if model is hf or not isinstance(recorded, dict):
        return
    grown = {k: v for k, v in hf.config.to_dict().items() if k not in ("transformers_version", "_name_or_path")}
    source = recorded.get("name_or_path") or recorded.get("tokenizer")
    recorded.update(name_or_path=None, config=grown, tokenizer=source)  # `revision`: the tokenizer's


def inactive_expert_params(hf: nn.Module) -> int:
    """Parameters of the experts not active per token in a transformers MoE (to subtract from the total)."""
    inactive = 0
    for block in moe_blocks(hf):
        n, k = block_counts(block)
        size = sum(p.numel() for p in block.experts.parameters(recurse=False) if p.shape[0] == n)
        inactive += size - size * k // n
    return inactive


__all__ = ["HF_ZERO_PATTERNS", "check_moe", "check_routing", "decoder_layers", "expert_matrices", "grow_block_width",
           "grow_hf", "is_moe_block", "moe_blocks", "router_of", "sums_own_scores", "transformers_model",
           "zero_parameters"]
