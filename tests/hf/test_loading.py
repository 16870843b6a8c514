"""Loading the checkpoints users really hold (issue 43): weights missing from, unexpected in or of another shape than
a checkpoint are named (an error, or a warning with `strict=False`), tied heads and non-persistent buffers are not
missing, a damaged model.safetensors is one ValueError naming the file (one `error:` line and exit 2 on the CLI);
a fresh config drops its family's special-token ids outside the data's vocabulary and its fixed head_dim;
transformers picks the attention for the family; each `load_tokenizer` call gives a fresh tokenizer of the repo's
current commit. Tiny Llama folders without a tokenizer (vocabulary 64) and a word-level tokenizer built here."""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch
from helpers import finish, run_cli, start_cli
from hf_models import hf_config

pytest.importorskip("transformers")

from framework.models.hf import HFCausalLM, HFMaskedLM, load_tokenizer  # noqa: E402
from framework.models.hf_loading import fresh_hf_config  # noqa: E402

VOCAB = 64
DROPPED = ("model.layers.0.mlp.up_proj.weight", "model.norm.weight")
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64}


def _save(folder: Path, vocab: int = VOCAB, **changes) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(hf_config("llama", vocab, **changes)).save_pretrained(str(folder))
    return folder


def _rewrite(folder: Path, drop=(), add=None) -> dict:
    """The folder's model.safetensors without `drop`, with `add`; returns what was there before."""
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    kept = {k: v for k, v in weights.items() if k not in drop}
    save_file({**kept, **(add or {})}, folder / "model.safetensors", metadata={"format": "pt"})
    return weights


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("loading") / "llama")


@pytest.mark.parametrize("tied", [False, True])
def test_missing_weights_are_an_error_naming_them_or_a_warning(tmp_path, tied):
    folder = _save(tmp_path / "m", tie_word_embeddings=tied)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a whole checkpoint, tied head or not: not a word
        whole = HFCausalLM(name_or_path=str(folder))
    saved = _rewrite(folder, drop=DROPPED)
    assert torch.equal(whole.hf.model.embed_tokens.weight, saved["model.embed_tokens.weight"])
    assert (whole.hf.lm_head.weight.data_ptr() == whole.hf.model.embed_tokens.weight.data_ptr()) == tied
    with pytest.raises(ValueError) as err:
        HFCausalLM(name_or_path=str(folder))
    message = str(err.value)
    assert str(folder) in message and "2 missing" in message and all(k in message for k in DROPPED), message
    assert "model.strict=false" in message and "unexpected (" not in message
    with pytest.warns(UserWarning, match="2 missing") as caught:
        loose = HFCausalLM(name_or_path=str(folder), strict=False)
    assert all(k in str(caught[0].message) for k in DROPPED) and str(folder) in str(caught[0].message)
    assert torch.equal(loose.hf.model.layers[1].mlp.up_proj.weight, saved["model.layers.1.mlp.up_proj.weight"])


def test_unexpected_and_mismatched_weights_are_named(tmp_path, llama):
    folder = tmp_path / "odd"
    shutil.copytree(llama, folder)
    extra = {f"model.layers.2.mlp.gate_proj.weight{i}": torch.zeros(2) for i in range(5)}
    _rewrite(folder, add={**extra, "model.layers.1.mlp.down_proj.weight": torch.zeros(32, 8)})
    with pytest.raises(ValueError) as err:
        HFCausalLM(name_or_path=str(folder))
    message = str(err.value)
    assert "5 unexpected" in message and "and 2 more" in message and "missing (" not in message, message
    assert "1 of another shape" in message and "model.layers.1.mlp.down_proj.weight" in message
    assert "(32, 8)" in message and "(32, 64)" in message
    with pytest.warns(UserWarning, match="5 unexpected"):
        HFCausalLM(name_or_path=str(folder), strict=False)


def test_a_damaged_safetensors_file_is_one_value_error_naming_it(tmp_path, llama):
    folder = tmp_path / "damaged"
    shutil.copytree(llama, folder)
    weights = folder / "model.safetensors"
    for damage in (weights.read_bytes()[:-100], b"", b"\x00" * 5):
        weights.write_bytes(damage)
        for meta in (False, True):  # the CLI's preflight builds on the meta device: it reads the file's header
            with pytest.raises(ValueError) as err:
                if meta:
                    from accelerate import init_empty_weights

                    with init_empty_weights():
                        HFCausalLM(name_or_path=str(folder))
                else:
                    HFCausalLM(name_or_path=str(folder))
            assert str(weights) in str(err.value) and "damaged" in str(err.value), str(err.value)
    weights.unlink()
    with pytest.raises(ValueError, match="no model.safetensors"):
        HFCausalLM(name_or_path=str(folder))


def test_a_damaged_checkpoint_through_the_real_command(tmp_path, llama):
    """One `error:` line, exit 2, no checkpoint (the preflight refuses it: no run dir at all)."""
    folder, run = tmp_path / "damaged", tmp_path / "run"
    _save(folder, vocab=256)  # byte ids: char_lm's data keeps its own without a tokenizer
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, err = finish(start_cli(["recipe=char_lm", "model=hf_causal_lm", f"model.name_or_path={folder}",
                                  "trainer.max_steps=1", "threads=1", f"hydra.run.dir={run}"]))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert str(weights) in errors[0] and not (run / "checkpoints").exists()


# ---- fresh configs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["phi3", "smollm3", "olmoe"])
def test_a_fresh_config_drops_its_familys_token_ids_outside_the_datas_vocabulary(model_type, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="framework.models.hf_loading"):
        model = HFCausalLM(config={"model_type": model_type, **SMALL}, vocab_size=256)
    ids = {k: getattr(model.hf.config, k, None) for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
    assert all(v is None or 0 <= v < 256 for v in ids.values()), ids
    assert "outside the vocabulary" in caplog.text and "eos_token_id" in caplog.text
    model.hf.save_pretrained(str(tmp_path))  # the generation config says no more than the model's
    generation = (tmp_path / "generation_config.json").read_text()
    assert all(str(n) not in generation for n in (32000, 50279, 128001, 128004)), generation
    model(torch.randint(0, 256, (1, 8)))


def test_token_ids_the_user_set_outside_the_vocabulary_are_an_error():
    with pytest.raises(ValueError, match=r"model.config.pad_token_id=300 .*vocab_size=256"):
        fresh_hf_config({"model_type": "llama", **SMALL, "pad_token_id": 300}, 256)
    with pytest.raises(ValueError, match=r"model.config.eos_token_id=\[1, 999\]"):
        fresh_hf_config({"model_type": "llama", **SMALL, "eos_token_id": [1, 999]}, 256)
    kept = fresh_hf_config({"model_type": "phi3", **SMALL, "pad_token_id": 3}, 256)
    assert kept.pad_token_id == 3 and kept.eos_token_id is None


def test_a_fresh_config_without_head_dim_takes_hidden_over_heads(caplog):
    with caplog.at_level(logging.INFO, logger="framework.models.hf_loading"):
        config = fresh_hf_config({"model_type": "qwen3", **SMALL}, 256)
    assert config.head_dim == 8 and "head_dim=8" in caplog.text
    assert fresh_hf_config({"model_type": "qwen3", **SMALL, "head_dim": 16}, 256).head_dim == 16
    assert fresh_hf_config({"model_type": "gemma", **SMALL}, 256).head_dim == 8
    with pytest.raises(ValueError, match=r"hidden_size=30 .*num_attention_heads=4"):
        fresh_hf_config({"model_type": "qwen3", **SMALL, "hidden_size": 30}, 256)


@pytest.mark.slow  # a Hub run (~9 s); make test checks the ids in-process for five families just below
def test_a_fresh_config_on_the_datas_vocabulary_takes_the_datas_special_ids(hub, tmp_path):
    """The README's pointer-chase model (`recipe=pointer_chase_lm`, a fresh Llama config): its pushed config and
    generation config say the task's PAD 0, BOS 1 and EOS 3 (Llama's default eos 2 is the task's SEP), and the run's
    one loading line says so; the Hub copy opens in transformers with them."""
    import json

    from framework.data.pointer_chase import BOS, EOS, PAD

    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(tmp_path / "hf_home"), "FRAMEWORK_SMOKE": "1"}
    repo = "local-user/chase-ids"
    proc = run_cli("recipe=pointer_chase_lm", "model=hf_causal_lm", "model.config={model_type: llama, hidden_size: 32, "
                   "intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2}",
                   "trainer.max_steps=1", f"hub.repo_id={repo}", f"hydra.run.dir={tmp_path / 'run'}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = {line.split(" - ", 1)[-1] for line in proc.stdout.splitlines() if "special-token ids" in line}
    (line,) = said  # one line (the warm test CLI shows the preflight's build's too: the same line)
    assert "pad_token_id=0, bos_token_id=1, eos_token_id=3" in line and "defaults were" in line, line
    assert "eos_token_id=2" in line, line  # what it replaced: Llama's eos, the task's SEP
    wanted = {"pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS}
    for name in ("config.json", "generation_config.json"):
        pushed = json.loads(Path(hub.api.hf_hub_download(repo, name)).read_text())
        assert {k: pushed.get(k) for k in wanted} == wanted, (name, pushed)


@pytest.mark.parametrize("model_type", ["llama", "phi3", "gemma2", "olmoe", "bert"])
def test_the_datas_special_ids_replace_the_familys_and_the_users_win(model_type):
    keys = ("pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id")
    small = {**SMALL, **({"num_experts": 2, "num_experts_per_tok": 1} if model_type == "olmoe" else {})}
    config = fresh_hf_config({"model_type": model_type, **small}, 36, {"pad_id": 0, "bos_id": 1, "eos_id": 3})
    assert {k: getattr(config, k, None) for k in keys} == {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 3,
                                                           "mask_token_id": None}
    none = fresh_hf_config({"model_type": model_type, **small}, 36, {})  # the data states none: the family's cleared
    assert all(getattr(none, k, None) is None for k in keys)
    mine = fresh_hf_config({"model_type": model_type, **small, "eos_token_id": 5}, 36, {"eos_id": 3, "mask_id": 4})
    assert (mine.eos_token_id, mine.mask_token_id, mine.pad_token_id) == (5, 4, None)
    with pytest.raises(ValueError, match=r"model.config.eos_token_id=36 .*vocab_size=36"):
        fresh_hf_config({"model_type": model_type, **small, "eos_token_id": 36}, 36, {"eos_id": 3})
    own = fresh_hf_config({"model_type": model_type, **small, "vocab_size": 40}, 36, {"eos_id": 3})
    family = fresh_hf_config({"model_type": model_type, **small, "vocab_size": 40}, 36)
    assert own.eos_token_id == family.eos_token_id  # its own vocabulary: the family's ids inside it are kept
    model_cls = HFMaskedLM if model_type == "bert" else HFCausalLM
    model = model_cls(config={"model_type": model_type, **small}, vocab_size=36,
                      special_ids={"pad_id": 0, "mask_id": 2})
    assert model.hf.config.pad_token_id == 0 and model.mask_id == 2 and model.init_config["special_ids"]["mask_id"] == 2
    assert model(torch.randint(0, 36, (1, 8))).shape == (1, 8, 36)


# ---- attention --------------------------------------------------------------------------------------------------
def test_transformers_picks_the_attention_for_the_family():
    from framework.registry import MODELS

    for cls in (HFCausalLM, HFMaskedLM):
        import inspect

        assert inspect.signature(cls).parameters["attn_implementation"].default is None
    assert MODELS.build("hf_causal_lm", config={"model_type": "gemma2", **SMALL}, vocab_size=64) is not None
    gemma2 = HFCausalLM(config={"model_type": "gemma2", **SMALL}, vocab_size=64)
    assert gemma2.hf.config._attn_implementation == "eager"  # softcapping
    oss = HFCausalLM(config={"model_type": "gpt_oss", **SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
                     vocab_size=64)
    for model in (gemma2, oss):
        assert model(torch.randint(0, 64, (2, 8))).shape == (2, 8, 64)
    assert HFCausalLM(config={"model_type": "llama", **SMALL}, vocab_size=64).hf.config._attn_implementation == "sdpa"


# ---- tokenizers -------------------------------------------------------------------------------------------------
def _tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<pad>", *words])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")


def test_each_call_gives_a_fresh_tokenizer_of_the_repos_current_commit(tmp_path, hub):
    folder = tmp_path / "with_tokenizer"
    hf_config("llama", VOCAB).save_pretrained(str(folder))
    _tokenizer(["hello", "world"]).save_pretrained(str(folder))
    first = load_tokenizer(str(folder))
    first.add_tokens(["<mine>"])
    first.pad_token = "hello"
    again = load_tokenizer(str(folder))
    assert again is not first and len(again) == 4 and again.pad_token == "<pad>"
    assert HFCausalLM.tokenizer_for(name_or_path=str(folder)) is not HFCausalLM.tokenizer_for(tokenizer=str(folder))

    repo = "local-user/retokenized"
    hub.api.create_repo(repo, exist_ok=True)
    hub.api.upload_folder(repo_id=repo, folder_path=str(folder))
    assert load_tokenizer(repo)("hello world")["input_ids"] == [2, 3]
    _tokenizer(["world", "hello", "again"]).save_pretrained(str(folder))
    hub.api.upload_folder(repo_id=repo, folder_path=str(folder))
    pushed = load_tokenizer(repo)
    assert len(pushed) == 5 and pushed("hello world")["input_ids"] == [3, 2]


def test_a_second_local_hub_in_the_same_process_serves_the_tokenizer_at_once(tmp_path):
    """transformers keeps one shared Hub client whose endpoint froze at its first call; `patch_client` points it at
    each hub in turn, so a tokenizer load never retries a stopped hub (23 s a call) nor reads another one."""
    from huggingface_hub import HfApi

    from framework.local_hub import LocalHub, patch_client

    folder = tmp_path / "with_tokenizer"
    hf_config("llama", VOCAB).save_pretrained(str(folder))
    for name, words in (("first", ["hello", "world"]), ("second", ["world", "hello"])):
        _tokenizer(words).save_pretrained(str(folder))
        with LocalHub(tmp_path / name) as hub, patch_client(hub.url, tmp_path / f"{name}_cache", token="dummy"):
            HfApi(endpoint=hub.url).create_repo("local-user/tok")
            HfApi(endpoint=hub.url).upload_folder(repo_id="local-user/tok", folder_path=str(folder))
            started = time.perf_counter()
            ids = load_tokenizer("local-user/tok")("hello world")["input_ids"]
            assert time.perf_counter() - started < 10 and ids == ([2, 3] if name == "first" else [3, 2])
