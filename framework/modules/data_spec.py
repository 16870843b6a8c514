"""What a module and its parts learn from the data they train on, read in one place.

A data module states any of these as attributes (`vocab_size = 256`, `mask_id = MASK`, `prompt_length = 19`, ...).
A recipe's partial model, module or loss config leaves the matching arguments unset (None) and `DataSpec.complete`
fills them, so a recipe never repeats the vocabulary size or the [MASK] id. A component that is built outside
`train()` reads the same facts with `DataSpec.of(trainer.datamodule)` (the head-allocation probes do, in `setup`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """The data facts a component may take by argument name; None where the data does not say."""

    vocab_size: int | None = None
    mask_id: int | None = None
    pad_id: int | None = None
    num_classes: int | None = None
    input_shape: list[int] | tuple[int, ...] | None = None
    prompt_length: int | None = None  # tokens before the answer in each row (prompt/answer tasks)
    max_new_tokens: int | None = None  # answer tokens to generate
    eos_id: int | None = None

    @classmethod
    def of(cls, data: Any) -> DataSpec:
        """The spec a data module states through its attributes of these names (missing ones stay None)."""
        return cls(**{f.name: getattr(data, f.name, None) for f in dataclasses.fields(cls)})

    def known(self) -> dict[str, Any]:
        """The facts the data states, by name."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def complete(self, factory: Any) -> Any:
        """`factory` (a partial) with each argument it takes, left unset (None), filled from this spec.

        Only an argument that is required or defaults to None asks for the data's value; one with another default
        (`causal_lm`'s `prompt_length=0`: score every token) keeps it unless the recipe sets it."""
        if not isinstance(factory, functools.partial):
            return factory
        takes = inspect.signature(factory.func).parameters
        asks = {k for k, p in takes.items() if p.default is None or p.default is inspect.Parameter.empty}
        fill = {k: v for k, v in self.known().items() if k in asks and factory.keywords.get(k) is None}
        return functools.partial(factory, **fill) if fill else factory


__all__ = ["DataSpec"]
