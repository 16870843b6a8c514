"""The generated tasks (needle, kv_recall, pointer_chase) on a model that brings a tokenizer: each task symbol is
written as one token of that tokenizer (roles as its special tokens), so rows keep their positions and answers, and
a recipe on such a task trains on an HF model given only its name."""

from __future__ import annotations

import functools
import json
import math
import os

import pytest
import torch
from hf_models import SPECIAL, save_model, tokenizer
from support import warm_cli

pytest.importorskip("transformers")

from framework.assembly import hand_tokenizer  # noqa: E402
from framework.data.kv_recall import KVRecallData  # noqa: E402
from framework.data.needle import NeedleData  # noqa: E402
from framework.data.pointer_chase import PointerChaseData  # noqa: E402
from framework.data.symbols import symbol_map  # noqa: E402
from framework.models.hf import HFCausalLM  # noqa: E402


def test_roles_take_the_tokenizers_special_tokens_and_symbols_single_tokens():
    tok = tokenizer()
    data = NeedleData(n_symbols=12, context_len=8, max_eos=2, n_train=64, n_val=64, batch_size=8)
    task_vocab = data.vocab_size
    data.use_tokenizer(tok)
    ids = {name: tok.convert_tokens_to_ids(SPECIAL[f"{role}_token"])
           for name, role in (("pad_id", "pad"), ("eos_id", "eos"), ("bos_id", "bos"), ("mask_id", "mask"))}
    assert {name: getattr(data, name) for name in ids} == ids
    assert data.vocab_size == len(tok) and data.token_map.shape == (task_vocab,)
    assert len(set(data.token_map.tolist())) == task_vocab  # one token per symbol, none shared
    others = [i for i in data.token_map.tolist() if i not in ids.values()]
    assert not set(others) & set(tok.all_special_ids)  # SEP, the needle marker and the content: plain tokens
    for token in others:  # each a string the tokenizer writes back as that one token
        assert tok(tok.decode([token]), add_special_tokens=False)["input_ids"] == [token]
    assert data.sep_id in others and data.needle_id in others


@pytest.mark.parametrize("make", [
    functools.partial(NeedleData, n_symbols=12, context_len=8, max_eos=3),
    functools.partial(KVRecallData, n_pairs=4, n_keys=8, n_values=8, max_eos=3),
    functools.partial(PointerChaseData, n_pairs=4, n_symbols=8, val_batch_size=8),
], ids=["needle", "kv_recall", "pointer_chase"])
def test_rows_are_the_task_rows_written_token_by_token(make):
    """Same seed, same rows: the tokenized run's rows are the map applied to the task's own, position by position;
    evaluation batches too (their answers included), and a row decodes to text and re-encodes to the same ids."""
    plain, tokenized = make(n_train=32, n_val=16, batch_size=8), make(n_train=32, n_val=16, batch_size=8)
    tok = tokenizer()
    tokenized.use_tokenizer(tok)
    plain.setup(), tokenized.setup()
    for a, b in ((plain.train_set, tokenized.train_set), (plain.val_set, tokenized.val_set)):
        for i in (0, 5):
            ra, rb = a[i], b[i]
            if isinstance(ra, dict):
                for key in ra:
                    mapped = tokenized.token_map[ra[key]] if key in ("tokens", "value") else ra[key]
                    assert torch.equal(rb[key], mapped), key
            else:
                assert torch.equal(rb, tokenized.token_map[ra])
    if hasattr(plain, "eval_batch"):
        ea, eb = plain.eval_batch(m=2, n_per_slot=3), tokenized.eval_batch(m=2, n_per_slot=3)
        assert torch.equal(eb["tokens"], tokenized.token_map[ea["tokens"]])
        assert torch.equal(eb["answer"], tokenized.token_map[ea["answer"]])
        assert (eb["tokens"][:, ea["answer_position"]] == tokenized.mask_id).all()
    row = tokenized.val_set[0]
    row = row["tokens"] if isinstance(row, dict) else row
    body = row[row != tokenized.pad_id].tolist()
    assert tok(tok.decode(body), add_special_tokens=False)["input_ids"] == body


def test_a_task_larger_than_the_tokenizers_single_tokens_is_refused_naming_both_counts():
    tok = tokenizer()
    with pytest.raises(ValueError, match=r"the task has 397 symbols .* writes only \d+ of the \d+ candidate"):
        symbol_map(tok, 400, {"pad_id": 0, "eos_id": 1, "mask_id": 2})


def test_the_run_hands_a_named_models_tokenizer_to_a_generated_task(tmp_path):
    folder = save_model("llama", tmp_path / "llama")
    data = PointerChaseData(n_pairs=4, n_symbols=8, n_train=32, n_val=16, batch_size=8, val_batch_size=8)
    assert hand_tokenizer(functools.partial(HFCausalLM, name_or_path=str(folder)), data) is not None
    assert data.vocab_size == len(tokenizer()) and data.eos_id == tokenizer().eos_token_id


@pytest.mark.parametrize("family,args", [("bert", ["recipe=mdlm_mask_agnostic", "model=hf_masked_lm"])],
                         ids=["needle_mask_agnostic_on_bert"])
def test_a_generated_task_recipe_trains_on_an_hf_model_by_name(family, args, tmp_path):
    """Through the CLI at the recipe's smoke size, the model named by its folder, nothing else said about the data
    (pointer chasing on a Llama by name: tests/hf/test_rlkv_hf.py's DuoAttention probe run)."""
    folder = save_model(family, tmp_path / family)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FRAMEWORK_SMOKE": "1"}
    proc = warm_cli.run("framework.train", [*args, f"model.name_or_path={folder}", f"hydra.run.dir={tmp_path / 'run'}"],
                        env, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["global_step"] > 0 and all(math.isfinite(v) for v in results["metrics"].values())
