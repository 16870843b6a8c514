"""The README's "Use the parts in your own project" section, run as printed: every python block, verbatim, each in
a fresh namespace and an empty folder; the Hub blocks against the local Hub server."""

from __future__ import annotations

import os
import re

import pytest
from helpers import guide


def blocks() -> list[str]:
    body = guide("your_project")
    return re.findall(r"^```python\n(.*?)^```", body, flags=re.M | re.S)


@pytest.fixture
def data_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_DATA_CACHE", str(tmp_path / "data-cache"))


def test_the_section_shows_each_part():
    text = "\n".join(blocks())
    for part in ("DataSelection", "GICDM", "push_to_hub", "OLion", "TextData", "ChatData", "ImageData"):
        assert part in text, f"the section has no block using {part}"


#: the Hub models the blocks read by name, stood in for on the local Hub by tiny ones of the same kind
CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("index", range(len(blocks())))
def test_each_block_runs_as_printed(index, hub, tmp_path, monkeypatch, data_cache):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    source = blocks()[index]
    if CHAT_MODEL in source and not hub.api.repo_exists(CHAT_MODEL):
        from support.tiny_chat import CHATML, tiny_tokenizer

        tiny_tokenizer(CHATML, eos="<|im_end|>").push_to_hub(CHAT_MODEL)  # SmolLM2's template is ChatML
    code = compile(source, f"docs/guides/your_project.md (block {index + 1})", "exec")
    exec(code, {"__name__": f"readme_block_{index}"})  # noqa: S102 - the README's own code, as a reader runs it
    assert os.getcwd() == str(tmp_path)
