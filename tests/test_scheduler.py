"""What a job scheduler does to a run: SIGTERM (SLURM, Kubernetes, `docker stop`) and SIGUSR1 (SLURM's warning)
stop it gracefully with a documented exit code, and the same command run again (`ckpt_path=auto`) resumes it to the
end bitwise equal to an uninterrupted run, with the same `metrics.csv`."""

from __future__ import annotations

import json
import signal

import pytest
from helpers import ENDLESS_STEPS, wait_for_a_checkpoint
from test_fault_injection import KILL, _assert_same, _finish, _start, _state

from framework.recipe import SMOKE

ARGS = ["recipe=char_lm", *SMOKE["char_lm"], "trainer.max_steps=8", "callbacks.checkpoint.every_n_train_steps=2",
        "trainer.log_every_n_steps=1", "trainer.val_check_interval=3", "ckpt_path=auto"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of ARGS (`ckpt_path=auto` in a fresh run dir starts fresh)."""
    ref = tmp_path_factory.mktemp("reference") / "run"
    code, err = _finish(_start([*ARGS, f"hydra.run.dir={ref}"]))
    assert code == 0, err[-3000:]
    assert json.loads((ref / "results.json").read_text())["status"] == "finished"
    return ref


# make test sends SIGUSR1 (a cluster's requeue signal); the others take the same handler (make test-slow; Ctrl-C's
# checkpoint and resume command are also in tests/test_bad_input.py)
@pytest.mark.parametrize(("name", "code"), [pytest.param("SIGTERM", 143, marks=pytest.mark.slow), ("SIGUSR1", 138),
                                            pytest.param("SIGINT", 130, marks=pytest.mark.slow)])
def test_a_signal_saves_records_exits_with_its_code_and_the_same_command_resumes_bitwise(
        reference, tmp_path, name, code):
    run = tmp_path / "run"
    stop = [*KILL, "+callbacks.kill.step=3", f"+callbacks.kill.signal_name={name}"]  # arrives as step 3 begins
    got, err = _finish(_start([*ARGS, *stop, f"hydra.run.dir={run}"]))
    assert got == code, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert (results["status"], results["signal"], results["global_step"]) == ("interrupted", name, 4)
    assert f"resume with: {results['resume']}" in err and "Traceback" not in err
    assert _state(run / "checkpoints" / "interrupted.ckpt")["global_step"] == 4  # step 3 was finished, then saved

    again, err = _finish(_start([*ARGS, f"hydra.run.dir={run}"]))  # the requeued job: the same command
    assert again == 0, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "finished" and results["resumed_from"].startswith(str(run / "checkpoints"))
    _assert_same(_state(reference / "checkpoints" / "last.ckpt"), _state(run / "checkpoints" / "last.ckpt"))
    assert (run / "csv" / "metrics.csv").read_text() == (reference / "csv" / "metrics.csv").read_text()


def test_sigterm_from_outside_stops_a_running_cli_with_exit_143_and_a_resume_command(tmp_path):
    run = tmp_path / "run"
    proc = _start([*ARGS, f"trainer.max_steps={ENDLESS_STEPS}", f"hydra.run.dir={run}"])
    wait_for_a_checkpoint(proc, run)  # the signal always comes mid-run
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc, timeout=120)
    assert code == 143, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "interrupted" and 2 <= results["global_step"] < ENDLESS_STEPS
    assert "SIGTERM: finishing this step" in err and f"resume with: {results['resume']}" in err
