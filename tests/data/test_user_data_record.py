"""The user's data in the run's record and on bad input (issue 44): results.json and the pushed model card name the
dataset, its fingerprint, format, tokens and packing efficiency; a resume on changed data, an empty source and a
required value left unset are one `error:` line, exit 2, with nothing written; masked diffusion with the
mask-agnostic loss trains a byte model on the user's text."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from huggingface_hub import hf_hub_download
from support.local_hub import LocalHub, patch_client

from framework.errors import PreflightError
from framework.hub import push_to_hub
from framework.preflight import preflight

TINY = ["data=text", "data.seq_len=32", "data.batch_size=4", "model.dim=32", "model.depth=1", "threads=1",
        "trainer.limit_val_batches=1", "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=1"]


def _corpus(folder: Path, n: int = 24) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"doc{i:02d}.txt").write_text(f"document {i}: the cat sat on the mat, the dog ran {i} times.\n")
    return folder


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and mtime (what "nothing written" compares)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_results_and_card_name_the_data_and_a_resume_on_changed_data_writes_nothing(tmp_path, cli):
    """One run of masked diffusion + the mask-agnostic loss on a .txt folder with our byte model (the [MASK] it
    appends, id 256, is the loss's too): its record, its pushed card, then a resume after a file changed."""
    folder, run_dir = _corpus(tmp_path / "corpus"), tmp_path / "run"
    args = ["recipe=mdlm_text", *TINY, f"data.source={folder}", "loss=mask_agnostic", f"hydra.run.dir={run_dir}"]
    proc = cli(*args, "trainer.max_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    data = results["data"]
    assert data["dataset"] == str(folder) and data["files"][:2] == ["doc00.txt", "doc01.txt"]
    assert data["format"] == "text"
    held = 2  # every 20th document of 24 (val_fraction 0.05): 0 and 20
    assert data["documents"] == 24 - held and data["tokens"] == sum(
        len(p.read_bytes()) for i, p in enumerate(sorted(folder.iterdir())) if i % 20)
    assert 0.9 < data["packing_efficiency"] <= 1 and data["packing_efficiency"] == round(
        data["tokens"] / (data["rows"] * 32), 4)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["TextData"]
    assert data["fingerprint"] == state["fingerprint"]
    cache = Path(os.environ["FRAMEWORK_DATA_CACHE"])  # the session's (tests/conftest.py), never ~/.cache
    assert (cache / "text" / data["fingerprint"] / "done").is_file() and cache.parent == tmp_path.parent
    assert torch.isfinite(torch.tensor(results["metrics"]["train/extra_loss"]))
    spec = json.loads((run_dir / "model_config.json").read_text())
    assert spec["mask_id"] == 256 and spec["config"]["vocab_size"] == 257

    with open(folder / "doc05.txt", "a") as f:
        f.write("a line added after the run\n")
    before = _tree(run_dir)
    proc = cli(*args, "trainer.max_steps=6", f"ckpt_path={run_dir}/checkpoints/last.ckpt")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = _error_lines(proc)
    assert line.startswith("error: data.source=") and "doc05.txt changed (57 bytes then, 84 now)" in line
    assert "Traceback" not in proc.stderr and _tree(run_dir) == before  # not a file added, touched or removed

    server = LocalHub(tmp_path / "hub").start()  # after the CLI runs: the client's HF_ variables would start them cold
    try:
        with patch_client(server.url, tmp_path / "hf-cache", token="dummy"):
            push_to_hub(run_dir, "local-user/on-my-text")
            card = Path(hf_hub_download("local-user/on-my-text", "README.md")).read_text()
    finally:
        server.stop()
    section = card.split("## Training data")[1].split("\n## ")[0]
    assert f"`{folder}`: `doc00.txt`" in section and f"| fingerprint | `{data['fingerprint']}` |" in section
    assert "| format | text |" in section and f"| tokens | {data['tokens']:,} |" in section
    assert f"| packing efficiency | {data['packing_efficiency']} |" in section


def test_an_empty_source_and_unset_values_are_refused_in_one_line_with_nothing_written(tmp_path, cli):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["", None, ""]))
    run_dir = tmp_path / "run"
    proc = cli("recipe=char_lm", *TINY, f"data.source={empty}", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = _error_lines(proc)
    assert line == (f"error: data.source={empty}: the train split has no document to train on: every value of "
                    "data.column='text' is empty or null (an empty source)")
    with pytest.raises(PreflightError) as err:  # the same check in-process: it once crashed the preflight
        preflight(["recipe=char_lm", *TINY, "data.source=???", "model.dim=???", f"hydra.run.dir={run_dir}"])
    assert str(err.value) == ("data.source=??? is a required value left unset: give it on the command line, "
                              "data.source=... (also unset: model.dim)")
    assert not run_dir.exists()


def test_chat_rows_that_are_all_skipped_are_refused_before_the_run_writes_anything(tmp_path):
    """Every conversation lacks an assistant turn: the preflight's source check (after the data took the model's
    tokenizer, before the run dir) refuses it, instead of the packing at setup."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from framework.build_check import check_data_source
    from framework.data.user_chat import ChatData

    words = ["<pad>", "<eos>", "<unk>", "user", "assistant", "hello", "there"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}"
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "hello there"}]}) + "\n"
                            for _ in range(5)))
    data = ChatData(str(path), seq_len=16, batch_size=1, cache_dir=str(tmp_path / "cache"))
    data.use_tokenizer(tok)
    with pytest.raises(PreflightError, match=r"the train split has no document to train on: every row is skipped "
                                             r"\(a conversation with no assistant turn"):
        check_data_source(data)
    assert not (tmp_path / "cache" / "text").exists()  # nothing packed
