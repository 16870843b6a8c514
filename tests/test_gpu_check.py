"""tools/gpu_check.py: its reduced CPU variant runs every check for real and reports one row per check (all of them in
`make test-slow`; the in-process checks in `make test`)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KINDS = {"recipes", "flagship", "newton_schulz", "kv_decode", "fsdp2", "draws", "hf", "images", "fine_tuning"}


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    """`python tools/gpu_check.py ARGS` as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "tools/gpu_check.py", *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=env)


def rows(table: str) -> list[dict[str, str]]:
    """The markdown table's rows as dicts keyed by its header."""
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")), strict=True)) for line in lines[1:]]


def finite_metrics(run_dir: Path) -> dict:
    """results.json of a run: trained steps and every metric finite."""
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] > 0
    assert results["metrics"] and all(math.isfinite(v) for v in results["metrics"].values())
    return results


@pytest.mark.slow
def test_the_reduced_cpu_check_runs_every_check_for_real(tmp_path):
    out = tmp_path / "check"
    proc = gpu_check("--device", "cpu", "--reduced", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "table.md").read_text()
    assert table.strip() in proc.stdout  # the same table printed and written
    got = rows(table)
    assert {row["check"].split("/")[0] for row in got} == KINDS
    assert all(row["ok"] == "yes" for row in got), table
    assert all(float(row["seconds"]) > 0 for row in got)
    recipes = [row["check"].split("/")[1] for row in got if row["check"].startswith("recipes/")]
    assert len(recipes) == 2
    for name in [*recipes, "fsdp2"]:
        results = finite_metrics(out / name)
        assert "trainer.precision=bf16-mixed" in results["command"]
    assert "distributed_backend=gloo" in (out / "fsdp2" / "train.log").read_text()
    summary = json.loads((out / "flagship" / "summary.json").read_text())
    assert summary["size"] == "gpu" and summary["smoke"]
    assert all(math.isfinite(x) for sweep in summary["sweeps"].values() for x in sweep["acc"] + sweep["tv"])
    ns = next(row for row in got if row["check"] == "newton_schulz")["result"]
    assert "float32 agree" in ns and "bfloat16 agree" in ns
    assert "| mixed s=0.5 |" in (out / "kv_decode.md").read_text()
    assert [row["check"] for row in got if row["check"].startswith("hf")] == ["hf", "hf/rlkv_probe_llama"]
    assert "val/acc_s0.5" in finite_metrics(out / "rlkv_probe_llama")["metrics"]  # its evaluation ran in bf16
    assert [row["check"] for row in got if row["check"].startswith("images")] == ["images", "images/timm_on_images"]
    assert "data=images" in finite_metrics(out / "timm_on_images")["command"]


def test_the_reduced_cpu_check_runs_its_in_process_checks_for_real_and_writes_the_table(tmp_path):
    """`make test`'s variant of the one above: the checks that run in gpu_check's own process (no flagship, recipe,
    fsdp2 or transformers recipe row: their commands run in tests/test_mask_agnostic_experiment.py,
    tests/test_fault_injection.py (every recipe in bf16-mixed), tests/test_strategies.py and the slow test above)."""
    out = tmp_path / "check"
    proc = gpu_check("--device", "cpu", "--reduced", "--checks", "newton_schulz", "kv_decode", "draws", "--out",
                     str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "table.md").read_text()
    assert table.strip() in proc.stdout  # the same table printed and written
    got = rows(table)
    assert [row["check"] for row in got] == ["newton_schulz", "kv_decode", "draws"]
    assert all(row["ok"] == "yes" and float(row["seconds"]) > 0 for row in got), got
    assert "| mixed s=0.5 |" in (out / "kv_decode.md").read_text()


def test_the_hf_check_runs_transformers_models_on_the_device_it_is_given(tmp_path):
    """`make test`'s share of the `hf` row (its recipe runs are in the slow test above): in process, on the CPU."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("gpu_check_tool", REPO / "tools" / "gpu_check.py")
    tool = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look their module up
    spec.loader.exec_module(tool)  # as tests/test_bench_runner.py loads its tool
    result = tool.check_hf(tool.Plan("cpu", True, tmp_path, 60.0, 1, cuda=False))
    assert "bytes = theory" in result and "Mixtral 2->4 layers, 4->16 experts" in result


def test_the_fine_tuning_check_compares_the_chunked_loss_and_refuses_qlora_on_a_cpu(tmp_path):
    """The `fine_tuning` row in process on the CPU: the chunked loss against the whole logits' under bf16 autocast,
    and `peft=qlora` refused by name (on a GPU the row trains QLoRA's adapters and runs the bench's quick size)."""
    pytest.importorskip("peft")
    spec = importlib.util.spec_from_file_location("gpu_check_tool", REPO / "tools" / "gpu_check.py")
    tool = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    result = tool.check_fine_tuning(tool.Plan("cpu", True, tmp_path, 60.0, 1, cuda=False))
    assert "chunked vs whole loss" in result
    assert "peft=qlora refused: peft=qlora loads the base model in 4 bits" in result


@pytest.mark.slow  # 41 s on 2 busy cores; make test reads images through timm in tests/data/test_images.py and
# tests/metrics/test_image_cli.py, and runs the tool's in-process checks above
def test_the_images_check_extracts_on_the_device_it_is_given(tmp_path):
    """`make test`'s share of the `images` row (its training run is in the slow test above): in process, on the CPU."""
    spec = importlib.util.spec_from_file_location("gpu_check_tool", REPO / "tools" / "gpu_check.py")
    tool = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    result = tool.check_images(tool.Plan("cpu", True, tmp_path, 60.0, 1, cuda=False))
    assert result.startswith("60 PNGs, 512-dim features on cpu: min cosine vs cpu 1.00000"), result
