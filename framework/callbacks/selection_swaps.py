"""What `DataSelection` changes on the trainer (never on the user's module) for one fit, and how it is put back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.trainer.connectors.data_connector import _DataLoaderSource
from torch.utils.data import DataLoader

_ABSENT = object()


class Swaps:
    """Attributes set on objects for a while; `undo()` restores each one's previous value (or its absence)."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        """Set `obj.name = value`, remembering the instance attribute it replaces (if any)."""
        self._undo.append((obj, name, vars(obj).get(name, _ABSENT)))
        setattr(obj, name, value)

    def undo(self) -> None:
        """Put back every attribute set since the last `undo()`, newest first."""
        while self._undo:
            obj, name, old = self._undo.pop()
            if old is _ABSENT:
                vars(obj).pop(name, None)
            else:
                setattr(obj, name, old)


class SelectionSource(_DataLoaderSource):
    """Lightning's training-data source (the module or data module stays its `instance`), answered by `load`."""

    def __init__(self, original: _DataLoaderSource, load: Callable[[], DataLoader]):
        super().__init__(original.instance, original.name)
        self._load = load

    def dataloader(self) -> DataLoader:
        return self._load()
