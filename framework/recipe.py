"""Recipes: named compositions of registered parts, stored in Hydra's `recipe` group at package `_global_`.

A recipe does exactly what the same overrides on the command line would do: it picks group choices
(`defaults={"optimizer": "olion"}`) and sets values (`trainer={"max_steps": 200}`). Command-line choices and
values still win, whatever their order.
"""

from __future__ import annotations

import inspect
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.registry import RECIPES, ZEN_STORE

# recipe name -> command-line overrides that shrink it to a few-second smoke run (what the CLI tests run)
SMOKE: dict[str, list[str]] = {}
# the part of a smoke run every recipe shares: 4 steps, one thread, two short validations, no progress bar
SMOKE_RUN = ["threads=1", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
             "trainer.enable_progress_bar=false"]


def recipe(
    name: str,
    *,
    description: str,
    defaults: dict[str, Any] | None = None,
    smoke: list[str] | None = None,
    **values: Any,
) -> DictConfig:
    """Register recipe `name`: group choices in `defaults`, plain values as keyword arguments.

    `smoke` lists overrides that make the recipe a tiny run (4 steps); the test suite runs every recipe with them.
    An integer `trainer.val_check_interval` counts global steps (`check_val_every_n_epoch=None` unless given).
    """
    if smoke is not None:
        SMOKE[name] = list(smoke)
    trainer = values.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("val_check_interval"), int):
        # an integer interval counts optimizer steps across epochs, so it holds however many batches an epoch has
        # (DDP halves them); a recipe that means "every N batches of each epoch" says check_val_every_n_epoch=1
        values["trainer"] = {"check_val_every_n_epoch": None, **trainer}
    overrides = [{f"override /{group}": choice} for group, choice in (defaults or {}).items()]
    # untyped on purpose: a typed config in `_global_` fails to merge with the primary config
    cfg = OmegaConf.create({"defaults": ["_self_", *overrides], **values})
    RECIPES.register(cfg, name=name, description=description)
    ZEN_STORE(cfg, group="recipe", name=name, package="_global_")
    return cfg


#: smoke overrides `FRAMEWORK_SMOKE=1` leaves out: the validation schedule stays the one the command gives
SMOKE_KEEPS = ("trainer.val_check_interval",)


def smoke_overrides(argv: list[str]) -> list[str]:
    """What `FRAMEWORK_SMOKE=1` adds to a `python -m framework.train` command line: the smoke overrides of the
    recipe it names (data, model and step count shrunk to a few seconds), less any key the command sets itself and
    less the validation schedule, so the command is tried as written, only smaller. [] without a single recipe."""
    recipes = {a.split("=", 1)[1] for a in argv if a.startswith("recipe=")}
    if len(recipes) != 1 or (name := recipes.pop()) not in SMOKE:
        return []
    given = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    return [a for a in SMOKE[name] if a.split("=", 1)[0].lstrip("+~") not in {*given, *SMOKE_KEEPS}]


def fit_to_choices(argv: list[str]) -> list[str]:
    """Leave out the values the recipe named in `argv` sets for a group the command line swaps, where the new
    choice does not take them (`recipe=char_lm scheduler=constant`: `constant` has no `warmup_steps`), so the
    recipe's values carry over exactly where they fit. Re-stores the recipe in Hydra's ConfigStore for this process
    only; returns one note per value left out."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from framework.registry import GROUPS

    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return []
    names = [ov.value() for ov in overrides if ov.key_or_group == "recipe" and not ov.is_sweep_override()]
    if len(names) != 1 or names[0] not in RECIPES:
        return []
    name = RECIPES.resolve(str(names[0]))
    cfg = RECIPES.get(name)
    left_out, fitted = [], OmegaConf.to_container(cfg)
    for ov in overrides:
        group = ov.key_or_group
        if group in ("recipe", "callbacks") or group not in GROUPS or not isinstance(fitted.get(group), dict):
            continue
        choices = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.value()]
        if any(c is None or str(c) not in GROUPS[group] for c in choices):
            continue
        takes = set.intersection(*(set(_parameters(GROUPS[group].get(str(c)))) for c in choices))
        for key in [k for k in fitted[group] if k not in takes]:
            left_out.append(f"{group}={','.join(map(str, choices))} takes no {key}: recipe {name}'s "
                            f"{group}.{key}={fitted[group].pop(key)} is left out")
    if left_out:
        ConfigStore.instance().store(name=name, node=OmegaConf.create(fitted), group="recipe", package="_global_")
    return left_out


def _parameters(target: Any) -> list[str]:
    try:
        return list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return []
