"""Orthogonal growth of transformers MoE models in transformers' own layouts (docs/growth.md).

transformers 5 keeps a sparse MoE block as `mlp` of a decoder layer: a router `gate` (its `weight` is (E, hidden),
with `top_k` and `num_experts`) and `experts`, whose weights are fused 3-D tensors with the expert on dim 0
(`gate_up_proj` (E, 2I, hidden), `down_proj` (E, hidden, I)); Qwen-MoE adds a `shared_expert` beside them, and
its dense layers (`mlp_only_layers`, `decoder_sparse_step`) have a plain MLP. Mixtral, OLMoE, Qwen2-MoE and
Qwen3-MoE share this layout, so growth is written once against it, duck-typed, without importing transformers:

* depth: the decoder layers (`model.model.layers`) grow by `framework.grow.base.grow_depth` (interposition or stack,
  `ignore_first` / `ignore_last` layers inserted once), and every attention's `layer_idx` is renumbered, so a KV
  cache built from the grown config lines up and `generate()` works;
* width: every fused expert tensor and the router's rows are repeated along the expert dim (copy j of expert i at
  i + j·E, as `grow_width` places ours), each copy plus N(0, (α·σ)²) with σ the std of that expert's matrix (the
  router's: of its whole weight), and top-k multiplied alike;
* the config follows: `num_hidden_layers`, `layer_types`, `mlp_only_layers` (an explicit list of the grown dense
  layers, with `decoder_sparse_step` 1), the expert count and `num_experts_per_tok`; so do the `num_experts` /
  `top_k` attributes the modules copied from it, and the wrapper's recorded config (a grown model is rebuilt from
  its config, its tokenizer still from where it came).

`zero_init_copies` zeroes each copied layer's residual outputs (`HF_ZERO_PATTERNS`: attention `o_proj`, the experts'
`down_proj`, the shared expert's and the dense MLP's `down_proj`), so the grown model computes the same logits.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from framework.grow.base import DEFAULT_ZERO_PATTERNS, Growth, check_width, grow_depth, noisy_copy

#: parameter or module names, relative to a decoder layer, of its residual outputs (zeroed in depth copies)
HF_ZERO_PATTERNS = ("self_attn.o_proj", "mlp.experts.down_proj", "mlp.shared_expert.down_proj", "mlp.down_proj")
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "top_k")


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


def is_moe_block(module: nn.Module) -> bool:
    """A transformers sparse MoE block: a router `gate` with a 2-D `weight`, `experts` holding fused 3-D tensors."""
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    weight = getattr(gate, "weight", None)
    return (isinstance(weight, Tensor) and weight.ndim == 2 and isinstance(experts, nn.Module)
            and any(p.ndim == 3 and p.shape[0] == weight.shape[0] for p in experts.parameters(recurse=False)))


def moe_blocks(module: nn.Module) -> list[nn.Module]:
    """Every transformers sparse MoE block in `module`, in module order."""
    return [m for m in module.modules() if is_moe_block(m)]


def block_counts(block: nn.Module) -> tuple[int, int]:
    """(experts, experts per token) of a sparse MoE block."""
    return int(block.gate.weight.shape[0]), int(block.gate.top_k)


def expert_matrices(block: nn.Module) -> list[Tensor]:
    """Each expert's matrices of a sparse MoE block (slices of the fused tensors)."""
    return [m for p in block.experts.parameters(recurse=False) if p.ndim == 3 for m in p.detach().unbind(0)]


def check_moe(hf: nn.Module) -> list[nn.Module]:
    """The model's sparse MoE blocks; ValueError for a dense model (orthogonal growth grows MoE models)."""
    blocks = moe_blocks(hf)
    if not blocks:
        raise ValueError(f"{type(hf).__name__} (model_type {hf.config.model_type!r}) is a dense model: orthogonal"
                         " growth grows mixture-of-experts models (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, ...), whose"
                         " layers have a router `gate` and fused `experts`")
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


def grow_block_width(block: nn.Module, factor: int = 2, alpha: float = 0.01, generator: torch.Generator | None = None,
                     top_k_factor: int | None = None) -> Growth:
    """E → factor·E experts in one sparse MoE block: the fused expert tensors and the router's rows (and any router
    tensor indexed by expert, such as a score-correction bias) repeated along dim 0 with noise; top-k × factor."""
    check_width(factor, alpha)
    growth = Growth()
    if factor == 1:
        return growth
    n, k = block_counts(block)
    with torch.no_grad():
        for owner, per_row in ((block.gate, False), (block.experts, True)):
            for name, p in list(owner.named_parameters(recurse=False)):
                if p.shape[0] != n:
                    continue
                grown = nn.Parameter(_noisy_rows(p, factor, alpha, generator, per_row and p.ndim == 3),
                                     requires_grad=p.requires_grad)
                setattr(owner, name, grown)
                growth.param_map[grown] = (p, factor)
            for name, b in list(owner.named_buffers(recurse=False)):
                if b is not None and b.ndim >= 1 and b.shape[0] == n:
                    owner.register_buffer(name, _noisy_rows(b, factor, alpha, generator, False),
                                          persistent=name not in owner._non_persistent_buffers_set)
    k_new = k * (factor if top_k_factor is None else top_k_factor)
    parts = [block, block.gate, block.experts]
    _set_counts(parts, EXPERT_COUNT_KEYS, n, n * factor)
    _set_counts(parts, TOP_K_KEYS, k, k_new)
    return growth


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
    width; the config, the attention layers' `layer_idx`, and the wrapper's recorded config follow."""
    hf = transformers_model(model)
    if hf is None:
        raise ValueError(f"{type(model).__name__} is not a transformers model")
    check_moe(hf)
    config = hf.config
    layers = decoder_layers(hf)
    dense = [not moe_blocks(layer) for layer in layers]
    result = Growth(sources=list(range(len(layers))))
    if tuple(zero_patterns) == DEFAULT_ZERO_PATTERNS:  # the framework's own names: use transformers'
        zero_patterns = HF_ZERO_PATTERNS
    if depth_factor != 1 or ignore_first or ignore_last:
        new, result = grow_depth(layers, depth_factor, depth_method, ignore_first, ignore_last, False)
        seen: set[int] = set()
        for layer, source in zip(new, result.sources, strict=True):
            if source in seen and zero_init_copies:
                zero_parameters(layer, zero_patterns)
            seen.add(source)
        hf.base_model.layers = new
        _renumber(new)
        _grown_layer_config(config, result.sources, dense)
    if width_factor != 1:
        generator = torch.Generator().manual_seed(int(seed))
        blocks = moe_blocks(hf)
        n, k = block_counts(blocks[0])
        for block in blocks:
            result.param_map.update(grow_block_width(block, width_factor, noise_alpha, generator,
                                                     top_k_factor).param_map)
        n_new, k_new = block_counts(blocks[0])
        _set_counts([config, hf], EXPERT_COUNT_KEYS, n, n_new)
        _set_counts([config, hf], TOP_K_KEYS, k, k_new)
    _record(model, hf)
    return result


def _renumber(layers: nn.ModuleList) -> None:
    """Every module of layer j that carries a `layer_idx` (its attention: the KV cache's index) gets j."""
    for j, layer in enumerate(layers):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = j


def _grown_layer_config(config: Any, sources: list[int], dense: list[bool]) -> None:
    """num_hidden_layers, layer_types and the dense-layer list of the grown stack (new layer j ← sources[j])."""
    config.num_hidden_layers = len(sources)
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == len(dense):
        config.layer_types = [layer_types[s] for s in sources]
    if hasattr(config, "mlp_only_layers"):
        config.mlp_only_layers = [j for j, s in enumerate(sources) if dense[s]]
        if hasattr(config, "decoder_sparse_step"):
            config.decoder_sparse_step = 1  # the explicit list says which layers are dense
    elif any(dense):
        raise ValueError(f"{config.model_type}: a dense layer among MoE layers that its config cannot list "
                         "(no mlp_only_layers); grow it in width only")


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
        size = sum(p.numel() for p in block.experts.parameters(recurse=False) if p.ndim == 3)
        inactive += size - size * k // n
    return inactive


__all__ = ["HF_ZERO_PATTERNS", "check_moe", "decoder_layers", "expert_matrices", "grow_block_width", "grow_hf",
           "is_moe_block", "moe_blocks", "transformers_model", "zero_parameters"]
