"""README.md is a landing page: short, and every command it prints is one a guide prints and its tests run as printed.

The README's examples are copies of guide lines (docs/guides/*.md), so the guide's own tests (test_readme_data,
test_readme_images, hf/test_sft_cli, ...) are what run them; here each README line must still be in a guide verbatim,
the extras its install lines name must exist, and each guide and method page it links must exist.
"""

from __future__ import annotations

import re

import pytest
from helpers import GUIDES, REPO

README = (REPO / "README.md").read_text()
MAX_LINES = 300


def bash_lines(text: str) -> list[str]:
    return [line.split(" #")[0].strip() for code in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)
            for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_is_a_landing_page_of_at_most_300_lines():
    assert len(README.splitlines()) <= MAX_LINES
    for heading in ("## The six methods", "## Install", "## Quick start", "## Three examples", "## Where to go next"):
        assert heading in README, heading


def test_every_readme_command_is_a_guides_line_or_an_install_or_make_line():
    guides = {line for page in GUIDES.glob("*.md") for line in bash_lines(page.read_text())}
    lines = bash_lines(README)
    examples = [line for line in lines if line.startswith("python -m framework.")]
    assert len(examples) >= 3
    assert [line for line in examples if line not in guides] == []  # each runs as printed in its guide's tests
    assert all(line.startswith(("python -m framework.", "pip install ", "make ")) for line in lines), lines


def test_the_extras_the_readme_installs_exist():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {e for group in re.findall(r"pip install -e '\.\[([\w,]+)\]'", README) for e in group.split(",")}
    assert named and named <= extras, named - extras
    mentioned = set(re.findall(r"`(\w+)`", README.split("Other extras:", 1)[1].split("\n\n", 1)[0]))
    assert mentioned <= extras, mentioned - extras


def test_each_method_of_the_table_links_its_page():
    table = README.split("## The six methods", 1)[1].split("\n\n", 2)[1]
    names = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert names == ["olion", "mask_agnostic", "rlkv", "gicdm", "orthogonal_growth", "data_agent"]
    for link in re.findall(r"\]\((docs/[\w/.]+)\)", table):
        assert (REPO / link).is_file(), link
