"""README's "Your own Hugging Face model" section, run as printed, in order, against the local Hub: every command line
(at its recipe's smoke size and steps, `FRAMEWORK_SMOKE=1`; a data-selection line keeps its own steps, which decide
whether it prunes) and every Python block (in a fresh process, as a reader would)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import REPO
from support import warm_cli

pytest.importorskip("transformers")

SECTION, SERVING, GROW = "## Your own Hugging Face model", "## Serving with a mixed KV cache", "## Grow your own MoE"


def _blocks(section: str) -> list[tuple[str, str]]:
    body = (REPO / "README.md").read_text().split(section, 1)[1]
    body = re.split(r"^## ", body, maxsplit=1, flags=re.M)[0]
    return re.findall(r"^```(\w*)\n(.*?)^```", body, flags=re.M | re.S)


def _smoke_steps(argv: list[str]) -> list[str]:
    """A README training line at smoke length: its stated `trainer.max_steps` (which FRAMEWORK_SMOKE would keep, as it
    keeps every key a command sets) left out, so smoke's steps apply; a data-selection line (`sampler=`) keeps its
    own, since which epochs it prunes in is its length."""
    assert any(a.startswith("trainer.max_steps=") for a in argv), f"a README training line states its steps: {argv}"
    if any(a.startswith("sampler=") for a in argv):
        return argv
    return [a for a in argv if not a.startswith("trainer.max_steps=")]


def _run_section(section: str, hub, tmp_path, one_folder: bool = False
                 ) -> tuple[list[str], list[tuple[str, dict | str]]]:
    """Every block of `section` in order: python blocks in a fresh process, `python -m MODULE` lines as printed (a
    `framework.train` line at its recipe's smoke size and steps, `_smoke_steps`), each line in a folder of its own or,
    `one_folder`, all of a block in one (a line reads what the one before wrote). Returns the python blocks' stdout
    and (line, its results.json or its stdout) per command line."""
    # one HF_HOME for the module's sections, as one user's machine has: their runs share one warm server
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FRAMEWORK_SMOKE": "1",
           "HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(hub.root / "hf_home")}
    printed, ran = [], []
    for i, (lang, code) in enumerate(_blocks(section)):
        cwd = tmp_path / f"block{i}"
        cwd.mkdir()
        if lang == "python":
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                                  timeout=300)
            assert proc.returncode == 0, f"{code}\n{proc.stderr[-3000:]}"
            printed.append(proc.stdout.strip())
            continue
        for j, line in enumerate(code.strip().splitlines()):
            argv = shlex.split(line)
            assert argv[:2] == ["python", "-m"], line
            where = cwd if one_folder else cwd / str(j)
            where.mkdir(exist_ok=True)
            before = set(where.glob("outputs/train/*/results.json"))
            args = _smoke_steps(argv[3:]) if argv[2] == "framework.train" else argv[3:]
            proc = warm_cli.run(argv[2], args, env, where, timeout=300)
            assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
            if argv[2] != "framework.train":
                ran.append((line, proc.stdout))
                continue
            (results,) = [json.loads(p.read_text()) for p in set(where.glob("outputs/train/*/results.json")) - before]
            if "hub.repo_id=" in line:
                repo = line.split("hub.repo_id=")[1].split()[0]
                assert results["hub"]["repo_id"] == repo
                files = set(hub.api.list_repo_files(repo))
                assert {"config.json", "model.safetensors", "framework.json", "README.md"} <= files, files
            ran.append((line, results))
    return printed, ran


@pytest.mark.slow  # make test-slow: make test's time limit
def test_the_section_runs_as_printed(hub, tmp_path):
    assert [lang for lang, _ in _blocks(SECTION)] == ["bash", "python", "bash", "python"]
    printed, ran = _run_section(SECTION, hub, tmp_path)
    for line, results in ran:
        if "sampler=infobatch" in line:  # it runs long enough to prune, and says how much it pruned
            assert results["metrics"]["selection/samples_seen"] > 0
            assert results["metrics"]["selection/pruned"] > 0, results["metrics"]
    tokens = json.loads(printed[0].replace("(", "[").replace(")", "]"))
    assert len(tokens) == 8 and all(0 <= t < 256 for t in tokens)  # greedy bytes from transformers' own generate
    scores = eval(printed[1], {})  # noqa: S307 - the block's own printed dict of floats
    assert set(scores) >= {"precision", "recall", "density", "coverage"}
    assert all(0.0 <= scores[k] <= 1.0 for k in ("precision", "recall", "coverage"))


@pytest.mark.long
def test_the_serving_section_runs_as_printed(hub, tmp_path):
    """The probe's allocation travels with the model, in both layouts; the CLI and transformers' generate() decode
    with it, and hold fewer bytes than the full cache."""
    assert [lang for lang, _ in _blocks(SERVING)] == ["bash", "python"]
    printed, ran = _run_section(SERVING, hub, tmp_path)
    files = set(hub.api.list_repo_files("local-user/chase-llama-rlkv"))
    assert {"head_allocation.json", "attn_pattern/full_attention_heads.tsv", "attn_pattern/config.json"} <= files
    line, out = ran[-1]
    held, full = re.search(r"kv cache: ([\d,]+) bytes held for \d+ positions, the full cache ([\d,]+)", out).groups()
    assert int(held.replace(",", "")) < int(full.replace(",", ""))
    cli_tokens = json.loads(re.search(r"tokens: (\[.*\])", out).group(1))
    tokens, nbytes = printed[0].rsplit(" ", 1)
    assert json.loads(tokens) == cli_tokens and int(nbytes) == int(held.replace(",", ""))


@pytest.mark.slow  # make test-slow: make test's time limit
def test_the_grow_your_own_moe_section_runs_as_printed(hub, tmp_path):
    """An OLMoE pushed by name, grown by name and pushed in transformers' layout; transformers opens it with twice
    the layers, experts and experts per token; the growth record travels with it."""
    assert [lang for lang, _ in _blocks(GROW)] == ["bash", "python"]
    printed, ran = _run_section(GROW, hub, tmp_path, one_folder=True)
    assert printed == ["4 8 2"]
    files = set(hub.api.list_repo_files("local-user/tiny-olmoe-grown"))
    assert {"config.json", "model.safetensors", "framework.json", "growth.json"} <= files, files
    assert "written to grown-olmoe" in ran[1][1]  # the grow line, as printed
