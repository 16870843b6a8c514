"""The catalog machinery: name → component, mirrored into the hydra-zen store.

One `Registry` class, one instance per kind. `register` records the component for programmatic use
(`OPTIMIZERS.build("adamw", params, lr=1e-3)`) and stores a hydra-zen config in the Hydra group of that
kind, so `optimizer=adamw optimizer.lr=1e-3` works on the command line. The entries themselves live in
`registry/` (installed as `framework.catalog`); components in `framework/` never import it.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hydra_zen import ZenStore, builds

from framework.errors import UnknownNameError

__all__ = [
    "Registry",
    "UnknownNameError",
    "Entry",
    "ZEN_STORE",
    "KINDS",
    "MODELS",
    "MODULES",
    "OPTIMIZERS",
    "SCHEDULERS",
    "LOSSES",
    "METRICS",
    "CALLBACKS",
    "SAMPLERS",
    "DATA",
    "RECIPES",
    "STRATEGIES",
    "load_catalog",
]

#: The store every framework registry writes to; `framework.train` adds it to Hydra's config store.
ZEN_STORE = ZenStore(name="framework", deferred_to_config=True, deferred_hydra_store=True)


@dataclass(frozen=True)
class Entry:
    """One registered component: its canonical name, the callable, default keyword values and aliases."""

    name: str
    target: Any
    defaults: dict[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    description: str = ""


class Registry:
    """Name → component for one kind (model, optimizer, ...), mirrored into a hydra-zen config group.

    `partial=True` stores the config as a partial (`zen_partial`): the framework completes it with what only
    the run knows (parameters for an optimizer, the vocabulary size for a model). Required constructor
    arguments that have no default are then left out of the config and supplied at build time.
    """

    def __init__(
        self,
        kind: str,
        *,
        group: str | None = None,
        partial: bool = False,
        package: str | None = None,
        store: ZenStore | None = ZEN_STORE,
    ):
        self.kind = kind
        self.group = group or kind
        self.partial = partial
        self.package = package
        self._store = store
        self._entries: dict[str, Entry] = {}
        self._aliases: dict[str, str] = {}

    # -- registration ------------------------------------------------------------------------------------
    def register(
        self,
        target: Any = None,
        /,
        *,
        name: str | None = None,
        aliases: tuple[str, ...] | list[str] = (),
        description: str = "",
        **defaults: Any,
    ) -> Any:
        """Register `target` (usable as a decorator). Names are lower_snake_case; duplicates are refused."""
        if target is None:
            return lambda t: self.register(t, name=name, aliases=aliases, description=description, **defaults)
        key = name or _snake(getattr(target, "__name__", ""))
        for n in (key, *aliases):
            if not n or not n.replace("_", "").isalnum() or n != n.lower() or n[0].isdigit():
                raise ValueError(f"{self.kind} name {n!r} must be lower_snake_case (letters, digits, '_')")
            if n in self._entries or n in self._aliases:
                raise ValueError(
                    f"{self.kind} {n!r} is already registered (to {self.entry(n).target!r}); names are unique"
                )
        doc = (
            description or (inspect.getdoc(target) or "").split("\n")[0] if callable(target) else description
        )
        entry = Entry(key, target, dict(defaults), tuple(aliases), doc)
        self._entries[key] = entry
        for a in aliases:
            self._aliases[a] = key
        if self._store is not None:
            cfg = self._builds(entry)
            for n in (key, *aliases):
                pkg = self.package.format(name=n) if self.package else None
                self._store(cfg, group=self.group, name=n, package=pkg)
        return target

    def _builds(self, entry: Entry) -> Any:
        exclude: tuple[str, ...] = ()
        if self.partial:
            exclude = tuple(
                p.name
                for p in _signature_params(entry.target)
                if p.default is inspect.Parameter.empty and p.name not in entry.defaults
            )
        return builds(
            entry.target,
            populate_full_signature=True,
            zen_partial=self.partial or None,
            zen_exclude=exclude,
            hydra_convert="all",
            **entry.defaults,
        )

    # -- lookup --------------------------------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """The canonical name for `name` or one of its aliases; raises UnknownNameError."""
        if name in self._entries:
            return name
        if name in self._aliases:
            return self._aliases[name]
        raise UnknownNameError(self.kind, str(name), list(self._entries) + list(self._aliases))

    def entry(self, name: str) -> Entry:
        return self._entries[self.resolve(name)]

    def get(self, name: str) -> Any:
        """The registered callable (class or function) for `name`."""
        return self.entry(name).target

    def build(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call the component with its registered defaults, overridden by `kwargs` (which may set its own `name`)."""
        entry = self.entry(name)
        return entry.target(*args, **{**entry.defaults, **kwargs})

    def names(self, pattern: str = "*", *, aliases: bool = False) -> list[str]:
        """Sorted names matching a shell wildcard (`names("mdlm_*")`), like timm's `list_models`."""
        pool = list(self._entries) + (list(self._aliases) if aliases else [])
        return sorted(n for n in pool if fnmatch.fnmatchcase(n, pattern))

    def name_of(self, target: Any) -> str:
        """The canonical name under which `target` (a class or function) is registered."""
        for entry in self._entries.values():
            if entry.target is target:
                return entry.name
        raise LookupError(f"{target!r} is not registered as a {self.kind}; known: {', '.join(self.names())}")

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} entries)"


def _snake(name: str) -> str:
    out = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return out.replace("__", "_")


def _signature_params(target: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


MODELS = Registry("model", partial=True)  # completed with vocab_size etc. by the module
MODULES = Registry("module", partial=True)  # completed with the model, optimizer and scheduler
OPTIMIZERS = Registry("optimizer", partial=True)  # completed with the parameters
SCHEDULERS = Registry("scheduler", partial=True)  # completed with the optimizer and the step count
LOSSES = Registry("loss", partial=True)  # completed with mask/pad ids from the data
METRICS = Registry("metric")
CALLBACKS = Registry("callback", group="callbacks", package="callbacks.{name}")  # multi-select → dict
SAMPLERS = Registry("sampler", partial=True)
DATA = Registry("data")
PEFT = Registry("peft")  # parameter-efficient fine-tuning: adapters put into the built model (PEFT's LoRA)
RECIPES = Registry("recipe", store=None)  # stored by framework.recipe.recipe() into group "recipe"
#: our Lightning strategies (also in Lightning's own registry, so `trainer.strategy=NAME` takes them, as it takes
#: Lightning's `ddp`, `fsdp`, ...); listed by `python -m framework.ls`, not a Hydra group
STRATEGIES = Registry("strategy", group="trainer.strategy", store=None)

KINDS: dict[str, Registry] = {
    r.kind: r
    for r in (MODELS, MODULES, OPTIMIZERS, SCHEDULERS, LOSSES, METRICS, CALLBACKS, SAMPLERS, DATA, PEFT, RECIPES,
              STRATEGIES)
}
#: Hydra group name → registry (the command line speaks in groups: `callbacks=[...]`).
GROUPS: dict[str, Registry] = {r.group: r for r in KINDS.values() if r is not STRATEGIES}

#: the entry-point group that catalog packages register under (pyproject.toml: `framework.catalog` and
#: `framework.recipes`); another package can add its own components and recipes the same way
CATALOG_ENTRY_POINTS = "framework.catalog"
_loaded = False


def load_catalog() -> None:
    """Import every package registered under the `framework.catalog` entry point once (each registers its names
    on import). The machinery does not name the catalog: the distribution's metadata does."""
    from importlib.metadata import entry_points

    global _loaded
    if _loaded:
        return
    found = sorted(entry_points(group=CATALOG_ENTRY_POINTS), key=lambda e: e.name)
    if not found:
        raise RuntimeError(f"no package is registered under the {CATALOG_ENTRY_POINTS!r} entry point, so no names can"
                           " be loaded: reinstall framework (`make install`, or `pip install -e .` in the repository)"
                           " so its metadata lists framework.catalog and framework.recipes")
    _loaded = True
    for entry in found:
        entry.load()
