"""The README's "Use the parts in your own project" section, run as printed: every python block, verbatim, each in
a fresh namespace and an empty folder; the Hub blocks against the local Hub server."""

from __future__ import annotations

import os
import re

import pytest
from helpers import REPO

SECTION = "## Use the parts in your own project"


def blocks() -> list[str]:
    body = (REPO / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```", body, flags=re.M | re.S)


def test_the_section_shows_each_part():
    text = "\n".join(blocks())
    for part in ("DataSelection", "GICDM", "push_to_hub", "OLion"):
        assert part in text, f"the section has no block using {part}"


@pytest.mark.parametrize("index", range(len(blocks())))
def test_each_block_runs_as_printed(index, hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    source = blocks()[index]
    code = compile(source, f"README.md ({SECTION[3:]}, block {index + 1})", "exec")
    exec(code, {"__name__": f"readme_block_{index}"})  # noqa: S102 - the README's own code, as a reader runs it
    assert os.getcwd() == str(tmp_path)
