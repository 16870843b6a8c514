"""`python -m framework.hub pull` on a transformers model: its summary line ends in the shape its config.json gives
(it printed `hf_causal_lm (HFCausalLM, N parameters): ` and stopped at the colon)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from support.tiny_chat import tiny_llama  # noqa: E402

from framework.hub.cli import main  # noqa: E402


def test_pull_of_a_transformers_model_prints_a_complete_summary(hub, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    folder = tiny_llama(tmp_path / "llama")
    hub.api.create_repo("local-user/tiny-llama", exist_ok=True)
    hub.api.upload_folder(folder_path=str(folder), repo_id="local-user/tiny-llama")
    assert main(["pull", "local-user/tiny-llama"]) == 0
    where, summary = capsys.readouterr().out.strip().splitlines()[-2:]
    assert where.startswith("downloaded local-user/tiny-llama@")
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())
    assert summary == (f"hf_causal_lm (HFCausalLM, {params:,} parameters): model_type=llama, vocab_size=14, "
                       "hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2")
