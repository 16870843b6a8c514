"""pyproject.toml installs every package of the tree, with `registry/`, `recipes/` and `conf/` inside the framework
namespace; a built wheel runs a recipe at a conf/ size and carries no test code."""

import site
import subprocess
import sys
import zipfile
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
    assert set(setuptools["packages"]) == tree | {"framework.catalog", "framework.recipes", "framework.conf"}
    assert setuptools["package-dir"] == {"framework.catalog": "registry", "framework.recipes": "recipes",
                                         "framework.conf": "conf"}


def test_the_catalog_and_recipes_import_from_the_top_level_folders():
    assert Path(framework.catalog.__file__).parent == ROOT / "registry"
    assert Path(framework.recipes.__file__).parent == ROOT / "recipes"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel` builds from this checkout (built once for the module)."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                            str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = out.glob("framework-*.whl")
    return path


def test_a_built_wheel_carries_no_test_code(wheel):
    """Test-support code (the local Hub server, fault injection: tests/support/) and the tests stay out of it."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"framework"}, top  # no tests/, no support/
    support = {p.name for p in (ROOT / "tests" / "support").glob("*.py") if p.name != "__init__.py"}
    assert support, "tests/support/ moved? update this test"
    leaked = [n for n in names if n.startswith(("framework/testing/", "framework/tests/", "framework/support/"))
              or "/tests/" in n or "/support/" in n or n.rsplit("/", 1)[-1] in support or "local_hub" in n]
    assert leaked == []


def test_a_built_wheel_carries_conf_and_composes_a_recipe_at_a_conf_size(wheel, tmp_path):
    """The wheel holds every conf/ YAML as framework/conf/; unpacked and imported without the editable install
    (`python -S`, site-packages on PYTHONPATH), `--cfg job` shows `size=smoke`'s values from conf/preset/."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "pkg")
    conf = {f"framework/conf/{p.relative_to(ROOT / 'conf').as_posix()}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert conf and conf <= names
    env = {"PYTHONPATH": f"{tmp_path / 'pkg'}:{site.getsitepackages()[0]}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-S", "-c", "import framework.recipe as r; print(r.CONF_DIR)"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.stdout.strip() == str(tmp_path / "pkg" / "framework" / "conf"), proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-S", "-m", "framework.train", "recipe=char_lm", "size=smoke", "--cfg",
                           "job"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "max_bytes: 60000" in proc.stdout, proc.stderr[-3000:]
