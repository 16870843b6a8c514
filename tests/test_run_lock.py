"""One run per run dir: a second run is refused in one line naming the holder, a dead run's lock is taken over,
and the processes of one run (its ranks, its nodes) are let in."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time

import pytest
from test_fault_injection import _finish, _start

from framework.recipe import SMOKE
from framework.run_lock import (
    LOCK_NAME,
    STALE_S,
    RunDirBusyError,
    acquire,
    join,
    launch_rank,
    release,
    run_dir_lock,
    run_identity,
)


def _lock(run_dir, **holder) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "run_id": "other", **holder}
    (run_dir / LOCK_NAME).write_text(json.dumps(record))


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_live_holder_is_refused_by_name_and_its_lock_is_left_alone(tmp_path):
    _lock(tmp_path)
    before = (tmp_path / LOCK_NAME).read_text()
    with pytest.raises(RunDirBusyError, match=rf"hydra\.run\.dir={re.escape(str(tmp_path))} is in use by another run "
                                              rf"\(host {re.escape(socket.gethostname())}, pid {os.getpid()}, started"):
        acquire(tmp_path, run_id="mine")
    assert (tmp_path / LOCK_NAME).read_text() == before


def test_a_dead_runs_lock_is_taken_over_on_this_host_and_by_heartbeat_from_another(tmp_path):
    _lock(tmp_path / "a", pid=_dead_pid())
    assert acquire(tmp_path / "a", run_id="mine") is True
    assert json.loads((tmp_path / "a" / LOCK_NAME).read_text())["run_id"] == "mine"

    _lock(tmp_path / "b", host="another-host", pid=1)  # a live heartbeat on another host: refused
    with pytest.raises(RunDirBusyError, match="host another-host, pid 1"):
        acquire(tmp_path / "b", run_id="mine")
    old = time.time() - STALE_S - 60
    os.utime(tmp_path / "b" / LOCK_NAME, (old, old))  # its heartbeat stopped: the host is gone
    assert acquire(tmp_path / "b", run_id="mine") is True
    release(tmp_path / "b", "mine")
    assert not (tmp_path / "b" / LOCK_NAME).exists()


def test_the_processes_of_one_run_share_its_lock_and_other_runs_are_kept_out(tmp_path, monkeypatch):
    for var in ("FRAMEWORK_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "RANK",
                "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with run_dir_lock(tmp_path) as run_id:
        assert os.environ["FRAMEWORK_RUN_ID"] == run_id  # what Lightning's DDP children inherit
        assert join(tmp_path, run_id=run_id, wait_s=1) is False  # a rank of this run gets in
        with pytest.raises(RunDirBusyError, match="not by this process's run"):
            join(tmp_path, run_id="another-run", wait_s=1)
    assert not (tmp_path / LOCK_NAME).exists() and "FRAMEWORK_RUN_ID" not in os.environ
    nodes = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert run_identity({**nodes, "NODE_RANK": "1"}) == run_identity({**nodes, "NODE_RANK": "0"})  # one run
    assert run_identity({"SLURM_JOB_ID": "42", "SLURM_PROCID": "3"}) == "slurm:42"
    assert launch_rank({"NODE_RANK": "1", "LOCAL_RANK": "0"}) == 1 and launch_rank({"SLURM_PROCID": "0"}) == 0


def test_two_runs_started_together_into_one_run_dir_one_runs_the_other_is_refused_touching_nothing(tmp_path):
    run_dir = tmp_path / "shared"
    args = ["recipe=char_lm", *SMOKE["char_lm"], "trainer.max_steps=30", f"hydra.run.dir={run_dir}"]
    procs = [_start(args), _start([*args, "seed=1"])]
    (code_a, err_a), (code_b, err_b) = (_finish(p) for p in procs)
    assert sorted([code_a, code_b]) == [0, 2], (err_a[-2000:], err_b[-2000:])
    refused = err_a if code_a == 2 else err_b
    lines = refused.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(rf"error: hydra\.run\.dir={re.escape(str(run_dir))} is in use by "
                                            r"another run \(host \S+, pid \d+, started .*", lines[0]), refused
    winner_seed = 0 if code_a == 0 else 1
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "finished" and results["global_step"] == 30
    assert ("seed=1" in results["command"]) == (winner_seed == 1)  # the record is the winner's alone
    rows = [r.split(",") for r in (run_dir / "csv" / "metrics.csv").read_text().splitlines()[1:]]
    loss_steps = [int(r[1]) for r in rows if r[2]]
    assert loss_steps == sorted(set(loss_steps)) and loss_steps  # one run's rows: no step logged twice
    assert not (run_dir / LOCK_NAME).exists()  # released when the run ended
