"""Recipes: named compositions of registered parts, stored in Hydra's `recipe` group at package `_global_`.

A recipe does exactly what the same overrides on the command line would do: it picks group choices
(`defaults={"optimizer": "olion"}`) and sets values (`trainer={"max_steps": 200}`). Command-line choices and
values still win, whatever their order.
"""

from __future__ import annotations

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
    """
    if smoke is not None:
        SMOKE[name] = list(smoke)
    overrides = [{f"override /{group}": choice} for group, choice in (defaults or {}).items()]
    # untyped on purpose: a typed config in `_global_` fails to merge with the primary config
    cfg = OmegaConf.create({"defaults": ["_self_", *overrides], **values})
    RECIPES.register(cfg, name=name, description=description)
    ZEN_STORE(cfg, group="recipe", name=name, package="_global_")
    return cfg
