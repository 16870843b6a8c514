"""Hugging Face models through the real CLI: every family killed with SIGKILL mid-training resumes bitwise equal to an
uninterrupted run, and bad input (an unknown Hub id, a folder without config.json, an unknown architecture, a
tokenizer/vocab mismatch, no mask token for the MDLM module) is one `error:` line, exit 2, nothing written."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from helpers import KILL, assert_same_state, finish, start_cli, train_state
from hf_models import CAUSAL_FAMILIES, MASKED_FAMILIES, save_model

pytest.importorskip("transformers")

FAMILIES = [*CAUSAL_FAMILIES, *MASKED_FAMILIES]
SMALL = ["threads=1", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
         "trainer.enable_progress_bar=false", "data.max_bytes=20000", "data.seq_len=32", "data.batch_size=4",
         "callbacks.checkpoint.every_n_train_steps=1"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_cli_models")
    return {family: save_model(family, root / family) for family in FAMILIES}


def _args(family: str, folder) -> list[str]:
    # NS in fp32 for both runs: the automatic choice is timed per process, and the two runs side by side may differ
    olion = ["optimizer=olion", "optimizer.ns_dtype=float32"]
    if family in MASKED_FAMILIES:  # a masked LM trains as a masked diffusion LM on the same text
        return ["recipe=mdlm_text", "model=hf_masked_lm", f"model.name_or_path={folder}", *olion, *SMALL]
    return ["recipe=char_lm", "model=hf_causal_lm", f"model.name_or_path={folder}", *olion, *SMALL]


#: make test kills and resumes one dense causal family and one MoE (causal_lm, and the router's state); the masked LMs'
#: path (mdlm) is resumed bitwise in make test on the framework's own model (modules/test_mdlm_module.py), and every
#: family, BERT's among them, in make test-slow
RESUMED_IN_MAKE_TEST = ("llama", "mixtral")


@pytest.mark.parametrize("family", [f if f in RESUMED_IN_MAKE_TEST else pytest.param(f, marks=pytest.mark.slow)
                                    for f in FAMILIES])
def test_each_family_killed_mid_run_resumes_bitwise_equal(folders, family, tmp_path):
    """OLion's state (momentum, the AdamW branch's moments) included; the data is the model's own tokenizer's."""
    args = _args(family, folders[family])
    full, cut, resumed = tmp_path / "full", tmp_path / "cut", tmp_path / "resumed"
    ref = start_cli([*args, f"hydra.run.dir={full}"])
    killed = start_cli([*args, *KILL, "+callbacks.kill.step=2", f"hydra.run.dir={cut}"])
    (code, err), (kcode, kerr) = finish(ref), finish(killed)
    assert code == 0, err[-3000:]
    assert kcode == -9, kerr[-3000:]
    results = json.loads((full / "results.json").read_text())
    assert results["global_step"] == 4 and all(math.isfinite(v) for v in results["metrics"].values())
    assert train_state(cut / "checkpoints" / "last.ckpt")["global_step"] == 2
    code, err = finish(start_cli([*args, f"ckpt_path={cut / 'checkpoints' / 'last.ckpt'}",
                                  f"hydra.run.dir={resumed}"]))
    assert code == 0, err[-3000:]
    assert_same_state(train_state(full / "checkpoints" / "last.ckpt"),
                      train_state(resumed / "checkpoints" / "last.ckpt"))


def _refused(args: list[str], run_dir, capsys) -> str:
    """The CLI's checks on `args` in this process (what `main()` does before Hydra): exit 2, one `error:` line."""
    from framework.cli import check_command_line
    from framework.errors import report_and_exit

    with pytest.raises(SystemExit) as exit_:
        report_and_exit(check_command_line, [*args, f"hydra.run.dir={run_dir}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note:")]
    assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines
    assert not run_dir.exists()
    return lines[0]


def test_bad_models_are_refused_before_anything_is_written(folders, tmp_path, hub, capsys):
    run = tmp_path / "run"
    base = ["recipe=char_lm", "model=hf_causal_lm", *SMALL]
    err = _refused([*base, "model.name_or_path=local-user/no-such-model"], run, capsys)
    assert "local-user/no-such-model" in err and f"the Hub at {hub.url}" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _refused([*base, f"model.name_or_path={empty}"], run, capsys)
    assert "has no config.json" in err and str(empty) in err
    odd = tmp_path / "odd"
    shutil.copytree(folders["llama"], odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "model_type": "lama"}))
    err = _refused([*base, f"model.name_or_path={odd}"], run, capsys)
    assert "lama" in err and "'llama'" in err  # did you mean
    err = _refused([*base, "model.config={model_type: lama, hidden_size: 32}"], run, capsys)
    assert "model.config.model_type='lama'" in err and "'llama'" in err
    small = save_model("llama", tmp_path / "small_vocab", with_tokenizer=False, vocab_size=100)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the 384-token tokenizer beside 100 embeddings
        shutil.copy(folders["llama"] / name, small / name)
    err = _refused([*base, f"model.name_or_path={small}"], run, capsys)
    assert "vocab_size=384" in err and "100 embeddings" in err
    err = _refused([*base, f"model.name_or_path={folders['llama']}", "data.seq_len=300"], run, capsys)
    assert "data.seq_len=300" in err and "max_position_embeddings (256)" in err
    err = _refused(["recipe=char_lm", "model=hf_masked_lm", f"model.name_or_path={folders['llama']}", *SMALL], run,
                   capsys)
    assert "AutoModelForMaskedLM" in err and "model=hf_causal_lm" in err


def test_an_mdlm_on_a_model_whose_tokenizer_has_no_mask_token_is_refused(tmp_path, capsys):
    from hf_models import tokenizer

    folder = save_model("llama", tmp_path / "nomask", with_tokenizer=False)
    tok = tokenizer()
    tok.mask_token = None
    tok.save_pretrained(str(folder))
    err = _refused(["recipe=mdlm_text", "model=hf_causal_lm", f"model.name_or_path={folder}", *SMALL],
                   tmp_path / "run", capsys)
    assert "no mask token" in err and "hf_masked_lm" in err


@pytest.mark.slow  # make test: the same refusals in test_bad_models_are_refused_before_anything_is_written
def test_a_folder_without_config_json_through_the_real_command(tmp_path):
    """As a user meets it: a separate process, its exit code and its one `error:` line; no run dir."""
    run, empty = tmp_path / "run", tmp_path / "empty"
    empty.mkdir()
    code, err = finish(start_cli(["recipe=char_lm", "model=hf_causal_lm", f"model.name_or_path={empty}",
                                  f"hydra.run.dir={run}"]))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert "has no config.json" in errors[0] and not run.exists()
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == ["note: model=hf_causal_lm takes no dim, depth, heads, init: recipe char_lm's model.dim=128, "
                     "model.depth=2, model.heads=4, model.init=gpt2 are left out"]
