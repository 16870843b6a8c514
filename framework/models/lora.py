"""Checkpoints from the framework's own LoRA, before PEFT became the one LoRA (`framework.models.peft_adapters`).

Those checkpoints hold each adapted layer as `X.weight` (frozen), `X.lora_A`, `X.lora_B` and `X.lora_scale`;
`merge_lora_state` folds them into plain weights, so `python -m framework.generate`, `init_from=` and a push still
read such a run dir. New runs train PEFT's adapters (`peft=lora`, or an MDLM's `module.lora_rank`).
"""

from __future__ import annotations

from torch import Tensor


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
