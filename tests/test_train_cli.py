"""The real CLI, as a user runs it: recipes, typos, --cfg job, --help, sweeps, DDP and exact resume."""

import json
import re

import pytest
import torch

from framework.cli import check_choices
from framework.registry import RECIPES, UnknownNameError

# a few steps of a tiny model: proves the wiring, not the learning
TINY = [
    "threads=1",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.enable_progress_bar=false",
    "data.max_bytes=60000",
]
TINY_MODEL = ["model.dim=32", "model.depth=1", "model.heads=2", "data.seq_len=32", "data.batch_size=8"]


@pytest.mark.parametrize("name", RECIPES.names())
def test_every_recipe_runs_a_few_steps_through_the_cli(cli, tmp_path, name):
    proc = cli(f"recipe={name}", *TINY, *TINY_MODEL, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["recipe"] == name and results["global_step"] == 4
    assert (tmp_path / ".hydra" / "config.yaml").exists()
    assert (tmp_path / "csv" / "metrics.csv").exists()
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["recipe=char_llm"], "Unknown recipe 'char_llm'. Did you mean 'char_lm'"),
        (["recipe=char_lm", "optimizer=adamww"], "Unknown optimizer 'adamww'. Did you mean 'adamw'?"),
        (["-m", "optimizer=adamw,sgdd"], "Unknown optimizer 'sgdd'. Did you mean 'sgd'?"),
        (["callbacks=[checkpoint,lr_monitr]"], "Unknown callback 'lr_monitr'. Did you mean 'lr_monitor'?"),
    ],
)
def test_unknown_choices_are_caught_before_hydra_with_did_you_mean(args, expected):
    with pytest.raises(UnknownNameError, match=re.escape(expected)):
        check_choices(args)


def test_unknown_choice_exits_2_with_one_error_line_and_no_traceback(cli):
    proc = cli("recipe=char_lm", "optimizer=adamww", timeout=120)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Unknown optimizer 'adamww'. Did you mean 'adamw'? Valid optimizer names: ")
    assert "Traceback" not in proc.stderr


def test_known_choices_and_plain_values_pass_the_check():
    check_choices(["recipe=char_lm", "optimizer=sgd", "optimizer.lr=0.1", "+callbacks=lr_monitor", "seed=3"])


def test_cfg_job_prints_the_composed_config_with_command_line_choice_winning(cli):
    proc = cli("optimizer=sgd", "recipe=char_lm", "optimizer.lr=0.05", "--cfg", "job", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "_target_: torch.optim.sgd.SGD" in proc.stdout
    assert "lr: 0.05" in proc.stdout
    assert "seq_len: 128" in proc.stdout  # the recipe's value


def test_help_lists_groups_and_their_choices(cli):
    proc = cli("--help", timeout=120)
    assert proc.returncode == 0
    for line in ("optimizer: adamw", "recipe: char_lm"):
        assert any(row.startswith(line) for row in proc.stdout.splitlines()), proc.stdout


def test_multirun_sweeps_each_choice(cli, tmp_path):
    proc = cli(
        "-m",
        "recipe=char_lm",
        "optimizer=adamw,sgd",
        *TINY,
        *TINY_MODEL,
        "trainer.max_steps=2",
        "validate_before_fit=false",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = sorted(
        json.loads((tmp_path / str(i) / "results.json").read_text())["choices"]["optimizer"] for i in range(2)
    )
    assert got == ["adamw", "sgd"]


@pytest.mark.ddp
def test_two_process_ddp_run_finishes_and_ranks_agree_on_the_final_loss(cli, tmp_path):
    proc = cli(
        "recipe=char_lm",
        *TINY,
        *TINY_MODEL,
        "trainer.strategy=ddp",
        "trainer.devices=2",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = json.loads((tmp_path / "results.json").read_text())["metrics"]
    rank1 = json.loads((tmp_path / "results.rank1.json").read_text())["metrics"]
    assert rank0["val/loss"] == rank1["val/loss"]
    # DDP averages gradients, so both ranks hold the same weights: the checkpoint is one model
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


def _weights(ckpt):
    return torch.load(ckpt, weights_only=True, map_location="cpu")["state_dict"]


def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(cli, tmp_path):
    # 60 kB / (32+1)-byte windows = ~1700 chunks; batch 8 → ~200 batches/epoch; use a tiny corpus so the
    # run crosses epoch boundaries and the resume point (step 7) falls mid-epoch
    common = [
        "recipe=char_lm",
        *TINY_MODEL,
        "threads=1",
        "trainer.enable_progress_bar=false",
        "data.max_bytes=1800",
        "trainer.max_steps=12",
        "trainer.val_check_interval=null",
        "trainer.check_val_every_n_epoch=1",
        "trainer.limit_val_batches=1",
        "callbacks.checkpoint.every_n_train_steps=1",
        "scheduler.warmup_steps=3",
    ]
    full, part = tmp_path / "full", tmp_path / "resumed"
    proc = cli(*common, f"hydra.run.dir={full}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    mid = full / "checkpoints" / "step000007.ckpt"
    proc = cli(*common, f"ckpt_path={mid}", f"hydra.run.dir={part}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _weights(full / "checkpoints" / "last.ckpt"), _weights(part / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # and resuming did something: the weights moved since step 7
    assert not all(torch.equal(a[k], _weights(mid)[k]) for k in a)
