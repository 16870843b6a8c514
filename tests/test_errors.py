"""The edge: one mapping from error types to exit codes, one `error:` line, printed once."""

import subprocess
import sys

import pytest

from framework.errors import (
    BadSettingError,
    CheckpointError,
    HubPushError,
    NonFiniteLossError,
    PreflightError,
    PushAfterTrainingError,
    RunInterrupted,
    UnknownNameError,
    UnsafeConfigError,
    exit_code,
    report_and_exit,
    run_cli,
)


@pytest.mark.parametrize(("err", "code"), [
    (PreflightError("model.dim=-8 must be positive"), 2),
    (BadSettingError("Unknown setting 'x'"), 2),
    (UnknownNameError("optimizer", "adamww", ["adamw"]), 2),
    (UnsafeConfigError("config.json has key '_target_'"), 2),
    (FileNotFoundError("no such features file: a.npy"), 2),
    (NonFiniteLossError("training loss is nan at step 3"), 1),
    (CheckpointError("no space left on the device"), 1),
    (HubPushError("the Hub refused the push"), 1),
    (PushAfterTrainingError("training finished ... but the push failed"), 3),
    (RunInterrupted("/run/checkpoints/interrupted.ckpt", 7), 130),
    (KeyboardInterrupt(), 130),
])
def test_each_error_type_has_one_exit_code(err, code):
    assert exit_code(err) == code


def test_builtin_errors_map_only_for_the_small_command_lines_and_bugs_are_not_ours_to_report():
    assert exit_code(ValueError("bad")) is None and exit_code(ValueError("bad"), plain=True) == 2
    assert exit_code(TypeError("bad"), plain=True) == 2 and exit_code(LookupError("x"), plain=True) == 2
    assert exit_code(ConnectionError("refused"), plain=True) == 1  # an OSError: the environment failed
    assert exit_code(ZeroDivisionError(), plain=True) is None  # a bug: its traceback is shown


def test_run_cli_prints_one_line_and_returns_the_code(capsys):
    def refuse():
        raise UnknownNameError("optimizer", "adamww", ["adamw", "sgd"])

    assert run_cli(refuse) == 2
    err = capsys.readouterr().err
    assert err == "error: Unknown optimizer 'adamww'. Did you mean 'adamw'? Valid optimizer names: adamw, sgd\n"

    def hub_down():
        raise ConnectionError("[Errno 111] Connection\n refused")

    assert run_cli(hub_down) == 1
    assert capsys.readouterr().err == "error: ConnectionError: [Errno 111] Connection refused\n"
    assert run_cli(lambda: None) == 0
    with pytest.raises(ZeroDivisionError):
        run_cli(lambda: 1 / 0)


def test_report_and_exit_raises_system_exit_with_the_code_and_only_rank_zero_prints(capsys, monkeypatch):
    def diverge():
        raise NonFiniteLossError("training loss is nan at step 3")

    with pytest.raises(SystemExit) as exit_:
        report_and_exit(diverge)
    assert exit_.value.code == 1 and capsys.readouterr().err == "error: training loss is nan at step 3\n"
    from lightning.pytorch.utilities import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    with pytest.raises(SystemExit):
        report_and_exit(diverge)
    assert capsys.readouterr().err == ""


def test_a_token_never_reaches_the_error_line(capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecret")

    def leak():
        raise HubPushError("401 for https://user:hf_secretsecretsecret@hub/api")

    assert run_cli(leak) == 1
    assert "hf_secret" not in capsys.readouterr().err


# each in a fresh process with a bare environment (about 6-12 s each on 2 cores); the seven in `make test-slow` have a
# bad-input test of their `main()` in `make test` (test_train_cli, test_metric, test_generate,
# growth/test_growth_callback, test_hub, hf/test_kv_generate_cli, data/test_user_text)
COMMAND_LINES = {
    "framework.train": ["recipe=char_lmm"],
    "framework.ls": ["optimiser"],
    "framework.metrics": ["{tmp}/no.npy", "{tmp}/no.npy"],
    "framework.generate": ["{tmp}/no-run", "--prompt", "x"],
    "framework.grow": ["{tmp}/no-run", "--out", "{tmp}/out"],
    "framework.hub": ["push", "{tmp}", "local-user/x"],
    "framework.kv_generate": ["{tmp}/no-model", "--ids", "1 2 3"],
    "framework.data": ["prepare", "recipe=char_lm", "data=text", "data.source={tmp}/no-such-corpus"],
}


@pytest.mark.parametrize("module", [m if m == "framework.train" else
                                    pytest.param(m, marks=pytest.mark.slow) for m in COMMAND_LINES])
def test_every_command_line_exits_2_with_one_line_on_bad_input(tmp_path, module):
    """Each CLI as a user runs it: a real process, a bad argument, one `error:` line, exit 2."""
    args = [module, *(a.format(tmp=tmp_path) for a in COMMAND_LINES[module])]
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
    assert "Traceback" not in proc.stderr
