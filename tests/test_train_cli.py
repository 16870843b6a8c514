"""The real CLI, as a user runs it: recipes, typos, --cfg job, --help, sweeps, DDP and exact resume."""

import json
import re

import pytest
import torch
from helpers import assert_resume_is_exact

from framework.cli import check_choices
from framework.registry import UnknownNameError

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


def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(cli, tmp_path):
    # a 1.8 kB corpus: ~6 batches per epoch, so the run crosses epoch boundaries and step 7 is mid-epoch
    common = ["recipe=char_lm", *TINY_MODEL, "threads=1", "trainer.enable_progress_bar=false",
              "data.max_bytes=1800", "trainer.max_steps=12", "trainer.val_check_interval=null",
              "trainer.check_val_every_n_epoch=1", "trainer.limit_val_batches=1", "scheduler.warmup_steps=3"]
    assert_resume_is_exact(cli, common, tmp_path, resume_step=7)


def test_progress_bar_on_request_is_rich_and_the_summary_says_where_things_are(cli, tmp_path):
    proc = cli("recipe=char_lm", *TINY, *TINY_MODEL, "trainer.enable_progress_bar=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "━" in proc.stdout  # rich's bar (rich is a dev dependency; without it Lightning's tqdm bar is used)
    assert f"results          {tmp_path}/results.json" in proc.stdout
    assert f"last checkpoint  {tmp_path}/checkpoints/last.ckpt" in proc.stdout
