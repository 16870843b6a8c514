"""The methods on the user's own data (issue 44, item 6), each through its command line on files written here: OLion
fine-tunes an HF causal LM on a chat file, and GICDM's text features (`HFFeatures`) score the user's text rows
(real) against a file of generated ones. (The probes on chat rows: tests/probes/test_user_chat_probes.py; the MDLM
mask-agnostic loss on an HF masked LM: tests/modules/test_user_batches.py.) A word-level tokenizer and a tiny Llama
are saved to a folder here, as a user's model is; nothing is downloaded."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_chat import WORDS, tiny_llama

pytest.importorskip("transformers")

def sentences(n: int, words: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def test_olion_fine_tunes_an_hf_causal_lm_on_a_chat_file_through_the_cli(cli, tmp_path):
    """`model=hf_causal_lm model.name_or_path=<folder> data=chat data.source=<file> optimizer=olion`: 40 steps on
    prompt/completion rows (the completion is the prompt's first word) lower the held-out loss on the completions
    (finite), and move the model's weights."""
    from safetensors.torch import load_file

    model = tiny_llama(tmp_path / "llama")
    rows = [{"prompt": f"list: {s} first:", "completion": " " + s.split()[0]} for s in sentences(200, WORDS, 0)]
    source = tmp_path / "sft.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = tmp_path / "run"
    proc = cli("recipe=char_lm", "model=hf_causal_lm", f"model.name_or_path={model}", "data=chat",
               f"data.source={source}", "data.seq_len=32", "data.batch_size=8", "data.packing=false",
               "optimizer=olion", "optimizer.lr=1e-2", "trainer.max_steps=40", "trainer.val_check_interval=40",
               f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["choices"]["optimizer"] == "olion" and results["global_step"] == 40
    before, after = results["initial_metrics"]["val/loss_init"], results["metrics"]["val/loss"]
    assert np.isfinite(after) and after < 0.9 * before, (before, after)  # 2.54 -> 1.93 when measured
    assert results["data"]["chat"]["documents"] == 190  # 10 of 200 held out
    trained = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    saved = load_file(str(model / "model.safetensors"))
    assert all(not torch.equal(trained[f"model.hf.{k}"], v) for k, v in saved.items() if k.endswith("proj.weight"))


def _text_files(tmp_path: Path) -> dict[str, Path]:
    """The user's rows (JSON Lines with a `text` column, as `data=text` reads them) and two files of generated texts,
    one per line: from the same words, and from two of them only."""
    files = {"real": tmp_path / "real.jsonl", "same": tmp_path / "same.txt", "narrow": tmp_path / "narrow.txt"}
    files["real"].write_text("".join(json.dumps({"text": t, "id": i}) + "\n"
                                     for i, t in enumerate(sentences(60, WORDS, 1))), encoding="utf-8")
    files["same"].write_text("\n".join(sentences(60, WORDS, 2)) + "\n\n", encoding="utf-8")
    files["narrow"].write_text("\n".join(sentences(60, WORDS[:2], 3)) + "\n", encoding="utf-8")
    return files


def test_gicdm_scores_the_users_text_rows_against_generated_texts_embedded_by_an_hf_model(tmp_path, capsys):
    """`python -m framework.metrics real.jsonl generated.txt --feature <folder>` (its entry point, in this process):
    both sides embedded by the model's pooled hidden states, the output saying which side is real; texts from the
    real rows' distribution are covered, texts of two words only are not. The numbers are prdc's on HFFeatures of
    the same texts."""
    from framework.metrics import prdc
    from framework.metrics.__main__ import main
    from framework.models.hf_features import HFFeatures

    model, files = tiny_llama(tmp_path / "llama"), _text_files(tmp_path)
    out = {}
    for name in ("same", "narrow"):
        code = main([str(files["real"]), str(files[name]), "--feature", str(model), "--correction", "icdm"])
        assert code == 0
        out[name] = json.loads(capsys.readouterr().out)
    same = out["same"]
    assert same["real"] == {"path": str(files["real"]), "read_as": "texts", "points": 60}
    assert same["fake"] == {"path": str(files["same"]), "read_as": "texts", "points": 60}  # blank lines skipped
    assert same["feature"] == {"model": str(model), "layer": -1, "pool": "mean"} and same["dim"] == 32
    assert same["recall"] > 0.8 and same["coverage"] > 0.8
    assert out["narrow"]["recall"] < 0.2 and out["narrow"]["coverage"] < 0.2
    features = HFFeatures(str(model))
    real = features.embed_texts([json.loads(line)["text"] for line in files["real"].read_text().splitlines()])
    fake = features.embed_texts([t for t in files["same"].read_text().splitlines() if t])
    expected = prdc(real.numpy(), fake.numpy(), 5, "icdm")
    for key in ("precision", "recall", "density", "coverage"):
        assert same[key] == pytest.approx(expected[key], abs=1e-9)


def test_texts_without_a_model_to_embed_them_are_one_error_line(tmp_path, capsys):
    from framework.metrics.__main__ import main

    files = _text_files(tmp_path)
    assert main([str(files["real"]), str(files["same"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {files['real']} holds texts: name the model") and \
        "--feature" in err[0]
    assert main([str(files["real"]), str(files["same"]), "--feature", str(tmp_path / "nowhere")]) == 2
    assert "error: --feature " in capsys.readouterr().err


@pytest.mark.slow
def test_the_metrics_command_scores_texts_in_a_fresh_process(tmp_path):
    from helpers import REPO

    model, files = tiny_llama(tmp_path / "llama"), _text_files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "framework.metrics", str(files["real"]), str(files["narrow"]),
                           "--feature", str(model), "--pool", "last"], capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["real"]["path"] == str(files["real"]) and out["feature"]["pool"] == "last" and out["coverage"] < 0.5
