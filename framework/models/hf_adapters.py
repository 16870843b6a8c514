"""What differs per transformers model family (how it is called, whether its logits are shifted, its [MASK]), in
one `Adapter` per family; `framework.models.hf` picks one by the config's `model_type` (`adapter_for`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch import Tensor, nn


@dataclasses.dataclass(frozen=True)
class Adapter:
    """The facts that differ per model family, in one place.

    `kind`: "causal" (next-token logits, `AutoModelForCausalLM`) or "masked" (logits at the same position,
    `AutoModelForMaskedLM`); `shifted`: logits at position t predict token t+1; `bidirectional`: every position
    attends to every other (what an MDLM backbone needs); `mask_token`: the tokenizer's attribute that holds the
    [MASK] token (None: the family has none); `call(model, ids, attention_mask)`: the logits of a batch of token
    ids (`attention_mask`: None, a (batch, seq) key mask with 1 = real token, or a 4-D boolean mask).
    """

    name: str
    kind: str
    shifted: bool
    bidirectional: bool
    model_types: tuple[str, ...] = ()  # transformers `model_type`s it covers; () = the kind's default
    mask_token: str | None = None
    call: Callable[..., Tensor] | None = None

    def logits(self, model: nn.Module, ids: Tensor, attention_mask: Tensor | None = None,
               position_ids: Tensor | None = None) -> Tensor:
        if self.call is not None:
            if position_ids is not None:
                raise ValueError(f"the {self.name!r} adapter's call takes no position_ids, so packed rows would attend "
                                 "across documents: set data.packing=false (one document per row)")
            return self.call(model, ids, attention_mask)
        extra = {} if position_ids is None else {"position_ids": position_ids}
        if self.kind == "causal":
            extra["use_cache"] = False
        return model(input_ids=ids, attention_mask=attention_mask, **extra).logits


#: the adapters by name; `adapter_for` picks one by the config's model_type, else the kind's default
ADAPTERS: dict[str, Adapter] = {}


def register_adapter(adapter: Adapter) -> Adapter:
    """Add (or replace) an adapter; a family's `model_types` then use it."""
    ADAPTERS[adapter.name] = adapter
    return adapter


register_adapter(Adapter("causal", "causal", shifted=True, bidirectional=False))
register_adapter(Adapter("masked", "masked", shifted=False, bidirectional=True, mask_token="mask_token_id"))


def adapter_for(model_type: str, kind: str) -> Adapter:
    """The adapter registered for `model_type` of this `kind`, else the kind's default."""
    for adapter in ADAPTERS.values():
        if adapter.kind == kind and model_type in adapter.model_types:
            return adapter
    return ADAPTERS[kind]
