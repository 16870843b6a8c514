"""pyproject.toml installs every package of the tree, with `registry/`, `recipes/` and `conf/` inside the framework
namespace; a built wheel carries the local Hub server and its type hints but no test code, declares every package the
code imports, and, installed in a fresh environment outside the repo, runs recipes and serves the Hub."""

import ast
import contextlib
import importlib.metadata
import json
import os
import re
import select
import shutil
import site
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import framework.catalog
import framework.recipes
import pytest
from packaging.version import Version

from framework.registry import RECIPES

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


#: what a wheel is built from: the rest of the checkout (tests, docs, tools) must not be needed
SOURCES = ("pyproject.toml", "README.md", "framework", "registry", "recipes", "conf")


def build_wheel(out: Path) -> Path:
    """Build the wheel from a copy of SOURCES under `out` (setuptools' build/ and egg-info stay out of the checkout,
    so concurrent builds cannot race on them); returns the wheel's path."""
    src = out / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                            str(out / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = (out / "dist").glob("framework-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from this checkout's sources (once for the module)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_a_built_wheel_carries_the_local_hub_and_type_hints_but_no_test_code(wheel):
    """The local Hub server (`framework/local_hub/`) and the PEP 561 marker ship; test-support code (fault injection,
    the warm CLI runner: tests/support/) and the tests stay out."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"framework"}, top  # no tests/, no support/
    assert {"framework/py.typed", "framework/local_hub/__main__.py", "framework/local_hub/server.py",
            "framework/local_hub/routes.py", "framework/local_hub/storage.py"} <= set(names)
    support = {p.name for p in (ROOT / "tests" / "support").glob("*.py")} - {"__init__.py", "local_hub.py"}
    assert support, "tests/support/ moved? update this test"
    leaked = [n for n in names if n.startswith(("framework/testing/", "framework/tests/", "framework/support/"))
              or "/tests/" in n or "/support/" in n or n.rsplit("/", 1)[-1] in support]
    assert leaked == []


@pytest.mark.slow  # 11 s; make test trains a recipe from the installed wheel outside the repo (below)
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


# ---- what the wheel declares -----------------------------------------------------------------------------------
#: packages the code imports only behind a check, each in an extra, with what a user without it gets
OPTIONAL = {"tensorboard": "the TensorBoard logger is skipped (extra `tensorboard`)",
            "rich": "the plain progress bar is used (extra `progress`)",
            "transformers": "model=hf_causal_lm / hf_masked_lm say to install the extra `hf`",
            "datasets": "data=text / chat say to install the extra `data`",
            "jinja2": "data=chat renders chat templates with it, as transformers does (extra `data`)",
            "zstandard": "a .zst data file is refused saying to install it (extra `data`)",
            "peft": "peft=lora says to install the extra `peft`"}
#: the oldest release of a package with an API the code calls: (floor, the API, a file that calls it)
FLOORS = {"torch": ("2.9", "torch.optim.Muon", "framework/optim/muon.py"),
          "huggingface-hub": ("0.25", "huggingface_hub.errors", "framework/hub/load.py"),
          "lightning": ("2.3", "ModelParallelStrategy", "framework/strategies.py")}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def _requirements(wheel: Path) -> tuple[dict[str, str], set[str]]:
    """(core requirement → its floor, names required only by an extra) from the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = [v for k, _, v in (line.partition(": ") for line in z.read(meta).decode().splitlines())
                 if k == "Requires-Dist"]
    core, extra = {}, set()
    for line in lines:
        name, floor = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\(?>=\s*([\w.]+))?", line).groups()
        if "extra ==" in line:
            extra.add(_norm(name))
        else:
            core[_norm(name)] = floor or ""
    return core, extra


def test_every_package_the_code_imports_is_a_declared_dependency(wheel):
    """Each third-party module imported anywhere in the wheel's code belongs to a core requirement, or is one of the
    OPTIONAL packages the code checks for and an extra provides (scikit-learn, behind three recipes' data, and
    lion-pytorch, behind `optimizer=lion`, were once only in the dev and bench extras)."""
    imported: set[str] = set()
    with zipfile.ZipFile(wheel) as z:
        for name in (n for n in z.namelist() if n.endswith(".py")):
            for node in ast.walk(ast.parse(z.read(name), name)):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"framework"}
    dists = importlib.metadata.packages_distributions()  # module → distribution, for what is installed here
    assert not [m for m in third_party - set(OPTIONAL) if m not in dists], "imported but installed by no distribution"
    core, extra = _requirements(wheel)
    needed = {_norm(d) for m in third_party - set(OPTIONAL) for d in dists[m]} | (third_party & set(OPTIONAL))
    assert {"scikit-learn", "lion-pytorch"} <= needed and needed - set(core) <= set(OPTIONAL), needed - set(core)
    assert set(OPTIONAL) <= extra


def test_each_floor_is_at_least_the_release_that_added_what_the_code_calls(wheel):
    core, _ = _requirements(wheel)
    for name, (floor, api, where) in FLOORS.items():
        assert api in (ROOT / where).read_text(), f"{where} no longer uses {api}: drop or move the {name} row"
        assert Version(core[name]) >= Version(floor), f"{name}>={core[name]} but {api} needs {floor}"
    assert all(core.values()), f"every core requirement has a floor: {core}"


# ---- the wheel installed in a fresh environment outside the repo -----------------------------------------------
@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The python of a fresh venv outside the repo with the wheel pip-installed (`--no-deps`). Its third-party
    packages come from this venv's site-packages through a `.pth` line, written after the install so pip never sees
    the editable `framework`; a `.pth` path is not a site dir, so the editable install's finder there never runs."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                          "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(purelib, "project_packages.pth").write_text(f"{site.getsitepackages()[0]}\n")
    return python


def _env(home: Path, **extra: str) -> dict[str, str]:
    """This environment less what could point Python, the framework or the Hub client at the checkout or a cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "FRAMEWORK_", "HF_"))}
    return {**env, "HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def run_installed(python: Path, args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    """`python ARGS` of the fresh environment, run in `cwd` (outside the repo) as a user's shell would."""
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd, env=_env(cwd, **extra),
                          timeout=600)


@contextlib.contextmanager
def served_hub(python: Path, root: Path) -> Iterator[str]:
    """`python -m framework.local_hub --root ROOT --port 0` of the fresh environment; yields the URL it prints."""
    proc = subprocess.Popen([str(python), "-m", "framework.local_hub", "--root", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(root.parent))
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("LocalHub serving"), line + proc.stderr.read() if proc.poll() is not None else line
        yield line.rsplit(" at ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_installed_wheel_is_what_imports_outside_the_repo(installed, tmp_path):
    code = ("import importlib.resources as r, importlib.util as u, framework.local_hub as h;"
            "print(h.__file__, *(u.find_spec(f'framework.{m}').origin for m in ('catalog', 'recipes')));"
            "print(r.files('framework').joinpath('py.typed').is_file())")
    proc = run_installed(installed, ["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files, typed = proc.stdout.splitlines()
    venv = installed.parents[1]
    assert all(Path(f).is_relative_to(venv) for f in files.split()), files
    assert typed == "True"


def test_the_installed_wheel_trains_a_recipe_outside_the_repo(installed, tmp_path):
    """`recipe=data_agent_digits size=smoke`, whose data comes from scikit-learn, trains and writes its results."""
    proc = run_installed(installed, ["-m", "framework.train", "recipe=data_agent_digits", "size=smoke",
                                     "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (results["recipe"], results["global_step"]) == ("data_agent_digits", 4)


def test_the_installed_wheel_serves_the_local_hub(installed, tmp_path):
    """`python -m framework.local_hub` of the installed package serves what the real client uploads and lists
    (docs/hub.md's walkthrough, pushes included, runs in tests/test_docs_commands.py)."""
    from huggingface_hub import HfApi

    (tmp_path / "card.md").write_text("# a model\n")
    with served_hub(installed, tmp_path / "hub") as url:
        api = HfApi(endpoint=url, token="local-token")
        api.create_repo("me/model")
        api.upload_file(path_or_fileobj=tmp_path / "card.md", path_in_repo="README.md", repo_id="me/model")
        assert "README.md" in api.list_repo_files("me/model")
    assert any((tmp_path / "hub").rglob("*.json"))  # the repos persist under --root


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES.names())
def test_the_installed_wheel_runs_every_recipe_at_smoke_size_outside_the_repo(installed, tmp_path, name):
    args = ["-m", "framework.train", f"recipe={name}", "size=smoke", "hydra.run.dir=run"]
    if name == "sft":  # its default model and data are Hub ids: tiny stand-ins under them, on the wheel's own Hub
        from huggingface_hub import HfApi
        from support.stand_ins import serve_chat

        with served_hub(installed, tmp_path / "hub") as url:
            serve_chat(HfApi(endpoint=url, token="dummy"))
            proc = run_installed(installed, args, tmp_path, HF_ENDPOINT=url, HF_TOKEN="dummy")
    else:
        proc = run_installed(installed, args, tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["recipe"] == name
