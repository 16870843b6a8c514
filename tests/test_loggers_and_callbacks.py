"""The user's own loggers and callbacks (`trainer.logger`, `trainer.callbacks`) run beside the run's own, through the
real CLI: the README's "Your own loggers and callbacks" commands as printed (W&B offline among them), an MLflow file
store, `trainer.logger=false`, the catalog's `+callbacks=NAME callbacks.NAME.KEY=VALUE` form, and bad values."""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from support import guides, wandb_offline
from test_hub import hub_env

from framework.cli import check_command_line
from framework.errors import InputError


def readme_commands() -> list[list[str]]:
    """Every line of docs/guides/loggers.md's bash blocks, split as a shell would (comments dropped)."""
    return guides.command_lines("loggers", comments=True)


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`argv` (a `python -m framework.train ...` line) in `cwd` at smoke size, as a user's shell would run it."""
    assert argv[:3] == ["python", "-m", "framework.train"], argv
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FRAMEWORK_SMOKE": "1", **(env or {})}
    return subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=cwd, env=full, timeout=600)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_dir(cwd: Path) -> Path:
    (found,) = (cwd / "outputs" / "train").iterdir()
    return found


# make test: the four lines forked warm (`support.guides`); make test-slow: the four in fresh processes
@pytest.mark.parametrize("small", [pytest.param(True, marks=pytest.mark.long, id="small"),
                                   pytest.param(False, marks=pytest.mark.slow, id="fresh")])
def test_every_command_of_your_own_loggers_and_callbacks_runs_as_printed(tmp_path, guide_hub, small):
    cmds = readme_commands()
    assert [c[3] for c in cmds] == ["recipe=char_lm"] * 4 and len(cmds) == 4
    assert "WandbLogger" in shlex.join(cmds[1])
    dirs = [tmp_path / f"cmd{i}" for i in range(len(cmds))]
    for d in dirs:
        d.mkdir()
    hub = guide_hub
    env = hub_env(hub.url, tmp_path / "cache")
    if small:
        full = guides.reader_env(hub, hub.home, small, FRAMEWORK_SMOKE="1")
        done = {i: guides.run_line(cmd, dirs[i], full, small=True, timeout=600) for i, cmd in enumerate(cmds)}
    else:
        with ThreadPoolExecutor(max_workers=2) as pool:
            done = dict(enumerate(pool.map(lambda i: run(cmds[i], dirs[i], env), range(len(cmds)))))
    for i, proc in sorted(done.items()):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"{shlex.join(cmds[i])}\n{proc.stderr[-3000:]}"
    runs = [run_dir(d) for d in dirs]
    results = [json.loads((r / "results.json").read_text()) for r in runs]
    assert all(r["status"] == "finished" and "val/loss" in r["metrics"] for r in results)  # whatever the loggers
    assert all((r / "checkpoints" / "last.ckpt").is_file() for r in runs)  # our checkpoint callback stays

    # trainer.logger=false: no logger at all, yet results.json has the metrics
    assert not (runs[0] / "csv").exists() and not (runs[0] / "tb").exists()
    # W&B offline, given as +trainer.logger._target_=...: the same validation numbers as our CSV, and the config
    ours = [float(r["val/loss"]) for r in rows(runs[1] / "csv" / "metrics.csv") if r["val/loss"]]
    (wandb_run,) = (dirs[1] / "wandb").glob("offline-run-*")
    theirs = [row["val/loss"] for row in wandb_offline.history(wandb_run) if "val/loss" in row]
    assert theirs == pytest.approx(ours, rel=1e-12) and len(ours) >= 2
    assert wandb_offline.config(wandb_run)["choices"]["recipe"] == "char_lm"
    # a CSVLogger and a ModelCheckpoint of the user's, as lists: their metrics.csv is ours, row for row
    (mine,) = (dirs[2] / "my_logs").glob("*/version_*/metrics.csv")
    assert rows(mine) == rows(runs[2] / "csv" / "metrics.csv") and len(rows(mine)) >= 2
    config = yaml.safe_load((mine.parent / "hparams.yaml").read_text())
    assert config["choices"]["recipe"] == "char_lm" and config["optimizer"]["lr"] == pytest.approx(
        yaml.safe_load((runs[2] / ".hydra" / "config.yaml").read_text())["optimizer"]["lr"])
    assert [p.name for p in (dirs[2] / "my_ckpts").glob("*.ckpt")]
    # the catalog's hub_push with a value, in the form docs/hub.md prints: the model is on the (local) Hub
    assert {"model.safetensors", "config.json", "README.md"} <= set(hub.api.list_repo_files("me/char-lm"))


def test_an_mlflow_file_store_and_a_users_callback_get_what_our_csv_gets(cli, tmp_path):
    store = tmp_path / "mlruns"
    proc = cli("recipe=char_lm", "size=smoke", "trainer.log_every_n_steps=1",
               "+trainer.logger._target_=lightning.pytorch.loggers.MLFlowLogger",
               f"+trainer.logger.tracking_uri=file:{store}", "+trainer.logger.experiment_name=char_lm",
               "+trainer.callbacks._target_=lightning.pytorch.callbacks.LearningRateMonitor",
               f"hydra.run.dir={tmp_path / 'run'}", env={"MLFLOW_ALLOW_FILE_STORE": "true"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = rows(tmp_path / "run" / "csv" / "metrics.csv")
    (mlrun,) = [p for p in store.glob("*/*") if (p / "metrics").is_dir()]
    for key in ("train/loss", "val/loss", "lr-AdamW"):  # lr-AdamW: the user's LearningRateMonitor logged it
        expected = [(int(r["step"]), float(r[key])) for r in ours if r.get(key)]
        logged = [line.split() for line in (mlrun / "metrics" / key).read_text().splitlines()]
        assert [int(step) for *_, step in logged] == [step for step, _ in expected] and len(expected) >= 2, key
        assert [float(value) for _, value, _ in logged] == pytest.approx([v for _, v in expected], rel=1e-12), key
    assert (mlrun / "params" / "choices" / "recipe").read_text() == "char_lm"


@pytest.mark.parametrize(("args", "message"), [
    (["callbacks.hub_push.repo_id=me/model"], "the callback 'hub_push' is not among this run's callbacks"
     " (checkpoint); add it with +callbacks=hub_push (or list them all: callbacks=[checkpoint,hub_push])"),
    (["trainer.logger._target_=lightning.pytorch.loggers.CSVLogger"], "trainer.logger is null, so it has no"
     " settings; to give it some, write +trainer.logger._target_=..."),
    (["trainer.logger=false", "+callbacks=lr_monitor"], "trainer.logger=false leaves no logger, but"
     " callbacks.lr_monitor (LearningRateMonitor) logs to one"),
    (["trainer.logger=wandb"], "trainer.logger: 'wandb' is not a Lightning Logger; give trainer.logger=false"),
    (["trainer.callbacks=[{_target_:lightning.pytorch.loggers.CSVLogger,save_dir:x}]"],
     "trainer.callbacks: a CSVLogger is not a Lightning Callback; give Lightning callbacks added to the run's own"),
    (["+trainer.logger._target_=lightning.pytorch.loggers.NoSuchLogger"], "trainer.logger: cannot build it"),
], ids=["a-value-for-an-unchosen-callback", "a-key-under-a-null-logger", "no-logger-for-lr_monitor",
        "a-name-for-a-logger", "a-logger-among-callbacks", "a-class-that-does-not-exist"])
def test_bad_loggers_and_callbacks_get_one_error_naming_the_value_and_the_forms_that_work(args, message, tmp_path):
    with pytest.raises(InputError) as err:
        check_command_line(["recipe=char_lm", "size=smoke", *args, f"hydra.run.dir={tmp_path / 'run'}"])
    assert message in str(err.value) and not any(tmp_path.iterdir())


def test_a_value_for_a_callback_the_run_lacks_is_one_error_line_at_the_cli(cli, tmp_path):
    proc = cli("recipe=char_lm", "callbacks.hub_push.repo_id=me/model", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: Unknown setting 'callbacks.hub_push.repo_id': the callback 'hub_push' is not among this run's"
        " callbacks (checkpoint); add it with +callbacks=hub_push (or list them all: callbacks=[checkpoint,hub_push])"]
    assert not any(tmp_path.iterdir())


def test_a_progress_bar_of_the_users_replaces_ours_and_turns_the_bar_on():
    from lightning.pytorch.callbacks import LearningRateMonitor, RichProgressBar, TQDMProgressBar

    from framework.run_tools import merge_callbacks, show_progress_bar

    ours, theirs = [RichProgressBar(), LearningRateMonitor()], [TQDMProgressBar(refresh_rate=5)]
    merged = merge_callbacks(ours, theirs)
    assert merged == [ours[1], theirs[0]]  # ours first (checkpointing, guards, RunRecord), then the user's
    assert merge_callbacks(ours, [LearningRateMonitor()])[:2] == ours  # no bar of theirs: ours stays
    assert show_progress_bar(None, theirs) is True and show_progress_bar(False, theirs) is False
