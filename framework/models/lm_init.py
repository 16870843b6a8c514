"""Checks and weight initialisation shared by the transformer language models (`TransformerLM`, `MoETransformerLM`)."""

from __future__ import annotations

import math

from torch import nn


def check_positive(**sizes: int) -> None:
    """ValueError naming the first of `sizes` that is not a positive integer."""
    for key, value in sizes.items():
        if value < 1:
            raise ValueError(f"{key}={value} must be a positive integer")


#: Weight initialisation schemes of the language models (`init=`); see `init_weights`.
INITS = ("gpt2", "torch")


def check_init(init: str) -> None:
    if init not in INITS:
        raise ValueError(f"init={init!r} is not an initialisation scheme; valid: {', '.join(INITS)}")


def init_weights(model: nn.Module, init: str, depth: int) -> None:
    """Draw the weights of a freshly built language model under the scheme `init`.

    - ``"gpt2"``: every `nn.Linear` / `nn.Embedding` weight ~ N(0, 0.02²), then every residual projection
      (`*proj.weight`) ~ N(0, (0.02/√(2·depth))²). Made for widths near 768; at d = 64 it stalls learning (issue 17:
      the needle MDLM stays at chance).
    - ``"torch"``: PyTorch's own defaults, as the layers were built: `nn.Linear` weights ~ U(±1/√fan_in)
      (std 1/√(3·fan_in), so it scales with width), `nn.Embedding` ~ N(0, 1). Nothing more is drawn.

    LayerNorms are weight 1, bias 0 under both. On the meta device (shapes only) nothing is drawn.
    """
    check_init(init)
    if init == "torch" or any(p.is_meta for p in model.parameters()):
        return
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
    for name, p in model.named_parameters():  # GPT-2: scale residual projections by depth
        if name.endswith("proj.weight"):
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * depth))
