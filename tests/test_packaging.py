"""pyproject.toml installs every package of the tree, with `registry/` and `recipes/` inside the framework namespace."""

from pathlib import Path

import framework.catalog
import framework.recipes
import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_with_python_files_is_an_installed_package():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "framework").rglob("*.py")
            if "__pycache__" not in p.parts}
    assert set(setuptools["packages"]) == tree | {"framework.catalog", "framework.recipes"}
    assert setuptools["package-dir"] == {"framework.catalog": "registry", "framework.recipes": "recipes"}


def test_the_catalog_and_recipes_import_from_the_top_level_folders():
    assert Path(framework.catalog.__file__).parent == ROOT / "registry"
    assert Path(framework.recipes.__file__).parent == ROOT / "recipes"
