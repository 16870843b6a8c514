"""`recipe=sft` with `peft=lora` through the CLI, as a user runs it: a chat model by Hub id (a tiny stand-in served
under SmolLM2's id by the local Hub), a chat file, the adapter pushed in PEFT's format and opened by PEFT in a fresh
process with the run's logits; `init_from=` the adapter continues it and `peft.merge=true` pushes a model that
transformers opens alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from support.tiny_chat import CHATML, CONVERSATION, tiny_chat_model, tiny_tokenizer, write_jsonl

pytest.importorskip("peft")

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
IDS = [[5, 17, 40, 3, 99, 12, 7, 64, 21, 2]]


@pytest.fixture(scope="module")
def served(hub, tmp_path_factory):
    """The tiny chat model under BASE on the local Hub, a chat file, and the env a CLI needs to reach them."""
    folder = tmp_path_factory.mktemp("base")
    tiny_chat_model(folder / "model", tiny_tokenizer(CHATML, eos="<|im_end|>"), max_positions=128)
    hub.api.create_repo(BASE, exist_ok=True)
    commit = hub.api.upload_folder(repo_id=BASE, folder_path=str(folder / "model")).oid
    rows = [{"messages": CONVERSATION[:3] if i % 2 else CONVERSATION} for i in range(40)]
    chat = write_jsonl(folder / "chat.jsonl", rows)
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(folder / "hf_home")}
    return {"chat": chat, "env": env, "commit": commit}


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


def test_sft_with_lora_pushes_an_adapter_peft_opens_with_the_runs_logits(served, hub, cli, tmp_path):
    run = tmp_path / "run"
    proc = cli("recipe=sft", "optimizer=olion", "peft=lora", "peft.r=4", f"model.name_or_path={BASE}",
               f"data.source={served['chat']}", "data.batch_size=2", "trainer.max_steps=3",
               "hub.repo_id=local-user/sft-lora", f"hydra.run.dir={run}", env=served["env"])
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
    files = {f.rfilename for f in hub.api.model_info("local-user/sft-lora").siblings}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= files
    assert "model.safetensors" not in files
    adapter = json.loads(open(hub.api.hf_hub_download("local-user/sft-lora", "adapter_config.json")).read())
    assert adapter["base_model_name_or_path"] == BASE and adapter["revision"] == served["commit"]
    assert adapter["r"] == 4 and adapter["task_type"] == "CAUSAL_LM"

    theirs = fresh(f"""
        import json, torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained({BASE!r})
        model = PeftModel.from_pretrained(base, "local-user/sft-lora").eval()
        with torch.no_grad():
            print(json.dumps(model(torch.tensor({IDS})).logits.float().tolist()))
    """, served["env"])
    ours = run_logits(run)
    torch.testing.assert_close(torch.tensor(theirs), ours, rtol=1e-4, atol=1e-5)
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(BASE)(torch.tensor(IDS)).logits
    assert not torch.allclose(base, ours, atol=1e-4)  # the adapter changed something


@pytest.mark.slow  # two CLI runs and a fresh process (~25 s); make test pushes and opens an adapter just above
def test_init_from_an_adapter_repo_trains_it_on_and_peft_merge_pushes_a_plain_model(served, hub, cli, tmp_path):
    from framework.models.hf import HFCausalLM
    from framework.models.peft_adapters import LoRA, attach, peft_model

    model = HFCausalLM(BASE)
    attach(model, LoRA(r=4, target_modules=["q_proj", "v_proj"]))
    peft_model(model).save_pretrained(str(tmp_path / "adapter"))
    hub.api.create_repo("local-user/sft-lora-start", exist_ok=True)
    hub.api.upload_folder(repo_id="local-user/sft-lora-start", folder_path=str(tmp_path / "adapter"))
    n_adapter = sum(p.numel() for p in model.parameters() if p.requires_grad)

    more = tmp_path / "more"
    proc = cli("recipe=sft", "optimizer=adamw", f"model.name_or_path={BASE}",
               "init_from=local-user/sft-lora-start", "peft=lora", "peft.merge=true", f"data.source={served['chat']}", "data.batch_size=2",
               "trainer.max_steps=2", "validate_before_fit=false", "hub.repo_id=local-user/sft-merged", f"hydra.run.dir={more}",
               env=served["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (more / "train.log").read_text()
    assert "peft: continuing the adapter local-user/sft-lora-start with its own values (r=4" in log
    spec = json.loads((more / "model_config.json").read_text())
    assert spec["peft"]["r"] == 4 and spec["peft"]["merge"] is True
    assert spec["peft"]["target_modules"] == ["q_proj", "v_proj"]
    results = json.loads((more / "results.json").read_text())
    assert results["parameters"]["trainable"] == n_adapter  # the same adapters, trained on
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
