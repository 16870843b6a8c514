"""The Hugging Face guides (docs/guides/your_model.md, kv_cache.md, grow_moe.md), run in order against the guides'
local Hub (`guide_hub`: the Hub ids they name are tiny stand-ins of those models, `support.stand_ins`): every
command line and every Python block. `make test` runs each at a small size (`small`: the training lines at their
recipe's smoke size and steps, every line and block in a process forked warm, `support.guides`); `make test-slow`
runs each exactly as printed, in fresh processes, its steps and sizes its own, checking what the guide says of it
(each line's wall time printed: `pytest -s`)."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest
import torch
from support import guides
from support.stand_ins import BASE_MODEL, CHAT_DATA, CHAT_MODEL, MOE_MODEL, serve_base, serve_chat, serve_moe

pytest.importorskip("transformers")

SECTION, SERVING, GROW = "your_model", "kv_cache", "grow_moe"  # docs/guides/NAME.md
SIZES = [pytest.param(True, marks=pytest.mark.long, id="small"),
         pytest.param(False, marks=[pytest.mark.slow, pytest.mark.timeout(1800)], id="as-printed")]


def _smoke_steps(argv: list[str]) -> list[str]:
    """A guide's training line at smoke length: its stated `trainer.max_steps` (which FRAMEWORK_SMOKE would keep, as
    it keeps every key a command sets) left out, so smoke's steps apply; a data-selection line (`sampler=`) keeps its
    epochs, since which epochs it prunes in is its length: a quarter of its data in a quarter of its steps (the
    InfoBatch line: 15 kB in 38 steps, 7 batches an epoch, E = 6 planned epochs as printed)."""
    assert any(a.startswith("trainer.max_steps=") for a in argv), f"a guide's training line states its steps: {argv}"
    if any(a.startswith("sampler=") for a in argv):
        return [_quarter(a) if a.startswith(("data.max_bytes=", "trainer.max_steps=")) else a for a in argv]
    return [a for a in argv if not a.startswith("trainer.max_steps=")]


def _quarter(arg: str) -> str:
    key, value = arg.split("=", 1)
    return f"{key}={int(value) // 4}"


def _run_section(section: str, hub, tmp_path, small: bool, one_folder: bool = False
                 ) -> tuple[list[str], list[tuple[str, dict | str]]]:
    """Every block of `section` in order (`support.guides`; small: a `framework.train` line at its recipe's smoke
    size and steps, `_smoke_steps`), each line in a folder of its own or, `one_folder`, all in one (a line reads what
    the one before wrote). Returns the python blocks' stdout and (line, its results.json or its stdout) per command
    line; as printed, each line's wall time is printed."""
    env = guides.reader_env(hub, hub.home, small, **({"FRAMEWORK_SMOKE": "1"} if small else {}))
    printed, ran = [], []
    for i, (lang, code) in enumerate(guides.blocks(section)):
        cwd = tmp_path / f"block{i}"
        cwd.mkdir()
        if lang == "python":
            started = time.perf_counter()
            proc = guides.run_python(code, cwd, env, small)
            print(f"{time.perf_counter() - started:6.1f} s  python block {i}")  # noqa: T201 - each block's wall time
            assert proc.returncode == 0, f"{code}\n{proc.stderr[-3000:]}"
            printed.append(proc.stdout.strip())
            continue
        for j, line in enumerate(code.strip().splitlines()):
            argv = shlex.split(line)
            where = cwd if one_folder else cwd / str(j)
            where.mkdir(exist_ok=True)
            before, started = guides.outputs(where), time.perf_counter()
            train = argv[1:3] == ["-m", "framework.train"]
            proc = guides.run_line([*argv[:3], *_smoke_steps(argv[3:])] if small and train else argv, where, env,
                                   small)
            print(f"{time.perf_counter() - started:6.1f} s  {line[:150]}")  # noqa: T201 - each line's wall time
            assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
            if not train:
                ran.append((line, proc.stdout))
                continue
            results = guides.new_results(where, before)
            if "hub.repo_id=" in line:
                repo = line.split("hub.repo_id=")[1].split()[0]
                assert results["hub"]["repo_id"] == repo
                files = set(hub.api.list_repo_files(repo))
                assert {"config.json", "model.safetensors", "framework.json", "README.md"} <= files, files
            ran.append((line, results))
    return printed, ran


def _steps(line: str) -> int:
    return int(re.search(r"trainer.max_steps=(\d+)", line).group(1))


@pytest.mark.parametrize("small", SIZES)
def test_your_own_model_guide_runs_as_printed(guide_hub, tmp_path, small):
    """Each line trains (as printed: its stated steps, and it learned) and pushes its repo (SmolLM2-135M's stand-in by
    its id, with its tokenizer); the InfoBatch line keeps
    every row in epoch 0, drops low-loss rows in epochs 1 to 4, anneals to full data after, and reports what it
    pruned; transformers' own generate() decodes bytes; GICDM scores the model's features."""
    import csv

    assert [lang for lang, _ in guides.blocks(SECTION)] == ["bash", "bash", "python", "bash", "python"]
    serve_base(guide_hub.api)
    printed, ran = _run_section(SECTION, guide_hub, tmp_path, small)
    for line, results in ran:
        assert results["status"] == "finished", line
        if "sampler=infobatch" in line:  # it runs long enough to prune, and says how much it pruned
            metrics = results["metrics"]
            assert metrics["selection/samples_seen"] > 0 and metrics["selection/pruned"] > 0, metrics
            with open(next(Path(results["run_dir"]).glob("csv/metrics.csv"))) as f:
                epochs = {int(r["epoch"]): float(r["selection/epoch_fraction"]) for r in csv.DictReader(f)
                          if r.get("selection/epoch_fraction")}
            assert epochs[0] == 1.0 and all(epochs[e] < 1.0 for e in range(1, 5)), epochs  # E = 6: ⌊0.875·6⌋ = 5
            assert all(epochs[e] == 1.0 for e in range(5, max(epochs))), epochs  # the last one: cut by max_steps
        if small:
            continue
        assert results["global_step"] == _steps(line) and results["choices"]["size"] != "smoke", line
        for key, before in results["initial_metrics"].items():  # it learned: each validation figure went down
            assert results["metrics"][key.removesuffix("_init")] < before, (line, key, results["metrics"])
    (line, smollm2), (olion_line, olion) = ran[0], ran[2]
    assert f"model.name_or_path={BASE_MODEL}" in line and smollm2["choices"]["optimizer"] == "olion"
    assert "tokenizer.json" in guide_hub.api.list_repo_files("your-name/smollm2-olion")  # its tokenizer travels
    assert "optimizer=olion" in olion_line and olion["choices"]["optimizer"] == "olion"
    tokens = json.loads(printed[0].replace("(", "[").replace(")", "]"))
    assert len(tokens) == 8 and all(0 <= t < 256 for t in tokens)  # greedy bytes from transformers' own generate
    scores = eval(printed[1], {})  # noqa: S307 - the block's own printed dict of floats
    assert set(scores) >= {"precision", "recall", "density", "coverage"}
    assert all(0.0 <= scores[k] <= 1.0 for k in ("precision", "recall", "coverage"))


@pytest.mark.parametrize("small", SIZES)
def test_the_kv_cache_guide_runs_as_printed(guide_hub, tmp_path, small):
    """SmolLM2-Instruct (its stand-in) is probed on Capybara's conversations as prompts and answers, the model
    pushed unchanged with its allocation, and answers a chat question with half its KV heads compressed; the
    pointer-chasing Llama (as printed: it learned the task in its 2,000 steps, and is pushed with the task's special
    ids) is probed, its allocation travels with it in both layouts, and the CLI and transformers' generate() decode
    the same tokens at s = 0.5 with the same bytes held, fewer than the full cache's."""
    from framework.data.pointer_chase import BOS, EOS, PAD

    assert [lang for lang, _ in guides.blocks(SERVING)] == ["bash", "bash", "python"]
    serve_chat(guide_hub.api)
    printed, ran = _run_section(SERVING, guide_hub, tmp_path, small)
    (chat_line, chat), (_, answered) = ran[0], ran[1]
    assert f"data.source={CHAT_DATA}" in chat_line and f"model.name_or_path={CHAT_MODEL}" in chat_line
    prompts = chat["data"]["prompts"]
    assert prompts["train"]["rows"] > 0 and prompts["val"]["rows"] > 0, prompts
    assert chat["choices"]["module"] == "duo_attention" and chat["global_step"] > 0
    repo = chat["hub"]["repo_id"]
    assert {"head_allocation.json", "attn_pattern/full_attention_heads.tsv", "tokenizer.json"} <= set(
        guide_hub.api.list_repo_files(repo))
    _same_weights(guide_hub, CHAT_MODEL, repo)  # only the gates trained: the model pushed as it was
    held, full = _held_and_full(answered)
    assert held < full and json.loads(re.search(r"tokens: (\[.*\])", answered).group(1))
    (line, base), (probe_line, probe) = ran[2], ran[3]
    if not small:
        assert base["global_step"] == _steps(line) == 2000 and probe["global_step"] == _steps(probe_line)
        assert base["metrics"]["val/loss"] < 0.1 * base["initial_metrics"]["val/loss_init"], base["metrics"]
    config = json.loads(Path(guide_hub.api.hf_hub_download("your-name/chase-llama", "config.json")).read_text())
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (PAD, BOS, EOS), config
    files = set(guide_hub.api.list_repo_files("your-name/chase-llama-rlkv"))
    assert {"head_allocation.json", "attn_pattern/full_attention_heads.tsv", "attn_pattern/config.json"} <= files
    held, full = _held_and_full(ran[4][1])
    assert held < full
    cli_tokens = json.loads(re.search(r"tokens: (\[.*\])", ran[4][1]).group(1))
    tokens, nbytes = printed[0].rsplit(" ", 1)
    assert json.loads(tokens) == cli_tokens and int(nbytes) == held


def _held_and_full(out: str) -> tuple[int, int]:
    """The KV bytes `kv_generate` printed as held and as the full cache's."""
    found = re.search(r"kv cache: ([\d,]+) bytes held for \d+ positions, the full cache ([\d,]+)", out)
    assert found, out
    held, full = found.groups()
    return int(held.replace(",", "")), int(full.replace(",", ""))


def _same_weights(hub, a: str, b: str) -> None:
    from safetensors.torch import load_file

    one, two = (load_file(hub.api.hf_hub_download(repo, "model.safetensors")) for repo in (a, b))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize("small", SIZES)
def test_the_grow_your_own_moe_guide_runs_as_printed(guide_hub, tmp_path, small):
    """Granite's MoE (its stand-in) grown by name and pushed in transformers' layout, with its growth record;
    transformers opens it with twice the layers, experts and experts per token, and (`--zero-init`) the grown model
    computes the source's logits up to the expert copies' noise: the block prints so."""
    from transformers import AutoConfig

    assert [lang for lang, _ in guides.blocks(GROW)] == ["bash", "python"]
    serve_moe(guide_hub.api)
    printed, ran = _run_section(GROW, guide_hub, tmp_path, small, one_folder=True)
    files = set(guide_hub.api.list_repo_files("your-name/granite-grown"))
    assert {"config.json", "model.safetensors", "framework.json", "growth.json", "tokenizer.json"} <= files, files
    assert "written to granite-grown" in ran[0][1]  # the grow line, as printed
    source = AutoConfig.from_pretrained(MOE_MODEL)
    layers, experts, per_token = (int(n) for n in printed[0].splitlines()[0].split())
    assert (layers, experts, per_token) == (2 * source.num_hidden_layers, 2 * source.num_local_experts,
                                            2 * source.num_experts_per_tok)
    change = float(re.search(r"largest logit change: (\S+) of the largest logit", printed[0]).group(1))
    # the same function up to the expert copies' noise (α = 0.01 by default)
    assert 0 < change < 1e-2, printed[0]
    assert printed[0].splitlines()[-1] == "same greedy tokens: True", printed[0]
