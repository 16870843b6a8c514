"""Atomic checkpoint writes (a kill or a full disk never leaves a broken file, NaN/inf is never written), checkpoint
checks, and what a resume continues: the metrics file and, when the command line changes it, the learning rate."""

from __future__ import annotations

import errno
import functools
import os
import signal
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

import framework.checkpointing as checkpointing
from framework.checkpointing import AtomicCheckpointIO, CheckpointError, check_checkpoint, load_checkpoint_file
from framework.data.resumable import train_loader
from framework.modules.base import TrainModule
from framework.optim.schedulers import warmup_cosine


def _ckpt(value: float, n: int = 1000) -> dict:
    return {"state_dict": {"w": torch.full((n,), value), "b": torch.zeros(3)}, "global_step": int(value)}


def test_save_replaces_the_file_and_leaves_no_temporary(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "ck" / "last.ckpt"
    io.save_checkpoint(_ckpt(1.0), path)
    io.save_checkpoint(_ckpt(2.0), path)
    assert load_checkpoint_file(path)["global_step"] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_disk_full_while_saving_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(_ckpt(1.0), path)
    before = path.read_bytes()

    def full_disk(obj, f):  # a device that fills up halfway through the write
        f.write(b"PK\x03\x04partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing.torch, "save", full_disk)
    with pytest.raises(CheckpointError, match=r"no space left on the device while saving checkpoint .*last\.ckpt; "
                                              r"the previous last\.ckpt is intact"):
        io.save_checkpoint(_ckpt(2.0), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def _save_forever(path) -> None:
    torch.set_num_threads(1)
    io, i = AtomicCheckpointIO(), 0
    while True:
        i += 1
        io.save_checkpoint({"state_dict": {"w": torch.full((2_000_000,), float(i))}, "global_step": i}, path)


def test_sigkill_during_repeated_saves_never_leaves_a_corrupt_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    for delay in (0.3, 0.45, 0.7, 1.1):  # kill at different points of a save (each save takes tens of ms)
        pid = os.fork()
        if pid == 0:  # the child saves until it is killed; it never returns into pytest
            try:
                _save_forever(path)
            finally:
                os._exit(1)
        try:  # the first save complete, however slow the machine (AtomicCheckpointIO renames a finished file)
            deadline = time.time() + 60
            while not path.exists():
                assert time.time() < deadline, "the child wrote no checkpoint in 60 s"
                time.sleep(0.01)
            time.sleep(delay)  # then kill it at some point of a later save
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        ckpt = load_checkpoint_file(path)  # complete and readable, whichever save it is
        w = ckpt["state_dict"]["w"]
        assert ckpt["global_step"] >= 1 and torch.equal(w, torch.full_like(w, float(ckpt["global_step"])))


def test_truncated_checkpoint_is_named_as_corrupt(tmp_path):
    path = tmp_path / "step000004.ckpt"
    torch.save(_ckpt(3.0), path)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(CheckpointError, match=r"step000004\.ckpt \(500 bytes\) is truncated or corrupt"):
        load_checkpoint_file(path)


def test_missing_checkpoint_lists_the_ones_in_its_folder(tmp_path):
    torch.save(_ckpt(1.0), tmp_path / "step000002.ckpt")
    msg = r"step000003\.ckpt does not exist; that folder has \[.step000002\.ckpt.\]"
    with pytest.raises(CheckpointError, match=msg):
        load_checkpoint_file(tmp_path / "step000003.ckpt")


def test_checkpoint_from_a_different_model_is_refused_with_the_first_mismatch(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    other = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Linear(16, 2))
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": other.state_dict()}, path)
    with pytest.raises(CheckpointError, match=r"saved from a different model: 3 shape mismatches \(e\.g\. 0\.bias: "
                                              r"checkpoint \(16,\) vs model \(8,\)\)"):
        check_checkpoint(path, model)
    torch.save({"state_dict": model.state_dict()}, path)
    assert check_checkpoint(path, model)["state_dict"].keys() == model.state_dict().keys()


def test_a_file_that_is_not_a_lightning_checkpoint_is_refused(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match="is not a Lightning checkpoint"):
        load_checkpoint_file(path)


def test_a_checkpoint_with_nan_or_inf_weights_or_optimizer_state_is_never_written(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(_ckpt(1.0), path)
    before = path.read_bytes()
    bad = {**_ckpt(2.0), "optimizer_states": [{"state": {0: {"exp_avg_sq": torch.tensor([1.0, float("inf")])}}}]}
    with pytest.raises(CheckpointError, match=r"refusing to write checkpoint .*last\.ckpt: 1 of its 3 weight and "
                                              r"optimizer-state tensors hold NaN/inf \(e\.g\. optimizer_states\[0\]"
                                              r"/state/0/exp_avg_sq\); the previous last\.ckpt is intact"):
        io.save_checkpoint(bad, path)
    nan_weights = {**_ckpt(3.0), "state_dict": {"w": torch.full((4,), float("nan")), "b": torch.zeros(3)}}
    with pytest.raises(CheckpointError, match=r"1 of its 2 .* \(e\.g\. state_dict/w\)"):
        io.save_checkpoint(nan_weights, tmp_path / "step000002.ckpt")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    huge = {"state_dict": {"w": torch.full((1000,), 3e38)}, "global_step": 3}  # finite, though its sum overflows
    io.save_checkpoint(huge, path)
    assert torch.equal(load_checkpoint_file(path)["state_dict"]["w"], huge["state_dict"]["w"])
    AtomicCheckpointIO(allow_non_finite=True).save_checkpoint(bad, tmp_path / "debug.ckpt")  # opt-in, for debugging
    written = load_checkpoint_file(tmp_path / "debug.ckpt")["optimizer_states"][0]["state"][0]["exp_avg_sq"]
    assert torch.isinf(written).any()


def test_resuming_from_a_non_finite_checkpoint_is_refused_naming_a_finite_one(tmp_path):
    model = torch.nn.Linear(4, 2)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"state_dict": good, "global_step": 3}, tmp_path / "step000003.ckpt")
    poisoned = {**good, "weight": torch.full((2, 4), float("nan"))}
    torch.save({"state_dict": poisoned, "global_step": 4}, tmp_path / "last.ckpt")
    with pytest.raises(CheckpointError, match=r"last\.ckpt holds NaN/inf in 1 of its 2 weight and optimizer-state "
                                              r"tensors \(e\.g\. state_dict/weight\).*Resume from a finite checkpoint "
                                              r"in the same folder \(step000003\.ckpt\) with a lower learning rate"):
        check_checkpoint(tmp_path / "last.ckpt", model)
    assert check_checkpoint(tmp_path / "step000003.ckpt", model)["global_step"] == 3


def test_the_csv_logger_continues_a_resumed_run_s_metrics_file(tmp_path):
    from framework.checkpointing import ResumableCSVLogger

    first = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="")
    for step in range(8):  # the run before the kill, logging at steps 0..7
        first.log_metrics({"train/loss": 10.0 - step}, step=step)
    first.save()
    resumed = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="", resume_step=5)
    resumed.log_metrics({"train/loss": 4.5}, step=5)  # the resumed run logs steps 5.. again, plus a new column
    resumed.log_metrics({"train/loss": 3.5, "val/loss": 3.0}, step=6)
    resumed.save()
    text = (tmp_path / "csv" / "metrics.csv").read_text()
    assert text.count("step") == 1  # one header
    rows = [line.split(",") for line in text.strip().splitlines()]
    assert rows[0] == ["step", "train/loss", "val/loss"]
    assert [(r[0], r[1]) for r in rows[1:]] == [("0", "10.0"), ("1", "9.0"), ("2", "8.0"), ("3", "7.0"), ("4", "6.0"),
                                               ("5", "4.5"), ("6", "3.5")]
    assert rows[-1][2] == "3.0"
    fresh = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="")  # no resume: a new file, as before
    fresh.log_metrics({"train/loss": 1.0}, step=0)
    fresh.save()
    assert (tmp_path / "csv" / "metrics.csv").read_text().splitlines() == ["step,train/loss", "0,1.0"]


class _Tiny(TrainModule):
    """A linear regression through the framework's own configure_optimizers (factories, warm-up + cosine)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.model(x), y)

    def train_dataloader(self):
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return train_loader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, seed=0, trainer=self.trainer)


def _fit_recording_lr(root, lr: float, ckpt_path=None) -> tuple[list[float], _Tiny]:
    """Fit 10 steps at `lr` (a checkpoint every step); the lr each step trained with, and the module."""
    torch.manual_seed(0)
    module = _Tiny(torch.nn.Linear(4, 1), optimizer=functools.partial(torch.optim.AdamW, lr=lr),
                   scheduler=functools.partial(warmup_cosine, warmup_steps=3))
    lrs: list[float] = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    ckpt = ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1, filename="step{step:06d}",
                           auto_insert_metric_name=False)
    L.Trainer(max_steps=10, callbacks=[Record(), ckpt], plugins=[AtomicCheckpointIO()], logger=False,
              enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
              default_root_dir=root).fit(module, ckpt_path=ckpt_path)
    return lrs, module


def test_an_lr_given_on_resume_rebases_the_schedule_and_the_same_lr_resumes_bitwise(tmp_path, capsys):
    trained, full = _fit_recording_lr(tmp_path / "a", lr=1e-2)
    fresh_at_new_lr, _ = _fit_recording_lr(tmp_path / "b", lr=1e-3)
    mid = tmp_path / "a" / "step000004.ckpt"

    resumed, _ = _fit_recording_lr(tmp_path / "c", lr=1e-3, ckpt_path=mid)
    assert resumed == pytest.approx(fresh_at_new_lr[4:], rel=1e-12)  # schedule(step) at the new lr ...
    assert resumed == pytest.approx([x * 1e-3 / 1e-2 for x in trained[4:]], rel=1e-12)  # = the old one · new/old
    assert resumed[0] != trained[4]
    assert "resuming with lr 0.001 instead of the checkpoint's 0.01 (1 parameter group(s))" in capsys.readouterr().err

    same, module = _fit_recording_lr(tmp_path / "d", lr=1e-2, ckpt_path=mid)  # plain resume: nothing re-based
    assert same == trained[4:]
    assert all(torch.equal(a, b) for a, b in zip(full.parameters(), module.parameters(), strict=True))
    assert "resuming with lr" not in capsys.readouterr().err


def _steps(folder) -> dict[str, int]:
    return {p.name: torch.load(p, map_location="cpu", weights_only=True)["global_step"] for p in folder.glob("*.ckpt")}


def test_the_checkpoint_callback_keeps_the_newest_three_steps_and_auto_resume_continues_from_them(cli, tmp_path):
    """`callbacks.checkpoint.save_top_k` (default 3, -1 keeps all) bounds the step checkpoints a long run leaves;
    `last.ckpt` is always kept, and the same command with `ckpt_path=auto` resumes from the newest."""
    import json

    from framework.recipe import SMOKE

    args = ["recipe=char_lm", *SMOKE["char_lm"], "trainer.val_check_interval=null", "trainer.limit_val_batches=0",
            "validate_before_fit=false", "callbacks.checkpoint.every_n_train_steps=1", "ckpt_path=auto",
            f"hydra.run.dir={tmp_path}"]
    proc = cli(*args, "trainer.max_steps=5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _steps(tmp_path / "checkpoints") == {"last.ckpt": 5, "step000003.ckpt": 3, "step000004.ckpt": 4,
                                                "step000005.ckpt": 5}
    proc = cli(*args, "trainer.max_steps=7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["resumed_from"] == str(tmp_path / "checkpoints" / "last.ckpt") and results["global_step"] == 7
    assert _steps(tmp_path / "checkpoints") == {"last.ckpt": 7, "step000005.ckpt": 5, "step000006.ckpt": 6,
                                                "step000007.ckpt": 7}
