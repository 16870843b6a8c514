"""LoRA (Hu et al., 2021): low-rank adapters on a frozen model's linear layers, for cheap fine-tuning.

`apply_lora(model)` swaps the matching `nn.Linear` layers for `LoRALinear` in place and freezes everything
else; `merge_lora(model)` folds the adapters back into plain `nn.Linear` layers. A wrapped layer keeps the
base layer's `weight`/`bias` names, so a plain checkpoint loads into the frozen part unchanged, and
`merge_lora_state(state_dict)` folds a LoRA checkpoint's adapters into a plain state dict.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DEFAULT_TARGETS = ("q", "kv", "proj", "fc")


class LoRALinear(nn.Module):
    """y = x Wᵀ + b + (alpha / rank) · x Aᵀ Bᵀ with W, b frozen; B starts at zero, so it equals the base layer."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0):
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank={rank} must be a positive integer")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight.requires_grad_(False)
        self.bias = base.bias.requires_grad_(False) if base.bias is not None else None
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **kw))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, **kw))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear and the LoRA reference code
        # stored with the weights, so a checkpoint alone says how to merge it (`merge_lora_state`)
        self.register_buffer("lora_scale", torch.tensor(alpha / rank, dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.lora_scale

    def merged(self) -> nn.Linear:
        """A plain `nn.Linear` computing the same function (W + scale · B A), trainable again."""
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(self.weight + self.lora_scale.to(self.weight.dtype) * (self.lora_B @ self.lora_A))
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.lora_A.shape[0]}"


def _matches(name: str, targets: Iterable[str]) -> bool:
    """A target matches a layer's own name (`q`) or its full dotted name, with shell wildcards (`blocks.0.*`)."""
    leaf = name.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(leaf, t) or fnmatch.fnmatchcase(name, t) for t in targets)


def apply_lora(
    model: nn.Module, rank: int = 8, alpha: float = 16.0, targets: Iterable[str] = DEFAULT_TARGETS
) -> nn.Module:
    """Freeze `model` and wrap its `nn.Linear` layers whose name matches `targets` in `LoRALinear`, in place.

    Afterwards only the adapters' A and B require grad. Returns `model`.
    """
    targets = tuple(targets)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and not isinstance(m, LoRALinear)]
    chosen = [(n, m) for n, m in linears if _matches(n, targets)]
    if not chosen:
        raise ValueError(f"LoRA targets {list(targets)} match no nn.Linear layer; the model's linear layers are: "
                         f"{', '.join(n for n, _ in linears) or 'none'}")
    model.requires_grad_(False)
    for name, layer in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(layer, rank, alpha))
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every `LoRALinear` in `model` by the equivalent plain `nn.Linear`, in place. Returns `model`."""
    for name, layer in list(model.named_modules()):
        if isinstance(layer, LoRALinear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, layer.merged())
    return model


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' parameters (A and B of every `LoRALinear`)."""
    return [p for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]


def merge_lora_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict with each `X.lora_A`/`X.lora_B`/`X.lora_scale` folded into `X.weight` (plain model keys)."""
    out = {k: v for k, v in state.items() if not k.rsplit(".", 1)[-1].startswith("lora_")}
    for key in state:
        if key.endswith(".lora_A"):
            prefix = key[: -len("lora_A")]
            weight = state[prefix + "weight"]
            delta = state[prefix + "lora_B"].float() @ state[prefix + "lora_A"].float()
            out[prefix + "weight"] = (weight.float() + state[prefix + "lora_scale"].float() * delta).to(weight.dtype)
    return out
