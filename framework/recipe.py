"""Recipes: named compositions of registered parts, stored in Hydra's `recipe` group at package `_global_`.

A recipe does exactly what the same overrides on the command line would do: it picks group choices
(`defaults={"optimizer": "olion"}`) and sets values (`trainer={"max_steps": 200}`). Command-line choices and
values still win, whatever their order. A recipe built on another names it (`base="char_lm"`: a Hydra defaults
entry, so the base's choices and values come first and the recipe's own win).

The YAML side lives in conf/ (`load_conf`): Hydra's app settings (conf/hydra/), the `size` group (conf/size/:
`cpu`, the recipes' own values; `smoke`, a few-second run; `gpu`), each recipe's presets for a size
(conf/preset/RECIPE/SIZE.yaml, applied after the recipe; a recipe without its own uses its base's) and YAML
recipes (conf/recipe/NAME.yaml, or recipe/NAME.yaml in a folder given as `hydra.searchpath=[file://FOLDER]`).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from framework.errors import InputError
from framework.registry import RECIPES, ZEN_STORE

#: the YAML side of the app (Hydra settings, sizes, presets and YAML recipes): the repository's top-level conf/ (a
#: checkout, an editable install), else the copy a built wheel carries inside the package as `framework/conf/`
_REPO_CONF, _WHEEL_CONF = Path(__file__).resolve().parent.parent / "conf", Path(__file__).resolve().parent / "conf"
CONF_DIR = _REPO_CONF if (_REPO_CONF / "size").is_dir() else _WHEEL_CONF  # site-packages/conf may be another's
#: sizes every recipe has (conf/size/); `cpu` is the default
SIZES = ("cpu", "smoke", "gpu")
#: recipe name -> the overrides that shrink it to a few-second run (what the tests run): `size=smoke`'s values
SMOKE: dict[str, list[str]] = {}
#: every config this module stored, by Hydra path ("recipe/char_lm", "preset/char_lm/smoke", "size/smoke")
NODES: dict[str, DictConfig] = {}


def recipe(
    name: str,
    *,
    description: str,
    base: str | None = None,
    defaults: dict[str, Any] | None = None,
    lrs: dict[str, float] | None = None,
    **values: Any,
) -> DictConfig:
    """Register recipe `name`: built on recipe `base` (if given), group choices in `defaults`, plain values as
    keyword arguments. An integer `trainer.val_check_interval` counts global steps (`check_val_every_n_epoch=None`
    unless given). `lrs`: the recipe's learning rate per optimizer (`{"adamw": 2e-5, "olion": ...}`; a key
    `OPTIMIZER+PEFT`, e.g. `adamw+lora`, is the lr with that `peft=` choice), stored in Hydra's `lr` group and
    applied after the recipe and its size, so the command line's `optimizer.lr=` still wins."""
    trainer = values.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("val_check_interval"), int):
        # an integer interval counts optimizer steps across epochs, so it holds however many batches an epoch has
        # (DDP halves them); a recipe that means "every N batches of each epoch" says check_val_every_n_epoch=1
        values["trainer"] = {"check_val_every_n_epoch": None, **trainer}
    overrides = [{f"override /{group}": choice} for group, choice in (defaults or {}).items()]
    # untyped on purpose: a typed config in `_global_` fails to merge with the primary config
    cfg = OmegaConf.create({"defaults": [*([f"/recipe/{base}"] if base else []), "_self_", *overrides], **values})
    register_recipe(name, cfg, description)
    for key, lr in (lrs or {}).items():
        optimizer, _, peft = key.partition("+")
        # one flat group (Hydra's --help lists every group at a cost each): lr/RECIPE__OPTIMIZER__PEFT
        _store(f"lr/{name}__{optimizer}__{peft or 'None'}", OmegaConf.create({"optimizer": {"lr": float(lr)}}))
    return cfg


def register_recipe(name: str, cfg: DictConfig, description: str, store: bool = True) -> None:
    """Record recipe `name` in the catalog and (`store`) Hydra's `recipe` group, at package `_global_`."""
    RECIPES.register(cfg, name=name, description=description)
    _store(f"recipe/{name}", cfg, store)


def _store(path: str, node: DictConfig, store: bool = True) -> None:
    group, _, name = path.rpartition("/")
    NODES[path] = node
    if store:
        ZEN_STORE(node, group=group, name=name, package="_global_")


def bases(cfg: DictConfig) -> list[str]:
    """The recipes `cfg` is built on (its `/recipe/NAME` defaults entries)."""
    return [str(d).strip("/").split("/", 1)[1] for d in cfg.get("defaults", [])
            if isinstance(d, str) and str(d).strip("/").startswith("recipe/")]


def flattened(path: str) -> DictConfig:
    """The stored config at `path` with the configs its defaults include merged in (values and group choices), as
    one config that composes to the same result: what `fit_to_choices` edits and `smoke_overrides` reads."""
    node = NODES[path]
    values, choices = OmegaConf.create({}), {}
    for entry in node.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            if entry.strip("/") not in NODES:
                continue  # not a recipe or preset (a YAML recipe may include other configs): Hydra's to compose
            inner = flattened(entry.strip("/"))
            values = OmegaConf.merge(values, {k: v for k, v in inner.items() if k != "defaults"})
            choices.update({k: v for d in inner.defaults if not isinstance(d, str) for k, v in d.items()})
        elif entry == "_self_":
            values = OmegaConf.merge(values, {k: v for k, v in node.items() if k != "defaults"})
        else:
            choices.update({f"override /{k.split()[-1].strip('/')}": v for k, v in entry.items()})
    if "_self_" not in node.get("defaults", []):
        values = OmegaConf.merge(values, {k: v for k, v in node.items() if k != "defaults"})
    return OmegaConf.create({"defaults": ["_self_", *({k: v} for k, v in choices.items())], **values})


_loaded: set[Path] = set()


def _parse_yaml(file: Path, text: str) -> Any:
    """The YAML of `file` as an OmegaConf node; InputError naming the file and the line when it does not parse."""
    import yaml

    try:
        return OmegaConf.create(text)
    except (yaml.YAMLError, ValueError) as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{file}:{mark.line + 1}" if mark is not None else str(file)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(f"{where}: not valid YAML ({problem}); fix the file or move it out of the conf folder")\
            from None


def load_conf(folder: Path = CONF_DIR, store: bool = True) -> list[str]:
    """Read a conf folder's YAML: `recipe/*.yaml` become recipes (the first comment line is the description),
    `size/` and `preset/` the size group and presets (all three at package `_global_`). With `store` (the app's own
    conf/, which is not on Hydra's search path) they go to Hydra's ConfigStore, `hydra/config.yaml` is merged over
    Hydra's defaults (the app's settings) and any other file becomes an option of its group (`# @package` honoured);
    without (a `hydra.searchpath` folder, which Hydra reads itself) they are only recorded, so the recipes are names
    the CLI and `framework.ls` know. Once per folder; returns the recipe names it added."""
    from hydra.conf import HydraConf

    folder = Path(folder).resolve()
    if folder in _loaded or not folder.is_dir():
        return []
    _loaded.add(folder)
    added = []
    for file in sorted(folder.rglob("*.yaml")):
        path = file.relative_to(folder).with_suffix("").as_posix()
        text = file.read_text()
        node = _parse_yaml(file, text)
        if path == "hydra/config" and store:
            ZEN_STORE(OmegaConf.merge(OmegaConf.structured(HydraConf), node), group="hydra", name="config")
        elif path.startswith("recipe/") and path.count("/") == 1:
            name = path.split("/", 1)[1]
            if name in RECIPES and NODES.get(path) == node:
                continue  # the same recipe found twice on the search path
            register_recipe(name, node, _first_comment(text), store)
            added.append(name)
        elif path.startswith(("size/", "preset/")):
            _store(path, node, store)
        elif store:
            group, _, name = path.rpartition("/")
            package = re.match(r"#\s*@package\s+(\S+)", text)
            ZEN_STORE(node, group=group, name=name, package=package.group(1) if package else None)
    _inherit_presets()
    ZEN_STORE.add_to_hydra_store(overwrite_ok=True)
    return added


def _first_comment(text: str) -> str:
    lines = [ln.lstrip("# ").strip() for ln in text.splitlines() if ln.startswith("#") and "@package" not in ln]
    return lines[0] if lines else ""


def _inherit_presets() -> None:
    """A recipe without its own preset for a size uses its base's (`preset/NAME/SIZE` includes the base's); every
    recipe with a smoke size gets `SMOKE[name]`."""
    sizes = {p.rsplit("/", 1)[1] for p in NODES if p.startswith("preset/")} | set(SIZES)
    for name in RECIPES.names():
        for size in sorted(sizes):
            chain = [name]
            while f"preset/{chain[-1]}/{size}" not in NODES and (up := bases(NODES[f"recipe/{chain[-1]}"])):
                chain.append(up[0])
            if len(chain) > 1 and f"preset/{chain[-1]}/{size}" in NODES:
                _store(f"preset/{name}/{size}", OmegaConf.create({"defaults": [f"/preset/{chain[-1]}/{size}"]}))
        if "size/smoke" in NODES:
            SMOKE[name] = size_overrides(name, "smoke")


def searchpath_folders(argv: list[str]) -> list[Path]:
    """The local folders a command line's `hydra.searchpath=[file://A,B]` adds (the ones `load_conf` reads)."""
    folders = []
    for arg in argv:
        if arg.lstrip("+").startswith("hydra.searchpath="):
            items = arg.split("=", 1)[1].strip("[]").split(",")
            folders += [Path(i.strip().strip("'\"").removeprefix("file://")) for i in items
                        if i.strip() and not i.strip().startswith("pkg://")]
    return folders


#: smoke values `FRAMEWORK_SMOKE=1` leaves out: the validation schedule stays the one the command gives
SMOKE_KEEPS = ("trainer.val_check_interval",)


def smoke_overrides(argv: list[str]) -> list[str]:
    """What `FRAMEWORK_SMOKE=1` adds to a `python -m framework.train` command line: the values `size=smoke` sets
    for the recipe it names (conf/size/smoke.yaml, then the recipe's preset), as overrides, less any key the command
    sets itself and less the validation schedule, so the command is tried as written, only smaller. [] without a
    single recipe."""
    recipes = {a.split("=", 1)[1] for a in argv if a.startswith("recipe=")}
    if len(recipes) != 1 or (name := recipes.pop()) not in SMOKE:
        return []
    given = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    # a group the command swaps keeps the smoke values its new choice takes (`module=duo_attention`: the probes'
    # pretrain_steps) and leaves out the rest (`model=hf_causal_lm` has no `dim`)
    swapped = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv
               if "=" in a and "." not in a.split("=", 1)[0] and a.split("=", 1)[0] not in ("recipe", "size")}
    return [a for a in SMOKE[name] if a.split("=", 1)[0] not in {*given, *SMOKE_KEEPS}
            and _takes(a.split("=", 1)[0], swapped)]


def _takes(dotted: str, swapped: dict[str, str]) -> bool:
    """Whether the smoke value at `dotted` (`group.key...`) still applies: its group is the recipe's choice, or the
    new choice (one registered name) takes `key`."""
    group, _, key = dotted.partition(".")
    return group not in swapped or key.split(".", 1)[0] in (_keys_taken(group, [swapped[group]]) or set())


def _keys_taken(group: str, choices: list[Any]) -> set[str] | None:
    """The keys every one of `choices` (registered names of `group`) takes; None where the group is not a
    registered one or a choice is not a registered name."""
    from framework.registry import GROUPS

    if group not in GROUPS or any(c is None or str(c) not in GROUPS[group] for c in choices):
        return None
    return set.intersection(*(set(_parameters(GROUPS[group].get(str(c)))) for c in choices))


def size_overrides(name: str, size: str) -> list[str]:
    """What `size=SIZE` sets for recipe `name` (conf/size/SIZE.yaml, then its preset), as `key=value` overrides."""
    values = OmegaConf.create({})
    for path in (f"size/{size}", f"preset/{name}/{size}"):
        if path in NODES:
            values = OmegaConf.merge(values, {k: v for k, v in flattened(path).items() if k != "defaults"})
    return [f"{key}={value}" for key, value in _dotted(values)]


def _dotted(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value in override syntax) for every leaf of `node`."""
    if isinstance(node, DictConfig):
        return [kv for k, v in node.items_ex(resolve=False) for kv in _dotted(v, f"{prefix}{k}.")]
    value = OmegaConf.to_container(node) if isinstance(node, ListConfig) else node
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return [(prefix.rstrip("."), text.replace(" ", ""))]


def fit_to_choices(argv: list[str]) -> list[str]:
    """Leave out the values the recipe named in `argv` sets for a group the command line swaps, where the new
    choice does not take them (`recipe=char_lm scheduler=constant`: `constant` has no `warmup_steps`; its bases'
    values included), so the recipe's values carry over exactly where they fit; the same for the recipe's preset at
    the command's `size=` (`size=smoke model=hf_causal_lm`: the smoke model's `dim` is left out). Re-stores what it
    changed, flattened, in Hydra's ConfigStore for this process only (`unfit` puts the originals back); returns one
    note per group and config with values left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException


    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return []
    names = [ov.value() for ov in overrides if ov.key_or_group == "recipe" and not ov.is_sweep_override()]
    if len(names) != 1 or names[0] not in RECIPES:
        return []
    name = RECIPES.resolve(str(names[0]))
    if f"recipe/{name}" not in NODES or not _stored("recipe", name):
        return []  # a YAML recipe Hydra reads from a hydra.searchpath folder: composed as written
    takes: dict[str, tuple[str, set[str]]] = {}  # swapped group -> (its choices as written, the keys all of them take)
    sizes: list[str] = []
    for ov in overrides:
        group = ov.key_or_group
        choices = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.value()]
        if group == "size":
            sizes += [str(c) for c in choices]
        keys = None if group in ("recipe", "callbacks") else _keys_taken(group, choices)
        if keys is not None:
            takes[group] = (",".join(map(str, choices)), keys)
    notes = _fit(f"recipe/{name}", f"recipe {name}'s", takes)
    for size in sizes:
        if f"preset/{name}/{size}" in NODES and _stored(f"preset/{name}", size):
            notes += _fit(f"preset/{name}/{size}", f"size={size}'s", takes)
    return notes


def _stored(group: str, name: str) -> bool:
    from hydra.core.config_store import ConfigStore

    repo: Any = ConfigStore.instance().repo
    for part in group.split("/"):
        repo = repo.get(part, {})
    return bool(repo.get(f"{name}.yaml"))


def _fit(path: str, whose: str, takes: dict[str, tuple[str, set[str]]]) -> list[str]:
    """Drop from the config at `path` (flattened) the values of each swapped group its new choice does not take;
    re-store it when anything was dropped. One note per group."""
    from hydra.core.config_store import ConfigStore

    notes, fitted = [], OmegaConf.to_container(flattened(path))
    for group, (choices, keys) in takes.items():
        if not isinstance(fitted.get(group), dict):
            continue
        dropped = {key: fitted[group].pop(key) for key in [k for k in fitted[group] if k not in keys]}
        if dropped:
            values = ", ".join(f"{group}.{k}={v}" for k, v in dropped.items())
            notes.append(f"{group}={choices} takes no {', '.join(dropped)}: {whose} {values} "
                         f"{'is' if len(dropped) == 1 else 'are'} left out")
    if notes:
        group, _, name = path.rpartition("/")
        ConfigStore.instance().store(name=name, node=OmegaConf.create(fitted), group=group, package="_global_")
    return notes


def unfit(name: str) -> None:
    """Put recipe `name` and its presets back in Hydra's ConfigStore as registered (what `fit_to_choices` changed)."""
    from hydra.core.config_store import ConfigStore

    for path, node in NODES.items():
        if path == f"recipe/{name}" or path.startswith(f"preset/{name}/"):
            group, _, entry = path.rpartition("/")
            ConfigStore.instance().store(name=entry, node=node, group=group, package="_global_")


def _parameters(target: Any) -> list[str]:
    try:
        return list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return []
