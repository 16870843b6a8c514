"""The head allocation as an artefact: saved with a run, pushed to and loaded from a (local) Hub, applied elsewhere."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import HfApi

from framework.models.transformer import TransformerLM
from framework.probes.allocation import HeadAllocation, main
from framework.serving.decoding import decode


def allocation() -> HeadAllocation:
    gates = torch.tensor([[0.0, 0.9, 0.1, 0.4], [0.95, 0.0, 0.3, 0.7]])
    return HeadAllocation.from_gates(gates, sink=1, recent=4, sparsity=0.5, method="rlkv",
                                     metrics={"val/acc_s0.5": 0.99})


def test_save_and_load_round_trip_json_and_tsv(tmp_path):
    alloc = allocation()
    alloc.save(tmp_path)
    back = HeadAllocation.load(tmp_path)
    assert back == alloc
    assert torch.equal(back.full_heads(), torch.tensor([[False, True, False, True], [True, False, False, True]]))
    assert back.full_heads(0.75).sum() == 2 and back.window == (1, 4)
    tsv = (tmp_path / "gates.tsv").read_text().splitlines()
    assert tsv[0] == "layer\thead\tgate" and tsv[5] == "1\t0\t0.950000" and len(tsv) == 9


def test_a_corrupt_or_foreign_file_is_refused_with_what_is_wrong(tmp_path):
    path = tmp_path / "head_allocation.json"
    path.write_text(json.dumps({"format_version": 1, "gates": [[1.0], [1.0, 0.5]], "sink": 1, "recent": 4}))
    with pytest.raises(ValueError, match="row lengths"):
        HeadAllocation.load(path)
    foreign = {"format_version": 1, "gates": [[1.0]], "sink": 1, "recent": 4, "_target_": "os.system"}
    path.write_text(json.dumps(foreign))
    with pytest.raises(ValueError, match="unknown keys"):
        HeadAllocation.load(path)
    with pytest.raises(FileNotFoundError, match="head_allocation.json"):
        HeadAllocation.load(tmp_path / "nothing")


def test_check_model_accepts_the_same_shape_and_refuses_another():
    allocation().check_model(TransformerLM(vocab_size=10, dim=32, depth=2, heads=4))
    with pytest.raises(ValueError, match=r"\(2, 4\), the model has \(2, 2\)"):
        allocation().check_model(TransformerLM(vocab_size=10, dim=32, depth=2, heads=4, kv_heads=2))


def test_push_then_from_pretrained_gives_the_same_allocation_and_the_same_decoding(hub, tmp_path):
    alloc = allocation()
    commit = alloc.push_to_hub("local-user/chase-rlkv")
    files = set(hub.api.list_repo_files("local-user/chase-rlkv"))
    assert {"head_allocation.json", "gates.tsv", "README.md"} <= files
    assert not any(f.endswith((".pt", ".pkl", ".bin")) for f in files)
    back = HeadAllocation.from_pretrained("local-user/chase-rlkv", revision=commit)
    assert back == alloc
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=10, dim=32, depth=2, heads=4, max_seq_len=40).eval()
    prompt = torch.randint(0, 10, (4, 12))
    here = decode(model, prompt, 8, full_heads=alloc.full_heads(), window=alloc.window)
    there = decode(model, prompt, 8, full_heads=back.full_heads(), window=back.window)
    assert torch.equal(here, there)


def test_pushing_next_to_a_model_keeps_its_files_and_card(hub):
    hub.api.create_repo("local-user/with-model")
    hub.api.upload_file(path_or_fileobj=b"# my model card\n", path_in_repo="README.md", repo_id="local-user/with-model")
    allocation().push_to_hub("local-user/with-model")
    files = set(hub.api.list_repo_files("local-user/with-model"))
    assert {"README.md", "head_allocation.json", "gates.tsv"} <= files
    card = (HfApi().hf_hub_download("local-user/with-model", "README.md"))
    assert open(card).read() == "# my model card\n"


def test_cli_pushes_a_run_dir_and_shows_it_back(hub, tmp_path, capsys):
    allocation().save(tmp_path / "run")
    assert main(["push", str(tmp_path / "run"), "local-user/cli-alloc"]) == 0
    assert main(["show", "local-user/cli-alloc"]) == 0
    out = capsys.readouterr().out
    assert "pushed head_allocation.json to local-user/cli-alloc" in out and "rlkv: sink=1 recent=4" in out
    assert main(["show", str(tmp_path / "missing")]) == 2
