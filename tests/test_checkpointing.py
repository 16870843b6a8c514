"""Atomic checkpoint writes (a kill or a full disk never leaves a broken file) and checkpoint checks."""

from __future__ import annotations

import errno
import os
import signal
import time

import pytest
import torch

import framework.checkpointing as checkpointing
from framework.checkpointing import AtomicCheckpointIO, CheckpointError, check_checkpoint, load_checkpoint_file


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
        time.sleep(delay)
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
