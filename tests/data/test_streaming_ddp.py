"""`data.streaming=true` under two-process DDP (gloo, CPU) through the real CLI: each rank reads its own rows, the
two read the whole training split every epoch, and both take the same number of steps however uneven the files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import KILL, finish, start_cli, train_state
from helpers import assert_same_state as assert_same
from support.batch_log import corpus

DDP = ["trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]
TINY = ["recipe=char_lm", "data=text", "data.streaming=true", "data.seq_len=32", "data.batch_size=4", "model.dim=16",
        "model.depth=1", "model.heads=2", "trainer.limit_val_batches=1", "trainer.val_check_interval=null",
        "trainer.check_val_every_n_epoch=1", "threads=1", "+callbacks.batches._target_=support.batch_log.BatchLog"]


def _logs(path: Path) -> list[list[dict]]:
    return [[json.loads(line) for line in p.read_text().splitlines()]
            for p in (path, path.with_suffix(".rank1.jsonl"))]


def _documents(steps: list[dict], epoch: int) -> list[str]:
    """The whole documents a rank read in `epoch`: its rows' bytes in order, cut after each '#' (the last piece, a
    document the epoch ended inside of, left out)."""
    text = bytes(t for step in steps if step["epoch"] == epoch for row in step["rows"] for t in row).decode()
    return [doc + "#" for doc in text.split("#")[:-1]]


def _run(tmp_path: Path, sizes: dict[str, int], steps: int) -> tuple[list[list[dict]], str, set[str]]:
    source = corpus(tmp_path / "c", {**sizes, "validation": 3})
    proc = start_cli([*TINY, *DDP, f"data.source={source}", f"data.cache_dir={tmp_path / 'cache'}",
                      f"trainer.max_steps={steps}", f"+callbacks.batches.path={tmp_path / 'b.jsonl'}",
                      "+callbacks.batches.tokens=true", f"hydra.run.dir={tmp_path / 'run'}"])
    code, err = finish(proc, timeout=300)
    assert code == 0, err[-3000:]  # finishing at all: no rank waited for the other at an epoch's end
    log = "".join(p.read_text() for p in (tmp_path / "run").glob("*.log"))
    docs = {json.loads(line)["text"] for name in sizes for line in (source / f"{name}.jsonl").open()}
    return _logs(tmp_path / "b.jsonl"), log, docs


@pytest.mark.slow  # 18 s of two processes; make test streams on one rank with the same equal-steps vote
@pytest.mark.ddp  # (tests/data/test_streaming.py) and runs DDP through the CLI (tests/test_readme_commands.py)
@pytest.mark.parametrize("sizes", [{"train-0": 2, "train-1": 30, "train-2": 5, "train-3": 1},  # whole files per rank
                                   pytest.param({"train-0": 2, "train-1": 30, "train-2": 6},  # 1 row in 2 each
                                                marks=pytest.mark.slow)])
def test_two_ranks_read_disjoint_rows_the_whole_split_each_epoch_in_equal_steps(tmp_path, sizes):
    (rank0, rank1), log, docs = _run(tmp_path, sizes, steps=30)
    assert [s["step"] for s in rank0] == [s["step"] for s in rank1] == list(range(30))
    assert [s["epoch"] for s in rank0] == [s["epoch"] for s in rank1]  # every epoch ends at the same step
    assert rank0[-1]["epoch"] >= 2
    for epoch in range(rank0[-1]["epoch"]):  # the epochs the run finished
        mine, theirs = set(_documents(rank0, epoch)), set(_documents(rank1, epoch))
        assert not mine & theirs and mine | theirs == docs, epoch
        assert not set(rank0[0]["index"]) & set(rank1[0]["index"])
    repeats = [int(n) for n in re.findall(r"epoch 0 on rank \d: \d+ steps, \d+ rows, (\d+) of them repeats", log)]
    assert len(repeats) == 2 and max(repeats) > 0  # the shorter share was started again, and it was counted


@pytest.mark.slow
@pytest.mark.ddp
def test_two_ranks_killed_mid_epoch_resume_to_the_same_batches_and_weights(tmp_path):
    source = corpus(tmp_path / "c", {"train-0": 4, "train-1": 30, "train-2": 9, "train-3": 2, "validation": 3})
    args = [*TINY, *DDP, f"data.source={source}", f"data.cache_dir={tmp_path / 'cache'}", "trainer.max_steps=14",
            "callbacks.checkpoint.every_n_train_steps=1"]
    runs = {name: tmp_path / name for name in ("full", "cut", "resumed")}
    code, err = finish(start_cli([*args, f"+callbacks.batches.path={runs['full']}.jsonl",
                                  f"hydra.run.dir={runs['full']}"]), timeout=300)
    assert code == 0, err[-3000:]
    kcode, kerr = finish(start_cli([*args, *KILL, "+callbacks.kill.step=9", f"+callbacks.batches.path="
                                    f"{runs['cut']}.jsonl", f"hydra.run.dir={runs['cut']}"]), timeout=300)
    assert kcode != 0 and train_state(runs["cut"] / "checkpoints" / "last.ckpt")["global_step"] == 9, kerr[-3000:]
    code, err = finish(start_cli([*args, f"ckpt_path={runs['cut'] / 'checkpoints' / 'last.ckpt'}",
                                  f"+callbacks.batches.path={runs['resumed']}.jsonl",
                                  f"hydra.run.dir={runs['resumed']}"]), timeout=300)
    assert code == 0, err[-3000:]
    for want, got in zip(_logs(tmp_path / "full.jsonl"), _logs(tmp_path / "resumed.jsonl"), strict=True):
        assert [s["step"] for s in got] == list(range(9, 14)) and got == want[9:]
    assert_same(train_state(runs["full"] / "checkpoints" / "last.ckpt"),
                train_state(runs["resumed"] / "checkpoints" / "last.ckpt"))
    assert torch.load(runs["full"] / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] >= 1


@pytest.mark.slow
@pytest.mark.ddp
def test_uneven_files_are_shared_by_rows_so_repeats_stay_small_and_every_rank_is_counted(tmp_path):
    """Four files of [600, 30, 300, 20] documents on two ranks: whole files would give rank 1 fifty documents to
    repeat for most of an epoch; shared by rows, each rank repeats at most one batch and 5 % of its rows (the ranks'
    documents differ in length), and results.json counts both ranks."""
    sizes = {"train-0": 600, "train-1": 30, "train-2": 300, "train-3": 20}
    steps = 200
    (rank0, rank1), log, docs = _run(tmp_path, sizes, steps=steps)
    assert rank0[-1]["epoch"] >= 1
    mine, theirs = set(_documents(rank0, 0)), set(_documents(rank1, 0))
    assert not mine & theirs and mine | theirs == docs
    counts = [tuple(map(int, m)) for m in re.findall(r"epoch 0 on rank \d: \d+ steps, (\d+) rows, (\d+) of them "
                                                     r"repeats", log)]
    assert len(counts) == 2 and all(repeated <= 4 + 0.05 * rows for rows, repeated in counts), counts
    data = json.loads((tmp_path / "run" / "results.json").read_text())["data"]
    assert len(data["ranks"]) == 2 and data["rows_read"] == sum(r["rows_read"] for r in data["ranks"]) == 2 * 4 * steps
    assert data["repeated_rows"] == sum(r["repeated_rows"] for r in data["ranks"])
