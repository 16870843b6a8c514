"""The bad-input catalogue: each case gets a clear, specific error that names the bad value and what is valid,
and nothing already on disk is lost. (Hub cases — a repo that does not exist, a tampered config.json, a pickle in
place of safetensors, bad repo ids, the Hub going down — live in tests/test_hub.py and tests/test_generate.py;
disk full and kills during a save in tests/test_checkpointing.py; NaN loss and Ctrl-C in-process in
tests/callbacks/test_safety.py.)"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ENDLESS_STEPS, REPO, run_cli, wait_for_a_checkpoint
from support import warm_cli

from framework.cli import BadSettingError, check_choices, check_command_line, check_settings
from framework.errors import InputError, report_and_exit
from framework.preflight import preflight
from framework.recipe import SMOKE
from framework.registry import GROUPS, KINDS, UnknownNameError, load_catalog

load_catalog()


# -- unknown names, one per Hydra group (did-you-mean from the registry) ---------------------------------------
def _typo(name: str) -> str:
    return name[:-1] + ("x" if name[-1] != "x" else "y")


@pytest.mark.parametrize("group", sorted(g for g in GROUPS if GROUPS[g].names()))
def test_unknown_name_in_every_group_gets_did_you_mean_and_the_valid_names(group):
    registry = GROUPS[group]
    real = registry.names()[0]
    value = f"[{_typo(real)}]" if group == "callbacks" else _typo(real)
    with pytest.raises(UnknownNameError) as err:
        check_choices([f"{group}={value}"])
    msg = str(err.value)
    assert f"Unknown {registry.kind} {_typo(real)!r}. Did you mean " in msg and repr(real) in msg
    assert f"Valid {registry.kind} names: " in msg


# -- override keys and value types -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["recipe=char_lm", "trainer.max_stpes=5"], "Unknown setting 'trainer.max_stpes'. Did you mean "
                                                    "'trainer.max_steps'"),
        (["recipe=char_lm", "optimizer.lrr=0.1"], "Unknown setting 'optimizer.lrr'. Did you mean 'optimizer.lr'?"),
        (["recipe=char_lm", "model.dimm=64"], "Unknown setting 'model.dimm'. Did you mean 'model.dim'?"),
        (["recipe=char_lm", "sed=3"], "Unknown setting 'sed'. Did you mean 'seed'?"),
        (["recipe=char_lm", "trainer.max_steps=abc"], "Bad value for trainer.max_steps: 'abc'. Value 'abc' of type "
                                                      "'str' could not be converted to Integer"),
        (["recipe=char_lm", "model.dim=1.5"], "Bad value for model.dim: '1.5'."),
        (["recipe=mdlm_text", "module.ema_decay=high"], "Bad value for module.ema_decay: 'high'."),
    ],
)
def test_misspelt_keys_and_wrong_types_are_named_with_the_valid_ones(args, expected):
    with pytest.raises(BadSettingError, match=re.escape(expected)):
        check_settings(args)


def test_valid_overrides_pass_the_setting_check():
    check_settings(["recipe=char_lm", "trainer.max_steps=5", "optimizer.lr=0.01", "trainer.fast_dev_run=true",
                    "+callbacks=lr_monitor", "callbacks.lr_monitor.logging_interval=epoch"])  # `+` parts count too


# -- out-of-range hyper-parameters, one case for every registered component ---------------------------------
def _param():
    return [torch.nn.Parameter(torch.zeros(4, 4))]


def _tiny_lm():
    return KINDS["model"].build("transformer_lm", vocab_size=12, dim=16, depth=1, heads=2)


def _tiny_causal_lm():
    return KINDS["model"].build("transformer_lm", vocab_size=12, dim=16, depth=1, heads=2, causal=True)


# (kind, name) -> (positional args factory, bad keyword values, message regex); None = takes no tunable value
BAD: dict[tuple[str, str], tuple | None] = {
    ("optimizer", "adamw"): (lambda: [_param()], {"lr": -1.0}, r"Invalid learning rate: -1\.0"),
    ("optimizer", "sgd"): (lambda: [_param()], {"momentum": -0.5}, r"Invalid momentum value: -0\.5"),
    ("optimizer", "olion"): (lambda: [_param()], {"betas": (0.9, 1.5)}, r"betas=\(0\.9, 1\.5\) is invalid"),
    ("optimizer", "muon"): (lambda: [_param()], {"lr": -1.0}, r"lr=-1\.0 is invalid: must be >= 0"),
    ("optimizer", "ortho_momentum"): (lambda: [_param()], {"lr": -1.0}, r"lr=-1\.0 is invalid"),
    ("optimizer", "lion"): (lambda: [_param()], {"weight_decay": -1.0}, r"weight_decay=-1\.0 is invalid"),
    ("scheduler", "warmup_cosine"): (lambda: [torch.optim.SGD(_param(), lr=0.1)],
                                     {"total_steps": 10, "min_lr_ratio": 2.0}, r"min_lr_ratio=2\.0 in \[0, 1\]"),
    ("scheduler", "constant"): None,  # constant(optimizer, total_steps): nothing to tune
    ("loss", "mask_agnostic"): (list, {"mask_id": 3, "pad_id": 0, "lam": -1.0}, r"lam=-1\.0 must be >= 0"),
    ("loss", "ce_both"): (list, {"mask_id": 3, "pad_id": 0, "k1": 20, "k_max": 16}, r"k_max=16 must be >= k1 \+ 1"),
    ("loss", "ce_many"): (list, {"mask_id": 3, "pad_id": 0, "k1": -1}, r"k1=-1 must be >= 0"),
    ("model", "hf_causal_lm"): (list, {"config": {"model_type": "llama"}, "dtype": "float8"},
                                r"model.dtype='float8' is invalid; valid: float32, bfloat16, float16"),
    ("model", "hf_masked_lm"): (list, {"config": {"model_type": "bert"}, "name_or_path": "x/y"},
                                r"give exactly one, a Hub id or a folder"),
    ("model", "transformer_lm"): (list, {"vocab_size": 10, "dim": 30, "heads": 4},
                                  r"dim=30 must be divisible by heads=4"),
    ("module", "mdlm"): (lambda: [_tiny_lm()], {"ema_decay": 1.5}, r"ema_decay=1\.5 must be in \[0, 1\)"),
    ("module", "causal_lm"): None,  # CausalLM(model, optimizer, scheduler): nothing to tune
    ("data", "byte_corpus"): (list, {"seq_len": 0}, r"seq_len=0 .*must be positive"),
    ("data", "text"): (list, {"source": "corpus.txt", "seq_len": 0}, r"data.seq_len=0 must be an integer >= 1"),
    ("data", "chat"): (list, {"source": "chats.jsonl", "train_on": "answers"},
                       r"data.train_on='answers'; valid: assistant, last, all"),
    ("data", "needle"): (list, {"n_symbols": 1}, r"n_symbols=1 must be >= 2"),
    ("data", "kv_recall"): (list, {"n_pairs": 0}, r"n_pairs=0 must be >= 1"),
    ("callback", "checkpoint"): (list, {"every_n_train_steps": -1}, r"every_n_train_steps=-1. Must be >= 0"),
    ("callback", "lr_monitor"): (list, {"logging_interval": "minute"}, r"logging_interval should be `step`"),
    ("callback", "early_stopping"): (list, {"mode": "maxx"}, r"`mode` can be min, max, got maxx"),
    ("callback", "hub_push"): (list, {"repo_id": "no spaces please"}, r"invalid Hub repo id 'no spaces please'"),
    ("callback", "mask_sweep"): (list, {"ms": [0, 4, -1]}, r"ms=\[0, 4, -1\] must be a non-empty list of mask "
                                                         r"counts >= 0"),
    ("sampler", "full"): None,  # FullPolicy(): nothing to tune
    ("sampler", "random"): (list, {"ratio": 1.5}, r"ratio=1\.5 must lie in \(0, 1\]"),
    ("sampler", "infobatch"): (list, {"prune_ratio": -0.1}, r"prune_ratio=-0\.1 must lie in \[0, 1\]"),
    ("sampler", "data_agent"): (list, {"variant": "improved"}, r"variant='improved'; valid: 'faithful', 'ranked'"),
    ("sampler", "eps_greedy"): (list, {"eps": 2.0}, r"eps=2\.0 must lie in \[0, 1\]"),
    ("sampler", "ucb"): (list, {"c": -1.0}, r"c=-1\.0 must be >= 0"),
    ("sampler", "data_agent_staleness"): (list, {"staleness": -1.0}, r"staleness=-1\.0 must be a finite number"),
    ("sampler", "data_agent_amortised"): (list, {"learn_every": 0}, r"learn_every=0 must be >= 1 epoch"),
    ("model", "mlp"): (list, {"input_shape": [64], "num_classes": 10, "depth": 0}, r"depth=0 and hidden=256 must"),
    ("model", "convnet"): (list, {"input_shape": [64], "num_classes": 10}, r"ConvNet needs image inputs .*\[64\]"),
    ("module", "classifier"): (lambda: [torch.nn.Linear(2, 2)], {"num_classes": 1}, r"num_classes=1 must be >= 2"),
    ("data", "digits"): (list, {"label_noise": 1.5}, r"label_noise=1\.5 must lie in \[0, 1\)"),
    ("data", "synth_classes"): (list, {"n_informative": 2}, r"n_informative=2 must be <= n_features=64 and give"),
    ("data", "digits_upsampled"): (list, {"size": 4}, r"size=4 must be an integer >= 8"),
    ("callback", "data_selection"): (list, {"num_epochs": 0}, r"num_epochs=0 must be >= 1"),
    # GICDM (issue 5)
    ("metric", "gicdm"): (list, {"correction": "icmd"}, r"correction='icmd' is not one of 'none', 'icdm', "
                                                        r"'gicdm_reconstructed'"),
    ("data", "hubness_sweep"): (list, {"n": 0}, r"n=0 must be >= 16"),
    ("module", "metric_eval"): (list, {"corrections": ["raw"]}, r"corrections=\['raw'\] must be non-empty, from "
                                                                  r"none, icdm, gicdm"),
    # RLKV (issue 7)
    ("data", "pointer_chase"): (list, {"hops": 0}, r"hops=0 must be >= 1"),
    ("module", "rlkv"): (lambda: [_tiny_causal_lm], {"group_size": 0}, r"group_size=0 must"),
    ("module", "duo_attention"): (lambda: [_tiny_causal_lm], {"reg_weight": -1.0}, r"reg_weight=-1\.0 must"),
    ("module", "random_heads"): (lambda: [_tiny_causal_lm], {"sink": -1}, r"sink=-1, recent=4\) needs sink >= 0"),
    # MoE growth (issue 8)
    ("model", "moe_transformer"): (list, {"vocab_size": 10, "dim": 32, "heads": 2, "num_experts": 4, "top_k": 5},
                                   r"top_k=5 must be between 1 and num_experts=4"),
    ("callback", "orthogonal_growth"): (list, {"depth_factor": 0}, r"depth_factor=0 must be an integer >= 1"),
    ("strategy", "fsdp2"): (list, {"tensor_parallel_size": 2}, r"tensor_parallel_size=2: .* valid: 1"),
    # your own images (issue 45)
    ("model", "timm"): (list, {"name": "resnet181", "num_classes": 10, "input_shape": [3, 32, 32]},
                        r"model.name=resnet181: timm [\d.]+ has no such model\. Did you mean 'resnet18'"),
    ("data", "images"): (list, {"source": "photos", "val_fraction": 1.5},
                         r"data.val_fraction=1\.5 must be in \(0, 1\)"),
    # fine-tuning at size (issue 52); qlora's refusal without CUDA: tests/models/test_peft_adapters.py
    ("peft", "lora"): (list, {"r": 0}, r"peft.r=0 must be a positive integer"),
    ("peft", "qlora"): (list, {"quant_type": "int3"}, r"peft.quant_type='int3' is invalid; valid: nf4, fp4"),
}


def _all_components() -> list[tuple[str, str]]:
    return [(kind, name) for kind, reg in KINDS.items() if kind != "recipe" for name in reg.names()]


def test_every_registered_component_has_an_out_of_range_case():
    missing = [f"{k}/{n}" for k, n in _all_components() if (k, n) not in BAD]
    assert missing == [], f"add a bad-value case to BAD for: {missing}"


@pytest.mark.parametrize(("kind", "name"), [key for key, case in BAD.items() if case is not None
                                            and key[1] in KINDS[key[0]]])
def test_out_of_range_value_is_refused_naming_the_value(kind, name):
    args, kwargs, pattern = BAD[(kind, name)]
    with pytest.raises((ValueError, TypeError, Exception), match=pattern) as err:
        built = KINDS[kind].build(name, *args(), **kwargs)
        if isinstance(built, functools.partial):  # partial kinds complete at build time in a run
            built()
    assert not isinstance(err.value, (AssertionError, KeyError, AttributeError)), repr(err.value)


# -- empty or too-short datasets: refused when the data are built, naming the size and what it must be -----------
@pytest.mark.parametrize(
    ("name", "kwargs", "pattern"),
    [
        ("needle", {"n_train": 0}, r"n_train=0 must be >= 1"),
        ("kv_recall", {"n_val": 0}, r"n_val=0 must be >= 1"),
        ("pointer_chase", {"n_train": 0, "n_val": 0}, r"n_train=0, n_val=0 must be >= 1"),
        ("needle", {"n_train": 4, "batch_size": 64},
         r"dataset of 4 samples is too short for 1 rank\(s\) × batch_size 64"),
        ("byte_corpus", {"max_bytes": 50, "seq_len": 128}, r"corpus split of \d+ bytes is shorter than seq_len\+1=129"),
        ("synth_classes", {"n_samples": 5}, r"dataset of \d samples is too short for 1 rank\(s\) × batch_size 128"),
        ("digits", {"batch_size": 100_000}, r"dataset of \d+ samples is too short for 1 rank\(s\) × batch_size 100000"),
    ],
)
def test_an_empty_or_too_short_dataset_is_refused_with_its_size(name, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        data = KINDS["data"].build(name, **{"seed": 0, **kwargs})
        data.setup("fit")
        data.train_dataloader()


# -- out-of-range values on the command line: one error line, exit code 2, before anything is written --------------
_NO_GPU = not torch.cuda.is_available()
OUT_OF_RANGE = [  # (override, what the one error line must say: the setting, its value, what is valid)
    ("model.dim=-8", r"model 'transformer_lm': dim=-8 must be a positive integer"),
    ("data.batch_size=0", r"data 'byte_corpus': batch_size=0 must be positive \(an integer >= 1\)"),
    ("model.heads=3", r"model 'transformer_lm': dim=128 must be divisible by heads=3"),
    ("model.kv_heads=3", r"model 'transformer_lm': kv_heads=3 must divide heads=4 \(1 <= kv_heads <= heads\)"),
    ("model.dropout=1.0", r"model 'transformer_lm': mlp_ratio=4\.0 must be > 0 and dropout=1\.0 in \[0, 1\)"),
    ("data.val_fraction=1.5", r"data 'byte_corpus': val_fraction=1\.5 must be in \(0, 1\)"),
    ("data.seq_len=4096", r"data\.seq_len=4096 is longer than model\.max_seq_len=1024, .* set data\.seq_len <= 1024"),
    ("data.max_bytes=0", r"data 'byte_corpus': max_bytes=0 must be >= 1, or null for the whole corpus"),
    ("trainer.devices=0", r"trainer\.devices=0 must be >= 1, or -1 / 'auto'"),
    ("trainer.max_steps=-5", r"trainer\.max_steps=-5 must be an integer >= 1 \(0 trains nothing\), or -1 for no limit"),
    ("optimizer.lr=nan", r"optimizer\.lr=nan is not a number; give a finite value"),
    ("optimizer.lr=-0.1", r"optimizer 'adamw': Invalid learning rate: -0\.1"),
    ("seed=abc", r"seed='abc' must be an integer in \[0, 2\*\*32 - 1\]"),
    ("seed=-1", r"seed=-1 must be an integer in \[0, 2\*\*32 - 1\]"),
    ("trainer.accelerator=gpu" if _NO_GPU else "trainer.accelerator=mps",  # mps: never on a CUDA (Linux) machine
     r"trainer\.accelerator='(gpu|mps)' is not available on this machine; available: auto, cpu"),
    ("trainer.strategy=dpp", r"trainer: You selected an invalid strategy name: `strategy='dpp'`"),
    ("scheduler.min_lr_ratio=2", r"scheduler 'warmup_cosine': .*min_lr_ratio=2\.0 in \[0, 1\]"),
    ("callbacks.checkpoint.every_n_train_steps=-1", r"callbacks\.checkpoint: .*every_n_train_steps=-1\. Must be >= 0"),
    ("callbacks.checkpoint.save_top_k=-2", r"callbacks\.checkpoint: Invalid value for save_top_k=-2\. Must be >= -1"),
    ("guard.every_n_steps=0", r"guard: every_n_steps=0 must be an integer >= 1 \(optimizer steps between checks"),
    ("guard.divergence=0", r"guard: divergence=0\.0 must be > 0"),
    ("metric=gicdm", r"metric=gicdm: module 'causal_lm' takes no metric, .* modules that evaluate one: metric_eval"),
    ("ckpt_path=nowhere/last.ckpt", r"ckpt_path=nowhere/last\.ckpt: checkpoint nowhere/last\.ckpt does not exist"),
    ("hub.repo_id=no-namespace", r"hub\.repo_id=no-namespace: invalid Hub repo id 'no-namespace'"),
    ("init_from=nowhere/last.ckpt", r"init_from=nowhere/last\.ckpt: no such checkpoint file"),
    # issue 25: values that got past the preflight, then failed or were silently ignored
    ("trainer.accumulate_grad_batches=0", r"trainer\.accumulate_grad_batches=0 must be an integer >= 1"),
    ("trainer.max_steps=0", r"trainer\.max_steps=0 must be an integer >= 1 \(0 trains nothing\), or -1"),
    ("trainer.gradient_clip_val=-1", r"trainer\.gradient_clip_val=-1 must be a number >= 0, or null"),
    ("trainer.val_check_interval=0", r"trainer\.val_check_interval=0 must be > 0"),
    ("trainer.log_every_n_steps=0", r"trainer\.log_every_n_steps=0 must be an integer >= 1"),
    ("+foo=1", r"\+foo=\.\.\.: nothing reads the setting 'foo', so it would be ignored; the run reads: callbacks,"),
    ("optimizer.lr=abc", r"optimizer\.lr='abc' is not a number: AdamW takes lr: float"),
    ("ckpt_path=/etc/passwd", r"ckpt_path=/etc/passwd: /etc/passwd is not a checkpoint: it was not written by "
                              r"torch\.save"),
]


def _refused(args: list[str], capsys) -> str:
    """Run the CLI's checks on `args` in this process (what `main()` does before Hydra); the one stderr line."""
    with pytest.raises(SystemExit) as exit_:
        report_and_exit(check_command_line, args)  # what `main()` does before Hydra
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize(("override", "expected"), OUT_OF_RANGE, ids=[o for o, _ in OUT_OF_RANGE])
def test_an_out_of_range_value_stops_the_cli_before_anything_is_written(override, expected, tmp_path, capsys):
    run_dir = tmp_path / "run"
    line = _refused(["recipe=char_lm", override, f"hydra.run.dir={run_dir}"], capsys)
    assert re.fullmatch(f"error: {expected}.*", line), line
    assert not run_dir.exists()


@pytest.mark.parametrize("where", ["under_a_file", "read_only"])
def test_a_run_dir_that_cannot_be_created_is_refused_naming_why(where, tmp_path, capsys):
    if where == "under_a_file":
        (tmp_path / "file").write_text("x")
        run_dir, why = tmp_path / "file" / "run", f"{tmp_path / 'file'} is a file, not a directory"
    else:  # mode bits stop everyone but root; /sys refuses even root
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        run_dir = (locked if os.geteuid() else Path("/sys")) / "sub" / "run"
        why = f"{run_dir.parents[1]} is not writable"
    line = _refused(["recipe=char_lm", f"hydra.run.dir={run_dir}"], capsys)
    assert line.startswith(f"error: hydra.run.dir={run_dir} cannot be created: {why}"), line
    assert not run_dir.exists()


def test_every_job_of_a_sweep_is_checked_before_hydra_starts(tmp_path, capsys):
    line = _refused(["-m", "recipe=char_lm", "optimizer=adamw,sgd", "optimizer.lr=-1",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys)
    assert line == "error: optimizer 'adamw': Invalid learning rate: -1"
    (tmp_path / "file").write_text("x")
    line = _refused(["-m", "recipe=char_lm", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'file' / 'sweep'}"], capsys)
    assert line.startswith(f"error: hydra.sweep.dir={tmp_path / 'file' / 'sweep'} cannot be created")


# -- through the real CLI: nothing is lost, one error line, exit code 2 --------------------------------------
def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=timeout)


@pytest.mark.parametrize("case", ["value", "run_dir"])
def test_cli_refuses_out_of_range_input_with_one_line_and_exit_2_and_writes_nothing(case, tmp_path):
    (tmp_path / "file").write_text("x")
    run_dir = tmp_path / ("run" if case == "value" else "file/run")
    bad, expected = {
        "value": ("model.dim=-8", "error: model 'transformer_lm': dim=-8 must be a positive integer"),
        "run_dir": ("seed=1", f"error: hydra.run.dir={run_dir} cannot be created: {tmp_path / 'file'} is a file"),
    }[case]
    proc = _cli("recipe=char_lm", bad, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(expected), proc.stderr[-2000:]
    assert not run_dir.exists()


def test_cli_refuses_a_misspelt_key_with_one_line_and_exit_2(tmp_path):
    proc = _cli("recipe=char_lm", "trainer.max_stpes=5", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Unknown setting 'trainer.max_stpes'. Did you mean 'trainer.max_steps'")
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("damage", ["truncated", "other_model"])
def test_cli_refuses_a_bad_checkpoint_before_training_and_leaves_it_alone(tmp_path, damage):
    ckpt = tmp_path / "step000004.ckpt"
    if damage == "truncated":
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, ckpt)
        ckpt.write_bytes(ckpt.read_bytes()[:300])
        expected = r"error: ckpt_path=\S+: checkpoint .*step000004\.ckpt \(300 bytes\) is truncated or corrupt"
    else:
        torch.save({"state_dict": {"model.tok.weight": torch.zeros(7, 3)}, "global_step": 4}, ckpt)
        expected = (r"error: ckpt_path=\S+: checkpoint .*step000004\.ckpt was saved from a different model: "
                    r"\d+ parameters missing \(e\.g\. model\.\S+\); 1 unexpected \(e\.g\. model\.tok\.weight\)")
    before = ckpt.read_bytes()
    run_dir = tmp_path / "run"
    proc = _cli("recipe=char_lm", *SMOKE["char_lm"], f"ckpt_path={ckpt}", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert re.search(expected, proc.stderr.strip().splitlines()[-1]), proc.stderr[-2000:]
    assert ckpt.read_bytes() == before and not run_dir.exists()  # refused before Hydra wrote anything


def test_cli_ctrl_c_writes_a_checkpoint_prints_the_resume_command_and_it_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = ["recipe=char_lm", *SMOKE["char_lm"], f"trainer.max_steps={ENDLESS_STEPS}",
            "callbacks.checkpoint.every_n_train_steps=5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = warm_cli.popen("framework.train", [*args, f"hydra.run.dir={run_dir}"], env, REPO)
    wait_for_a_checkpoint(proc, run_dir)  # the signal always comes mid-run
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved["interrupted"] is True and 5 <= saved["global_step"] < ENDLESS_STEPS
    assert f"resume with: {saved['resume']}" in err
    assert torch.load(saved["checkpoint"], weights_only=True)["global_step"] == saved["global_step"]

    resume = saved["resume"].split()[3:]  # after `python -m framework.train`
    done = _cli(*[a for a in resume if not a.startswith("hydra.run.dir=")], "trainer.max_steps=" +
                str(saved["global_step"] + 2), f"hydra.run.dir={tmp_path / 'resumed'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "resumed" / "results.json").read_text())["global_step"] == saved["global_step"] + 2


def test_a_build_failure_that_is_no_refused_value_leaves_the_run_to_report_it(monkeypatch, tmp_path):
    import framework.assembly

    def meta_only_failure(*args, **kwargs):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    monkeypatch.setattr(framework.assembly, "assemble", meta_only_failure)
    preflight(["recipe=char_lm", f"hydra.run.dir={tmp_path / 'run'}"])  # no error: the real run builds for real
    with pytest.raises(InputError):  # while refused values are still refused before it
        check_command_line(["recipe=char_lm", "seed=abc", f"hydra.run.dir={tmp_path / 'run'}"])


@pytest.mark.parametrize(("override", "expected"), [
    ("module.k=0", r"module 'metric_eval': k=0 must be an integer >= 1 .*"),
    ("module.k=100000", r"module 'metric_eval': k=100000 must be smaller than the smallest evaluation set, (\d+) "
                        r"points .*use k <= \d+"),
])
def test_a_neighbourhood_size_is_checked_against_the_evaluation_sets_real_sizes(override, expected, tmp_path, capsys):
    run_dir = tmp_path / "run"
    line = _refused(["recipe=gicdm_eval", override, f"hydra.run.dir={run_dir}"], capsys)
    assert re.fullmatch(f"error: {expected}", line), line
    assert not run_dir.exists()


# -- the environment, the override grammar, an empty metrics input: one line, exit 2, nothing written ----------
@pytest.mark.parametrize(("env", "words", "expected"), [
    ({"FRAMEWORK_NS_DTYPE": "fp16"}, [],
     "error: FRAMEWORK_NS_DTYPE='fp16' is invalid: valid: bfloat16, float32 (or unset: measured per device)"),
    ({"FRAMEWORK_SMOKE": "yes"}, [],
     "error: FRAMEWORK_SMOKE='yes' is not a valid value: valid: 0, 1 (1 runs the command at size=smoke), or unset"),
    ({}, ["hydra.run.dir={tmp}/my", "runs/a"],  # `hydra.run.dir=/tmp/my runs/a`, typed without quotes
     "error: cannot parse the override 'runs/a' (missing EQUAL at '<EOF>'): a value with a space must reach the"
     " program as one word: quote it, e.g. 'hydra.run.dir={tmp}/my runs/a'"),
], ids=["ns_dtype", "smoke", "unquoted_space"])
def test_a_bad_environment_variable_or_an_unparsable_override_is_one_line_exit_2_and_no_run_dir(
        env, words, expected, tmp_path):
    args = [w.format(tmp=tmp_path) for w in words] or [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_cli("recipe=char_lm", *SMOKE["char_lm"], *args, env=env, timeout=300)  # a real process per run
    assert proc.returncode == 2 and proc.stderr.strip() == expected.format(tmp=tmp_path), proc.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # no run dir, not even the part before the space


def test_metrics_on_an_empty_feature_set_names_the_sizes_and_what_k_needs(tmp_path):
    import numpy as np

    np.save(tmp_path / "real.npy", np.zeros((0, 4), dtype=np.float32))
    np.save(tmp_path / "fake.npy", np.ones((20, 4), dtype=np.float32))
    proc = subprocess.run([sys.executable, "-m", "framework.metrics", str(tmp_path / "real.npy"),
                           str(tmp_path / "fake.npy")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-3000:]
    assert proc.stderr.strip() == ("error: k=5 needs at least 6 real and 6 fake points; got 0 real and 20 fake (a set"
                                   " of fewer than 2 points has no neighbours)")


@pytest.mark.parametrize(("argv", "overrides"), [
    (["recipe=char_lm", "--cfg", "job", "seed=1"], ["recipe=char_lm", "seed=1"]),
    (["-cn", "train", "-m", "a=1,2", "--info", "defaults", "b=2"], ["a=1,2", "b=2"]),
    (["--info", "c=3"], ["c=3"]),
])
def test_the_override_check_reads_the_words_hydra_reads_as_overrides(argv, overrides):
    from framework.cli import overrides_of

    assert overrides_of(argv) == overrides


# -- the tests on the module's local Hub last: its fixture points this process's environment at that Hub for the
# rest of the module, and a CLI run started in another environment needs a warm server of its own
def test_every_recipe_passes_the_preflight_at_its_default_and_smoke_size(tmp_path, hub):
    from support.stand_ins import serve_chat

    serve_chat(hub.api)  # recipe=sft's default model and data are Hub ids: their stand-ins
    for name in KINDS["recipe"].names():
        for extra in ([], SMOKE.get(name, [])):
            preflight([f"recipe={name}", *extra, f"hydra.run.dir={tmp_path / name}"])
    assert not any(tmp_path.iterdir())


def test_init_from_a_repo_the_hub_lacks_is_refused_at_once(hub, tmp_path, capsys):
    start = time.perf_counter()
    line = _refused(["recipe=char_lm", "init_from=local-user/no-such-model", f"hydra.run.dir={tmp_path}/run"], capsys)
    assert time.perf_counter() - start < 10  # one request, no retries
    assert line == (f"error: init_from=local-user/no-such-model: no such local run dir or .ckpt file, and the Hub at "
                    f"{hub.url} has no model repo 'local-user/no-such-model' (push one with hub.repo_id=... or "
                    "`python -m framework.hub push`)")
    assert not (tmp_path / "run").exists()
