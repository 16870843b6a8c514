"""Every registered name composes into a config and builds; the library never imports the catalog."""

import ast
from pathlib import Path

import pytest
from hydra import compose, initialize
from hydra_zen import instantiate
from omegaconf import OmegaConf

from framework.registry import GROUPS, RECIPES

ENTRIES = [(g, n) for g, reg in GROUPS.items() if reg is not RECIPES for n in reg.names(aliases=True)]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hydra():
    with initialize(version_base="1.3", config_path=None):
        yield


def _choice(group: str, name: str) -> str:
    return f"{group}=[{name}]" if group == "callbacks" else f"{group}={name}"


@pytest.mark.parametrize(("group", "name"), ENTRIES, ids=[f"{g}={n}" for g, n in ENTRIES])
def test_every_registered_name_composes_and_instantiates(hydra, group, name, tmp_path):
    cfg = compose(config_name="train", overrides=[_choice(group, name)])
    node = cfg[group][name] if group == "callbacks" else cfg[group]
    assert node is not None and "_target_" in node
    plain = OmegaConf.to_container(node, resolve=False)
    node = {k: (str(tmp_path) if isinstance(v, str) and "hydra:" in v else v) for k, v in plain.items()}
    assert instantiate(node) is not None


@pytest.mark.parametrize("name", RECIPES.names())
def test_every_recipe_composes(hydra, name):
    cfg = compose(config_name="train", overrides=[f"recipe={name}"])
    assert cfg.data is not None and cfg.module is not None


def test_the_library_never_imports_the_catalog_or_recipes():
    allowed = {"framework/train.py", "framework/ls.py", "framework/hub.py", "framework/cli.py"}
    offenders = []
    for path in (REPO / "framework").rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        if rel in allowed or "__main__" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
            )
            offenders += [
                f"{rel}: {m}" for m in mods if m.startswith(("framework.catalog", "framework.recipes"))
            ]
    assert offenders == []
