"""`recipe=sft` with `peft=lora` through the CLI, as a user runs it: its default chat model and chat data by Hub id
(tiny stand-ins served under SmolLM2's and Capybara's ids by the local Hub), the adapter pushed in PEFT's format and
opened by PEFT with the run's logits (make test: in this process; make test-slow: in a fresh one), then `init_from=`
the pushed adapter continues it and `peft.merge=true` pushes a model that transformers opens alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from support.stand_ins import CHAT_MODEL as BASE
from support.stand_ins import serve_chat

pytest.importorskip("peft")

IDS = [[5, 17, 40, 3, 99, 12, 7, 64, 21, 2]]


@pytest.fixture(scope="module")
def served(hub, tmp_path_factory):
    """recipe=sft's default model and data as tiny stand-ins on the local Hub, and the env a CLI needs to reach them."""
    commits = serve_chat(hub.api)
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


def sft_lora_run(cli, served, run, repo: str) -> dict:
    """`recipe=sft optimizer=olion peft=lora` pushed to `repo`; checks the run's record and the pushed files, returns
    results.json."""
    proc = cli("recipe=sft", "optimizer=olion", "peft=lora", "peft.r=4", "data.batch_size=2", "trainer.max_steps=3",
               f"hub.repo_id={repo}", f"hydra.run.dir={run}", env=served["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert "data.seq_len=128: the model's context length (128)" in log  # recipe=sft: the model's, no silent 128
    results = json.loads((run / "results.json").read_text())
    params = results["parameters"]
    assert 0 < params["trainable"] < params["total"]
    assert f"peft: trainable {params['trainable']:,} of {params['total']:,} parameters" in log
    assert results["numerics"]["ns_dtype"] in ("float32", "bfloat16") and results["numerics"]["ns_dtype_from"]
    assert results["choices"]["optimizer"] == "olion" and results["choices"]["peft"] == "lora"
    from omegaconf import OmegaConf

    assert OmegaConf.load(run / ".hydra" / "config.yaml").optimizer.lr == 2e-4  # the recipe's lr for olion+lora
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi(endpoint=served["env"]["HF_ENDPOINT"], token="dummy")
    files = {f.rfilename for f in api.model_info(repo).siblings}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= files
    assert "model.safetensors" not in files
    adapter = json.loads(open(hf_hub_download(repo, "adapter_config.json")).read())
    assert adapter["base_model_name_or_path"] == BASE and adapter["revision"] == served["commit"]
    assert adapter["r"] == 4 and adapter["task_type"] == "CAUSAL_LM"
    return results


def test_sft_with_lora_pushes_an_adapter_peft_opens_with_the_runs_logits(served, hub, cli, tmp_path):
    sft_lora_run(cli, served, tmp_path / "run", "local-user/sft-lora")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BASE)
    with torch.no_grad():
        before = base(torch.tensor(IDS)).logits
        theirs = PeftModel.from_pretrained(base, "local-user/sft-lora").eval()(torch.tensor(IDS)).logits
    ours = run_logits(tmp_path / "run")
    torch.testing.assert_close(theirs.float(), ours, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(before, ours, atol=1e-4)  # the adapter changed something


@pytest.mark.slow  # two CLI runs and two fresh processes (~40 s); make test opens the adapter in process, above
def test_the_round_trip_in_fresh_processes_init_from_the_adapter_and_a_merged_push(served, hub, cli, tmp_path):
    run = tmp_path / "run"
    first = sft_lora_run(cli, served, run, "local-user/sft-lora-2")
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
