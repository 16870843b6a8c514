"""The docs site (mkdocs.yml): `mkdocs build --strict` passes with no warning, every page of docs/ is in the nav,
the root BENCHMARKS.md and CHANGELOG.md are pages of it, and the API reference has an entry for every registered
component and every name the docs import. One build serves the module (about 6 s on a quiet machine).

The rule for registered names: a component of ours (a target under `framework.`) is documented by its real path
(`framework.optim.olion.OLion`: the built HTML has that id); a component that is PyTorch's or Lightning's
(`optimizer=adamw`, `callbacks=[checkpoint]`) is linked to its own project's documentation, by its public path,
from the page of its kind."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from framework.registry import KINDS, load_catalog

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = "reference/api"
#: the INFO lines a clean build prints; any other (mkdocs 1.6 reports some link problems at INFO) fails the build test
CLEAN_INFO = ("Cleaning site directory", "Building documentation to directory", "Documentation built in")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "tools" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _IgnoreTags(yaml.SafeLoader):
    """mkdocs.yml as plain data: its `!!python/...` values (the toc slugify) read as None."""


_IgnoreTags.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_IgnoreTags)


def _nav_files(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav] if nav.endswith(".md") else []
    if isinstance(nav, dict):
        return [f for v in nav.values() for f in _nav_files(v)]
    return [f for item in nav for f in _nav_files(item)]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> SimpleNamespace:
    """`mkdocs build --strict` of the checkout into a temporary folder: `.proc`, `.dir`, `.api` (the API pages' HTML,
    page name → text)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's banner about MkDocs 2.0
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=600)
    api = {p.parent.name: p.read_text() for p in (out / API).glob("*/index.html")}
    return SimpleNamespace(proc=proc, dir=out, api=api)


def test_the_site_builds_strictly_with_no_warning(site):
    lines = (site.proc.stdout + site.proc.stderr).splitlines()
    assert site.proc.returncode == 0, "\n".join(lines[-40:])
    noise = [line for line in lines if "WARNING" in line or ("INFO" in line and not any(m in line for m in CLEAN_INFO))]
    assert noise == [], "\n".join(noise)


def test_every_page_in_docs_is_in_the_nav_and_every_nav_entry_exists():
    config = _config()
    listed = _nav_files(config["nav"])
    generated = set(_hooks().ROOT_PAGES.values())
    missing = [f for f in listed if f not in generated and not (DOCS / f).is_file()]
    assert missing == [], f"mkdocs.yml's nav names {missing}, which docs/ does not have: drop or rename the entries"
    skipped = [p.strip().strip("/") for p in config.get("not_in_nav", "").splitlines() if p.strip()]
    assert all((DOCS / d).is_dir() for d in skipped), f"not_in_nav names folders of tool outputs only: {skipped}"
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
                   if not any(p.relative_to(DOCS).as_posix().startswith(d + "/") for d in skipped))
    absent = [f"docs/{p}" for p in pages if p not in listed]
    assert absent == [], (f"{absent} are not in mkdocs.yml's nav: add each under its section (a guide under "
                          "'Guides', in the order a user meets it)")
    assert len(listed) == len(set(listed)), "a page is listed twice in the nav"


def test_benchmarks_and_changelog_are_pages_of_the_site_and_docs_links_reach_them(site):
    for page, title in (("benchmarks", "Benchmarks"), ("changelog", "Changelog")):
        html = (site.dir / page / "index.html").read_text()
        assert re.search(rf"<h1[^>]*>{title}", html), f"{page}/index.html has no '{title}' heading"
    assert 'href="../benchmarks/' in (site.dir / "olion" / "index.html").read_text()  # docs/olion.md: ../BENCHMARKS.md
    assert 'src="../bench/' in (site.dir / "benchmarks" / "index.html").read_text()  # BENCHMARKS.md: docs/bench/*.png


def test_links_leaving_docs_become_site_links_or_code_references(caplog):
    """From docs/guides/x.md: a root page becomes its site page (anchor kept); another repository file a code
    reference; a missing file a warning (which fails a strict build); links in code stay as written."""
    hooks = _hooks()
    rewrite = hooks._Rewriter(DOCS / "guides", "guides", DOCS, "guides/x.md")
    assert rewrite.line("[the table](../../BENCHMARKS.md#optimizers).") == "[the table](../benchmarks.md#optimizers)."
    assert rewrite.line("[run_all](../../tools/bench/run_all.py)") == "run_all (`tools/bench/run_all.py`)"
    assert rewrite.line("[`tools/gpu_check.py`](../../tools/gpu_check.py)") == "`tools/gpu_check.py`"
    assert rewrite.line("[OLion](../olion.md#x) and `[a](../../BENCHMARKS.md)`") == (
        "[OLion](../olion.md#x) and `[a](../../BENCHMARKS.md)`")
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.docs_hooks"):
        rewrite.line("[gone](../../NOPE.md)")
    assert "guides/x.md links to ../../NOPE.md, which does not exist" in caplog.text
    root_page = hooks._Rewriter(ROOT, "", DOCS, "benchmarks.md")
    assert root_page.line("![plot](docs/img/rlkv_gates.png)") == "![plot](img/rlkv_gates.png)"


def _public_path(target) -> str:
    """The shortest import path of a class or function from another project (`torch.optim.AdamW`)."""
    parts = target.__module__.split(".")
    for n in range(1, len(parts) + 1):
        module = importlib.import_module(".".join(parts[:n]))
        if getattr(module, target.__qualname__, None) is target:
            return f"{'.'.join(parts[:n])}.{target.__qualname__}"
    return f"{target.__module__}.{target.__qualname__}"


def _cli(kind: str, name: str) -> str:
    group = KINDS[kind].group
    return f"{group}=[{name}]" if kind == "callback" else f"{group}={name}"


def test_every_registered_component_has_its_api_entry(site):
    """Ours: an entry with the id of its real path, on the page that names it as the command line does
    (`optimizer=olion`); PyTorch's and Lightning's: a link to their documentation, by public path."""
    load_catalog()
    problems = []
    for kind, registry in KINDS.items():
        if kind == "recipe":  # recipes are compositions of these names, listed by `python -m framework.ls recipe`
            continue
        for name in registry:
            target = registry.get(name)
            cli = _cli(kind, name)
            if target.__module__.startswith("framework."):
                path = f"{target.__module__}.{target.__qualname__}"
                pages = [page for page, html in site.api.items() if f'id="{path}"' in html]
                if not pages:
                    problems.append(f"{cli}: no entry `::: {path}` on a page of docs/{API}/")
                elif not any(f"<code>{cli}</code>" in site.api[page] for page in pages):
                    problems.append(f"{cli}: the page documenting {path} ({pages}) does not say `{cli}`")
            else:
                public = _public_path(target)
                link = re.compile(rf'<a href="https://[^"]+"[^>]*><code>{re.escape(public)}</code></a>')
                if not any(link.search(html) and f"<code>{cli}</code>" in html for html in site.api.values()):
                    problems.append(f"{cli}: no page of docs/{API}/ says `{cli}` and links [`{public}`](https://...)")
    assert problems == [], "\n".join(problems)


_IMPORT = re.compile(r"^\s*from (framework(?:\.\w+)*) import \(?([\w, ]+)\)?", re.M)


def test_every_name_the_readme_and_docs_import_has_its_api_entry(site):
    """`from framework.X import Y` in README.md or docs/: Y's real path (`from framework.metrics import GICDM` is
    framework.metrics.gicdm.GICDM) has an entry; a registry instance counts as its class."""
    problems = []
    for doc in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for module_name, names in _IMPORT.findall(doc.read_text()):
            module = importlib.import_module(module_name)
            for name in (n.strip() for n in names.split(",") if n.strip()):
                obj = getattr(module, name, None)
                where = f"{doc.relative_to(ROOT)}: from {module_name} import {name}"
                if obj is None:
                    problems.append(f"{where}: {module_name} has no {name}")
                    continue
                if inspect.ismodule(obj):
                    continue
                if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                    obj = type(obj)
                path = f"{obj.__module__}.{obj.__qualname__}"
                if not any(f'id="{path}"' in html for html in site.api.values()):
                    problems.append(f"{where}: no entry `::: {path}` on a page of docs/{API}/")
    assert problems == [], "\n".join(problems)


def test_the_docs_extra_is_in_the_dev_extra():
    """make test installs `.[dev]` and builds the site: dev carries every requirement of the docs extra."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"mkdocs", "mkdocs-material", "mkdocstrings[python]"} <= {re.split("[<>=]", r)[0] for r in extras["docs"]}
    assert set(extras["docs"]) <= set(extras["dev"])
