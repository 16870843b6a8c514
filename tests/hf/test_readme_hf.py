"""The Hugging Face guides (docs/guides/your_model.md, kv_cache.md, grow_moe.md; the README's sections before), run in
order against the local Hub: every command line and every Python block (in a fresh process, as a reader would). All
in `make test-slow`: each guide exactly as printed, in fresh processes, its steps and sizes its own, checking what
the guide says of it (each line's wall time printed: `pytest -s`); `make test` covers their lines' paths in process
(tests/hf/: the families, the probes, the mixed cache and growth on transformers models)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import guide
from support import warm_cli

pytest.importorskip("transformers")

SECTION, SERVING, GROW = "your_model", "kv_cache", "grow_moe"  # docs/guides/NAME.md


def _blocks(section: str) -> list[tuple[str, str]]:
    body = guide(section)
    return re.findall(r"^```(\w*)\n(.*?)^```", body, flags=re.M | re.S)


def _smoke_steps(argv: list[str]) -> list[str]:
    """A README training line at smoke length: its stated `trainer.max_steps` (which FRAMEWORK_SMOKE would keep, as it
    keeps every key a command sets) left out, so smoke's steps apply; a data-selection line (`sampler=`) keeps its
    own, since which epochs it prunes in is its length."""
    assert any(a.startswith("trainer.max_steps=") for a in argv), f"a README training line states its steps: {argv}"
    if any(a.startswith("sampler=") for a in argv):
        return argv
    return [a for a in argv if not a.startswith("trainer.max_steps=")]


def _run_section(section: str, hub, tmp_path, one_folder: bool = False, as_printed: bool = False
                 ) -> tuple[list[str], list[tuple[str, dict | str]]]:
    """Every block of `section` in order: python blocks in a fresh process, `python -m MODULE` lines (a
    `framework.train` line at its recipe's smoke size and steps, `_smoke_steps`; `as_printed`: verbatim, each in a
    fresh `python -m` process with the shell's environment, its wall time printed), each line in a folder of its own
    or, `one_folder`, all of a block in one (a line reads what the one before wrote). Returns the python blocks'
    stdout and (line, its results.json or its stdout) per command line."""
    # one HF_HOME for the module's sections, as one user's machine has: their runs share one warm server
    hf = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(hub.root / "hf_home")}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FRAMEWORK_SMOKE": "1", **hf}
    if as_printed:  # a reader's shell: no smoke size, torch's own thread count
        env = {**{k: v for k, v in os.environ.items() if k not in ("FRAMEWORK_SMOKE", "OMP_NUM_THREADS")}, **hf}
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
            started = time.perf_counter()
            if as_printed:
                proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=where, env=env,
                                      timeout=1200)
                print(f"{time.perf_counter() - started:6.1f} s  {line}")  # noqa: T201 - the wall time asked for
            else:
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


def _steps(line: str) -> int:
    return int(re.search(r"trainer.max_steps=(\d+)", line).group(1))


@pytest.mark.slow  # make test-slow: every line as printed (the model here, not a smoke one)
@pytest.mark.timeout(1800)  # minutes on 2 quiet cores, more on busy ones
def test_the_section_runs_exactly_as_printed(hub, tmp_path):
    """Each line trains its stated steps and pushes its repo; the InfoBatch line keeps every row in epoch 0, drops
    low-loss rows in epochs 1 to 4, anneals to full data after, and reports what it pruned; transformers' own
    generate() decodes bytes; GICDM scores the model's features."""
    import csv

    assert [lang for lang, _ in _blocks(SECTION)] == ["bash", "python", "bash", "python"]
    printed, ran = _run_section(SECTION, hub, tmp_path, as_printed=True)
    for line, results in ran:
        assert results["global_step"] == _steps(line) and results["status"] == "finished", line
        assert results["choices"]["size"] != "smoke", line
        for key, before in results["initial_metrics"].items():  # it learned: each validation figure went down
            assert results["metrics"][key.removesuffix("_init")] < before, (line, key, results["metrics"])
        if "sampler=infobatch" in line:  # it runs long enough to prune, and says how much it pruned
            metrics = results["metrics"]
            assert metrics["selection/samples_seen"] > 0 and metrics["selection/pruned"] > 0, metrics
            with open(next(Path(results["run_dir"]).glob("csv/metrics.csv"))) as f:
                epochs = {int(r["epoch"]): float(r["selection/epoch_fraction"]) for r in csv.DictReader(f)
                          if r.get("selection/epoch_fraction")}
            assert epochs[0] == 1.0 and all(epochs[e] < 1.0 for e in range(1, 5)), epochs  # E = 6: ⌊0.875·6⌋ = 5
            assert all(epochs[e] == 1.0 for e in range(5, max(epochs))), epochs  # the last one: cut by max_steps
    assert "optimizer=olion" in ran[1][0] and ran[1][1]["choices"]["optimizer"] == "olion"
    tokens = json.loads(printed[0].replace("(", "[").replace(")", "]"))
    assert len(tokens) == 8 and all(0 <= t < 256 for t in tokens)  # greedy bytes from transformers' own generate
    scores = eval(printed[1], {})  # noqa: S307 - the block's own printed dict of floats
    assert set(scores) >= {"precision", "recall", "density", "coverage"}
    assert all(0.0 <= scores[k] <= 1.0 for k in ("precision", "recall", "coverage"))


@pytest.mark.slow  # make test-slow: every line as printed (2,000 steps of pointer chasing)
@pytest.mark.timeout(1800)  # minutes on 2 quiet cores, more on busy ones
def test_the_serving_section_runs_exactly_as_printed(hub, tmp_path):
    """The Llama learns the task in its 2,000 steps and is pushed with the task's special ids (EOS 3, not Llama's 2,
    the task's SEP); the probe's allocation travels with it; the CLI and transformers' generate() decode the same
    tokens at s = 0.5 with the same bytes held, fewer than the full cache's."""
    from framework.data.pointer_chase import BOS, EOS, PAD

    printed, ran = _run_section(SERVING, hub, tmp_path, as_printed=True)
    (line, base), (probe_line, probe) = ran[0], ran[1]
    assert base["global_step"] == _steps(line) == 2000 and probe["global_step"] == _steps(probe_line)
    assert base["metrics"]["val/loss"] < 0.1 * base["initial_metrics"]["val/loss_init"], base["metrics"]  # learned
    config = json.loads(Path(hub.api.hf_hub_download("your-name/chase-llama", "config.json")).read_text())
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (PAD, BOS, EOS), config
    _check_serving(hub, printed, ran)


# make test-slow (~22 s): make test checks the allocation files and the mixed cache in tests/probes/test_allocation.py,
# test_pattern_files.py and the generate CLI in tests/test_generate.py
@pytest.mark.slow
def test_the_serving_section_runs_as_printed(hub, tmp_path):
    """The probe's allocation travels with the model, in both layouts; the CLI and transformers' generate() decode
    with it, and hold fewer bytes than the full cache."""
    assert [lang for lang, _ in _blocks(SERVING)] == ["bash", "python"]
    printed, ran = _run_section(SERVING, hub, tmp_path)
    _check_serving(hub, printed, ran)


def _check_serving(hub, printed: list[str], ran: list) -> None:
    files = set(hub.api.list_repo_files("your-name/chase-llama-rlkv"))
    assert {"head_allocation.json", "attn_pattern/full_attention_heads.tsv", "attn_pattern/config.json"} <= files
    line, out = ran[-1]
    held, full = re.search(r"kv cache: ([\d,]+) bytes held for \d+ positions, the full cache ([\d,]+)", out).groups()
    assert int(held.replace(",", "")) < int(full.replace(",", ""))
    cli_tokens = json.loads(re.search(r"tokens: (\[.*\])", out).group(1))
    tokens, nbytes = printed[0].rsplit(" ", 1)
    assert json.loads(tokens) == cli_tokens and int(nbytes) == int(held.replace(",", ""))


@pytest.mark.slow  # make test-slow: every line as printed
@pytest.mark.timeout(1800)  # minutes on 2 quiet cores, more on busy ones
def test_the_grow_your_own_moe_section_runs_exactly_as_printed(hub, tmp_path):
    """An OLMoE trained its stated steps, pushed by name, grown by name and pushed in transformers' layout;
    transformers opens it with twice the layers, experts and experts per token, and (`--zero-init`) the grown model
    computes the trained one's logits, up to the expert copies' noise; the growth record travels with it."""
    from transformers import AutoModelForCausalLM

    assert [lang for lang, _ in _blocks(GROW)] == ["bash", "python"]
    printed, ran = _run_section(GROW, hub, tmp_path, one_folder=True, as_printed=True)
    assert ran[0][1]["global_step"] == _steps(ran[0][0])
    assert printed == ["4 8 2"]
    files = set(hub.api.list_repo_files("your-name/tiny-olmoe-grown"))
    assert {"config.json", "model.safetensors", "framework.json", "growth.json"} <= files, files
    assert "written to grown-olmoe" in ran[1][1]  # the grow line, as printed
    ids = torch.tensor([list(b"def main():\n    return 0")])
    with torch.no_grad():
        trained, grown = (AutoModelForCausalLM.from_pretrained(f"your-name/{name}").eval()(ids).logits
                          for name in ("tiny-olmoe", "tiny-olmoe-grown"))
    # the same function up to the expert copies' noise (α = 0.01 by default: 0.0018 of the logits' scale measured;
    # `--alpha 0`: 4e-7 of it, measured)
    assert torch.allclose(grown, trained, atol=1e-2 * float(trained.abs().max())), (grown - trained).abs().max()
