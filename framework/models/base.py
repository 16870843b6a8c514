"""Models that remember their constructor values, so a checkpoint or Hub push can rebuild them by name."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch import nn


class RecordsConfig(nn.Module):
    """An `nn.Module` whose plain constructor arguments are kept in `self.init_config`.

    The Hub's `config.json` stores a registry name plus these values (never an import path), and
    `from_pretrained` rebuilds the model from them.
    """

    init_config: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        original = cls.__init__
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self, *args: Any, **kw: Any) -> None:
            original(self, *args, **kw)
            if type(self) is cls:  # the most derived constructor records the values
                bound = signature.bind(self, *args, **kw)
                bound.apply_defaults()
                values = dict(bound.arguments)
                values.pop("self")
                object.__setattr__(self, "init_config", _plain(values))

        cls.__init__ = __init__  # type: ignore[method-assign]


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """Keep JSON-plain values only; a model taking tensors or modules cannot be rebuilt from config.json."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, tuple):
            value = list(value)
        if value is None or isinstance(value, (bool, int, float, str, list, dict)):
            out[key] = value
        else:
            raise TypeError(
                f"constructor argument {key}={value!r} is not a plain value (bool, int, float, str, list, dict)"
            )
    return out
