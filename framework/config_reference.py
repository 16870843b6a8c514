"""One registered name's configuration, as `python -m framework.ls KIND NAME` prints it and docs/reference/config.md
shows it: its summary, target, guide and each key of its config with the default `KIND=NAME` gives and the key's
one-line meaning (`framework.config_docs`). `render` writes both, the terminal's text and the reference's Markdown.

The keys and defaults are those of the config the registry stores in Hydra's group (hydra-zen's `builds` of the
target with its registered defaults), read without composing a Hydra config; a partial config's keys that the
framework supplies at build time (an optimizer's parameters, a model's vocabulary size) are listed as such.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from framework.config_docs import dotted_path, guide, meanings, one_line
from framework.registry import CALLBACKS, GROUPS, KINDS, RECIPES, STRATEGIES, Registry

#: the config's own bookkeeping keys (hydra-zen's), never listed
HIDDEN = ("_target_", "_partial_", "_convert_", "_recursive_", "defaults")


@dataclass
class Option:
    """What `render` prints for one option: `heading` (`optimizer=olion`), its keys as (key, default, meaning)."""

    kind: str
    name: str
    heading: str
    summary: str = ""
    facts: list[tuple[str, str]] = field(default_factory=list)  # (label, value): aliases, target, guide, choices...
    keys: list[tuple[str, str, str]] = field(default_factory=list)
    prefix: str = ""  # what a key is set as on the command line: `optimizer.` + key
    supplied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def show(value: Any) -> str:
    """A default as it is written on the command line: `null`, `true`, `0.001`, `[0.9, 0.95]`, `''`."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def config_keys(node: Any, target: Any) -> list[tuple[str, str, str]]:
    """(key, default, meaning) for each key of a stored hydra-zen config `node` of `target`, in the config's order."""
    values = OmegaConf.to_container(OmegaConf.structured(node), resolve=False)
    said = meanings(target)
    return [(k, show(v), said.get(k, "")) for k, v in values.items() if k not in HIDDEN]


def registered(kind: str, name: str) -> Option:
    """The Option for registered name `name` (or an alias) of `kind`; UnknownNameError for a name not registered."""
    registry = find_kind(kind)
    if registry is RECIPES:
        return recipe_option(name)
    entry = registry.entry(name)
    page = guide(registry.kind, entry.name)
    facts = [("aliases", ", ".join(entry.aliases) or "none"), ("target", dotted_path(entry.target)),
             ("guide", f"docs/{page}" if page else "none")]
    group = registry.group
    option = Option(registry.kind, entry.name, f"{group}={entry.name}", summary(entry), facts)
    if registry is STRATEGIES:
        option.notes.append(f"set as `trainer.strategy={entry.name}`; its settings are the strategy's own")
        return option
    option.prefix = f"{group}.{entry.name}." if registry is CALLBACKS else f"{group}."
    option.keys = config_keys(registry._builds(entry), entry.target)
    taken = {k for k, _, _ in option.keys}
    option.supplied = [p.name for p in _parameters(entry.target) if p.name not in taken]
    return option


def summary(entry: Any) -> str:
    """The entry's description; where that is only its docstring's first line, the docstring's first sentence."""
    doc = inspect.getdoc(entry.target) or ""
    if entry.description and entry.description != doc.split("\n", 1)[0]:
        return entry.description
    return one_line(doc.splitlines()) or entry.description


def find_kind(name: str) -> Registry:
    """The registry for a kind or Hydra group name (`callback` or `callbacks`, `samplers`); UnknownNameError."""
    from framework.errors import UnknownNameError

    registry = KINDS.get(name) or GROUPS.get(name) or KINDS.get(name.removesuffix("s"))
    if registry is None:
        raise UnknownNameError("kind", name, sorted(set(KINDS) | set(GROUPS)))
    return registry


def _parameters(target: Any) -> list[inspect.Parameter]:
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def recipe_option(name: str) -> Option:
    """A recipe: its choices (its defaults list, bases included; the app's defaults for the rest), the values it sets
    with what each key means for the chosen component, its learning rate per optimizer and its sizes' presets."""
    from framework.recipe import NODES, flattened

    name = RECIPES.resolve(name)
    entry, node = RECIPES.entry(name), flattened(f"recipe/{name}")
    own = {k.split()[-1].strip("/"): v for d in node.defaults if not isinstance(d, str) for k, v in d.items()}
    choices = {**app_choices(), **own}
    page = guide("recipe", name)
    base = [str(d).strip("/").split("/", 1)[1] for d in NODES[f"recipe/{name}"].get("defaults", [])
            if isinstance(d, str) and d.strip("/").startswith("recipe/")]
    facts = [("built on", ", ".join(base) or "none"),
             ("choices", " ".join(f"{g}={show(c)}" for g, c in own.items()) or "none"),
             ("the rest", " ".join(f"{g}={show(c)}" for g, c in choices.items() if g not in own and c is not None)),
             ("guide", f"docs/{page}" if page else "none")]
    values = {k: v for k, v in node.items() if k not in HIDDEN}
    keys = [(key, value, key_meaning(key, choices)) for key, value in leaves(values)]
    lrs = {p.split("__", 1)[1]: n.optimizer.lr for p, n in NODES.items() if p.startswith(f"lr/{name}__")}
    if lrs:
        facts.append(("lr", ", ".join(f"{k.replace('__None', '').replace('__', '+')} {v}" for k, v in lrs.items())))
    sizes = sorted(p.rsplit("/", 1)[1] for p in NODES if p.startswith(f"preset/{name}/"))
    facts.append(("presets", " ".join(f"size={size}" for size in sizes) or "none (conf/size/ alone)"))
    return Option("recipe", name, f"recipe={name}", entry.description, facts, keys)


def app_choices() -> dict[str, Any]:
    """The app's own group choices (framework.app's defaults list), group → choice."""
    from framework.app import DEFAULTS

    return {k: v for d in DEFAULTS if isinstance(d, dict) for k, v in d.items()
            if " " not in k and k not in ("recipe", "size")}


def leaves(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value as `show` writes it) for each leaf of a (Dict)Config or dict."""
    if isinstance(node, (dict, DictConfig)) and len(node):
        items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else node.items()
        return [kv for k, v in items for kv in leaves(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), show(node))]


def key_meaning(dotted: str, choices: dict[str, Any]) -> str:
    """What the dotted key `group.key` (or a top-level key) means, for the component `choices` picks in its group."""
    from framework.app import GuardConf, HubConf, TrainConfig, TrainerConf

    head, _, rest = dotted.partition(".")
    key = rest.split(".", 1)[0]
    if head == "callbacks":
        name, _, key = rest.partition(".")
        return meanings(CALLBACKS.get(name)).get(key.split(".", 1)[0], "") if name in CALLBACKS else ""
    tops = {"trainer": TrainerConf, "hub": HubConf, "guard": GuardConf}
    if head in tops:
        target = getattr(tops[head], "_target_", tops[head])
        return meanings(import_target(target) if isinstance(target, str) else target).get(key, "")
    choice = choices.get(head)
    if head in GROUPS and isinstance(choice, str) and choice in GROUPS[head]:
        return meanings(GROUPS[head].get(choice)).get(key, "")
    return "" if rest else meanings(TrainConfig).get(head, "")


def import_target(path: str) -> Any:
    """The object a dotted `_target_` path names."""
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def render(option: Option, markdown: bool = False) -> str:
    """The option as the terminal shows it (`markdown=False`) or as docs/reference/config.md does: the same facts,
    keys, defaults and meanings."""
    if not markdown:
        lines = [f"{option.kind} {option.name}: {option.summary}".rstrip(": ")]
        lines += [f"  {label + ':':9s} {value}" for label, value in option.facts if value]
        if option.keys:
            lines.append(f"  keys{f' (set as {option.prefix}KEY=VALUE)' if option.prefix else ''}:")
            width = min(36, max(len(f"{k} = {d}") for k, d, _ in option.keys))
            lines += [f"    {f'{k} = {d}':{width}s}  {m}".rstrip() for k, d, m in option.keys]
        lines += [f"  supplied by the framework: {', '.join(option.supplied)}"] if option.supplied else []
        return "\n".join(lines + [f"  {n}" for n in option.notes])
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ")
    facts = " · ".join(f"{label}: {_md_fact(label, value)}" for label, value in option.facts if value)
    heading = f"`{option.heading}`" if " " not in option.heading else option.heading
    lines = [f"### {heading}", ""]
    for text in (cell(option.summary), facts):
        lines += [text, ""] if text else []
    if option.keys:
        lines += ["| key | default | meaning |", "|---|---|---|"]
        lines += [f"| `{option.prefix}{k}` | `{cell(d)}` | {cell(m)} |" for k, d, m in option.keys]
        lines.append("")
    if option.supplied:
        lines += [f"Supplied by the framework: {', '.join(f'`{p}`' for p in option.supplied)}.", ""]
    return "\n".join(lines + [f"{n[0].upper()}{n[1:]}." for n in option.notes] + ([""] if option.notes else []))


def _md_fact(label: str, value: str) -> str:
    if value == "none" or value.startswith("none "):
        return value
    if label == "guide" and value.startswith("docs/"):
        return f"[{value.removeprefix('docs/')}](../{value.removeprefix('docs/')})"
    return value if label == "lr" else f"`{value}`"
