"""`recipe=sft` with `peft=lora` through the CLI, as a user runs it: its default chat model and chat data by Hub id
(tiny stand-ins served under SmolLM2's and Capybara's ids by the local Hub), the adapter pushed in PEFT's format and
opened by PEFT with the run's logits (make test: in this process; make test-slow: in a fresh one), then `init_from=`
the pushed adapter continues it and `peft.merge=true` pushes a model that transformers opens alone."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import guide, run_cli
from support.stand_ins import CHAT_MODEL as BASE
from support.stand_ins import serve_chat

pytest.importorskip("peft")

IDS = [[5, 17, 40, 3, 99, 12, 7, 64, 21, 2]]


@pytest.fixture(scope="module")
def served(hub, tmp_path_factory):
    """recipe=sft's default model and data as tiny stand-ins on the local Hub, and the env a CLI needs to reach them."""
    commits = serve_chat(hub.api, max_positions=128)  # a context recipe=sft's seq_len takes (its log says so)
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(tmp_path_factory.mktemp("hf_home"))}
    return {"env": env, "commit": commits[BASE]}


def fresh(code: str, env: dict) -> dict:
    """Run `code` in a fresh Python against the local Hub; it prints one JSON line."""
    import os

    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_logits(run_dir) -> torch.Tensor:
    """The logits of IDS from the run dir's checkpoint, as the framework loads it (adapters merged)."""
    from framework.hub.load import registered_model
    from framework.rundir import RunDir

    model = RunDir(run_dir).load(registered_model).eval()
    with torch.no_grad():
        return model(torch.tensor(IDS)).float()


def check_sft_lora_run(run, repo: str, served: dict, steps: int) -> dict:
    """The record of a `recipe=sft optimizer=olion peft=lora` run pushed to `repo` and the files it pushed; returns
    results.json."""
    log = (run / "train.log").read_text()
    assert "data.seq_len=128: the model's context length (128)" in log  # recipe=sft: the model's, no silent 128
    results = json.loads((run / "results.json").read_text())
    params = results["parameters"]
    assert 0 < params["trainable"] < params["total"] and results["global_step"] == steps
    assert f"peft: trainable {params['trainable']:,} of {params['total']:,} parameters" in log
    assert results["numerics"]["ns_dtype"] in ("float32", "bfloat16") and results["numerics"]["ns_dtype_from"]
    assert results["choices"]["optimizer"] == "olion" and results["choices"]["peft"] == "lora"
    from omegaconf import OmegaConf

    assert OmegaConf.load(run / ".hydra" / "config.yaml").optimizer.lr == 6e-4  # the recipe's lr for olion+lora
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi(endpoint=served["env"]["HF_ENDPOINT"], token="dummy")
    files = {f.rfilename for f in api.model_info(repo).siblings}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= files
    assert "model.safetensors" not in files
    adapter = json.loads(open(hf_hub_download(repo, "adapter_config.json")).read())
    assert adapter["base_model_name_or_path"] == BASE and adapter["revision"] == served["commit"]
    assert adapter["task_type"] == "CAUSAL_LM"
    return results


def readme_blocks() -> tuple[list[str], str]:
    """docs/guides/fine_tune_chat.md: its bash lines and its python block."""
    text = guide("fine_tune_chat")
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)
    bash = [line for kind, code in blocks if kind == "bash" for line in code.splitlines() if line.strip()]
    (python,) = [code for kind, code in blocks if kind == "python"]
    return bash, python


@pytest.mark.long
def test_the_readme_fine_tune_lines_run_as_printed_and_peft_opens_the_runs_adapter(served, hub, tmp_path):
    """The README's command as printed (FRAMEWORK_SMOKE=1: the recipe's smoke size, as the README's other lines are
    run), then its Python block, whose PEFT model gives the run's logits."""
    (line,), python = readme_blocks()
    argv = shlex.split(line)
    assert argv[:3] == ["python", "-m", "framework.train"]
    repo = next(a.split("=", 1)[1] for a in argv if a.startswith("hub.repo_id="))
    proc = run_cli(*argv[3:], env={**served["env"], "FRAMEWORK_SMOKE": "1"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "outputs" / "train").iterdir()
    check_sft_lora_run(run, repo, served, steps=4)
    # the Hub was asked (model, data, push) but the console and the log carry no line per HTTP request
    assert "HTTP Request" not in proc.stdout + proc.stderr + (run / "train.log").read_text()
    scope: dict = {}
    exec(compile(python, "README.md", "exec"), scope)  # noqa: S102 - the README's block, as a reader runs it
    with torch.no_grad():
        theirs = scope["model"].eval()(torch.tensor(IDS)).logits
    ours = run_logits(run)
    torch.testing.assert_close(theirs.float(), ours, rtol=1e-4, atol=1e-5)
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(BASE)(torch.tensor(IDS)).logits
    assert not torch.allclose(before, ours, atol=1e-4)  # the adapter changed something


@pytest.mark.slow  # two CLI runs, two fresh processes (~25 s); make test runs the README's line and opens it, above
def test_the_round_trip_in_fresh_processes_init_from_the_adapter_and_a_merged_push(served, hub, cli, tmp_path):
    run = tmp_path / "run"
    proc = cli("recipe=sft", "optimizer=olion", "peft=lora", "peft.r=4", "data.batch_size=2", "trainer.max_steps=3",
               "hub.repo_id=local-user/sft-lora-2", f"hydra.run.dir={run}", env=served["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = check_sft_lora_run(run, "local-user/sft-lora-2", served, steps=3)
    theirs = fresh(f"""
        import json, torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained({BASE!r})
        model = PeftModel.from_pretrained(base, "local-user/sft-lora-2").eval()
        with torch.no_grad():
            print(json.dumps(model(torch.tensor({IDS})).logits.float().tolist()))
    """, served["env"])
    torch.testing.assert_close(torch.tensor(theirs), run_logits(run), rtol=1e-4, atol=1e-5)

    more = tmp_path / "more"  # continue the pushed adapter (its own r), pushing the merged model this time
    proc = cli("recipe=sft", "optimizer=adamw", "init_from=local-user/sft-lora-2", "peft=lora", "peft.merge=true",
               "data.batch_size=2", "trainer.max_steps=2", "validate_before_fit=false",
               "hub.repo_id=local-user/sft-merged", f"hydra.run.dir={more}", env=served["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (more / "train.log").read_text()
    assert "peft: continuing the adapter local-user/sft-lora-2 with its own values (r=4" in log
    spec = json.loads((more / "model_config.json").read_text())
    assert spec["peft"]["r"] == 4 and spec["peft"]["merge"] is True
    assert json.loads((more / "results.json").read_text())["parameters"] == first["parameters"]  # the same adapters
    files = {f.rfilename for f in hub.api.model_info("local-user/sft-merged").siblings}
    assert "model.safetensors" in files and "adapter_config.json" not in files
    merged = fresh(f"""
        import json, torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("local-user/sft-merged").eval()
        with torch.no_grad():
            print(json.dumps(model(torch.tensor({IDS})).logits.tolist()))
    """, served["env"])
    torch.testing.assert_close(torch.tensor(merged), run_logits(more), rtol=1e-4, atol=1e-5)
