"""One run per run dir: a second run is refused in one line naming the holder, a dead run's lock is taken over,
and the processes of one run (its ranks, its nodes) are let in."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest
from test_fault_injection import _finish, _start

from framework.recipe import SMOKE
from framework.resume import RunDirOccupiedError, check_start
from framework.run_lock import (
    LOCK_NAME,
    STALE_S,
    RunDirBusyError,
    acquire,
    join,
    launch_rank,
    read_holder,
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


def _snapshot(run_dir) -> dict[str, bytes]:
    """Every file of a run dir with its bytes (the lock excluded)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    return lines[0]


def _holds_a_run(run_dir) -> str:
    return (rf"error: hydra\.run\.dir={re.escape(str(run_dir))} already holds a run \(results\.json \(finished run\),"
            r" \d+ checkpoints?, csv/metrics\.csv\); nothing was written\. To continue it: ckpt_path=auto; to start"
            r" anew: another hydra\.run\.dir=\.\.\.")


def _busy(run_dir) -> str:
    return rf"error: hydra\.run\.dir={re.escape(str(run_dir))} is in use by another run \(host \S+, pid \d+, started .*"


def test_a_run_started_while_another_holds_the_dir_is_refused_and_the_holder_finishes_untouched(tmp_path):
    """Deterministic order: the first run is stopped (SIGSTOP) while it holds the lock, so the second meets a live
    holder whatever the machine's speed; then the first goes on and finishes."""
    run_dir = tmp_path / "shared"
    args = ["recipe=char_lm", *SMOKE["char_lm"], "trainer.max_steps=12", f"hydra.run.dir={run_dir}"]
    first = _start(args)
    deadline = time.time() + 120
    while (holder := read_holder(run_dir / LOCK_NAME)) is None or holder.get("pid") != first.pid:
        assert first.poll() is None and time.time() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        code, err = _finish(_start([*args, "seed=1"]))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert code == 2 and re.fullmatch(_busy(run_dir), _one_error_line(err)), err[-3000:]
    code, err = _finish(first)
    assert code == 0, err[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 12 and "seed=1" not in results["command"]
    assert not (run_dir / LOCK_NAME).exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished smoke run with checkpoints at steps 2, 4, 6 and last.ckpt (= step 6)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    code, err = _finish(_start(_every_two_steps(run_dir, 6)))
    assert code == 0, err[-3000:]
    return run_dir


def _every_two_steps(run_dir, steps: int, *extra: str) -> list[str]:
    return ["recipe=char_lm", *SMOKE["char_lm"], f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}",
            "callbacks.checkpoint.every_n_train_steps=2", "callbacks.checkpoint.save_top_k=-1", *extra]


def _copy(run_dir, tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(run_dir, dest)
    return dest


def test_a_fresh_start_into_a_finished_run_is_refused_and_leaves_every_file_as_it_was(finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    before = _snapshot(run_dir)
    code, err = _finish(_start(_every_two_steps(run_dir, 6, "seed=1")))
    assert code == 2 and re.fullmatch(_holds_a_run(run_dir), _one_error_line(err)), err[-3000:]
    assert _snapshot(run_dir) == before and not (run_dir / LOCK_NAME).exists()


def test_ckpt_path_auto_skips_damaged_checkpoints_naming_them_and_resumes_from_the_newest_good_one(
        finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    for name in ("last.ckpt", "step000006.ckpt"):  # the two newest: truncated, as a kill mid-copy would leave them
        ckpt = run_dir / "checkpoints" / name
        ckpt.write_bytes(ckpt.read_bytes()[:500])
    code, err = _finish(_start(_every_two_steps(run_dir, 8, "ckpt_path=auto")))
    assert code == 0, err[-3000:]
    notes = [line for line in err.splitlines() if line.startswith("note: ckpt_path=auto skips")]
    assert sorted(notes) == [f"note: ckpt_path=auto skips checkpoints/{name}: it cannot be read (truncated, corrupt,"
                             " or not a torch checkpoint)" for name in ("last.ckpt", "step000006.ckpt")]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["resumed_from"] == str(run_dir / "checkpoints" / "step000004.ckpt") and results["global_step"] == 8


def test_ckpt_path_auto_with_no_good_checkpoint_is_refused_and_the_files_are_left_as_they_are(finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    for ckpt in (run_dir / "checkpoints").glob("*.ckpt"):
        ckpt.write_bytes(ckpt.read_bytes()[:500])
    before = _snapshot(run_dir)
    code, err = _finish(_start(_every_two_steps(run_dir, 8, "ckpt_path=auto")))
    line = _one_error_line(err)
    assert code == 2 and line.startswith(f"error: ckpt_path=auto: no checkpoint in {run_dir} can be resumed from ("
                                         "checkpoints/last.ckpt cannot be read"), err[-3000:]
    assert line.count("cannot be read") == 4 and "the files were left as they are" in line
    assert _snapshot(run_dir) == before


def test_ckpt_path_auto_in_a_dir_with_only_a_killed_runs_metrics_starts_afresh(finished_run, tmp_path):
    """A run killed before its first checkpoint left metrics and nothing to continue: auto starts anew there
    (what a scheduler's requeue needs); without auto the same dir is refused."""
    run_dir = _copy(finished_run, tmp_path)
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "results.json").unlink()
    assert check_start(run_dir, "auto") is None
    with pytest.raises(RunDirOccupiedError, match=r"already holds a run \(csv/metrics\.csv\)"):
        check_start(run_dir, None)
    assert check_start(run_dir, str(tmp_path / "x.ckpt")) is None  # a named checkpoint: a resume (checked elsewhere)


def test_two_runs_started_together_into_one_run_dir_give_one_winner_and_one_refusal_whichever_finishes_first(
        tmp_path):
    """Started together: either the second meets the first still running (in use) or finished (holds a run); either
    way exactly one runs, the other is refused in one line and touches nothing of the winner's."""
    run_dir = tmp_path / "shared"
    args = ["recipe=char_lm", *SMOKE["char_lm"], "trainer.max_steps=12", f"hydra.run.dir={run_dir}"]
    procs = [_start(args), _start([*args, "seed=1"])]
    (code_a, err_a), (code_b, err_b) = (_finish(p) for p in procs)
    assert sorted([code_a, code_b]) == [0, 2], (err_a[-2000:], err_b[-2000:])
    line = _one_error_line(err_a if code_a == 2 else err_b)
    assert re.fullmatch(_busy(run_dir), line) or re.fullmatch(_holds_a_run(run_dir), line), line
    winner_seed = 0 if code_a == 0 else 1
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "finished" and results["global_step"] == 12
    assert ("seed=1" in results["command"]) == (winner_seed == 1)  # the record is the winner's alone
    rows = [r.split(",") for r in (run_dir / "csv" / "metrics.csv").read_text().splitlines()[1:]]
    loss_steps = [int(r[1]) for r in rows if r[2]]
    assert loss_steps == sorted(set(loss_steps)) and loss_steps  # one run's rows: no step logged twice
    assert not (run_dir / LOCK_NAME).exists()  # released when the run ended
