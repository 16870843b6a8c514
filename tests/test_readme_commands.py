"""The guide docs/guides/running.md ("Run and compose recipes", the README's "Running and composing" before), run as
printed: every line of its command blocks, verbatim.

Only two things differ from a reader's shell: `python` is this interpreter, and `FRAMEWORK_SMOKE=1` (documented in
that section) shrinks each run to its recipe's smoke size; `framework.ls` lines run in this process. Each command
runs in its own empty directory, so its `outputs/` and `multirun/` are its own, but the resume line, which runs in
the first command's directory after it: it resumes that run from the checkpoint the guide names.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import REPO
from support import warm_cli

from framework.ls import main as ls_main

GUIDE = REPO / "docs" / "guides" / "running.md"
FIRST_RUN = "runs/char_lm"  # the first command's run dir, which the resume line names


def section_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block of the guide's `text`."""
    body = text
    return [(lang, code.strip("\n").splitlines()) for lang, code in re.findall(r"^```(\w*)\n(.*?)^```", body,
                                                                              flags=re.M | re.S)]


def commands(lang: str = "bash") -> list[list[str]]:
    """Every command line of the section's `lang` blocks, split as a shell would (comments dropped)."""
    blocks = section_blocks(GUIDE.read_text())
    return [shlex.split(line, comments=True) for kind, lines in blocks if kind == lang for line in lines
            if line.strip() and not line.lstrip().startswith("#")]


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`argv` as a shell in `cwd` would run it; `python -m framework.ls ...` in this process (it is a pure
    `main(argv)`; the catalog import is what a new process would spend its time on)."""
    assert argv[0] == "python", argv
    if _ls(argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = ls_main(argv[3:])
        return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FRAMEWORK_SMOKE": "1"}
    if argv[1:3] == ["-m", "framework.train"]:  # a child of a process that has done the imports (warm_cli)
        return warm_cli.run("framework.train", argv[3:], env, cwd, timeout=300)
    return subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _ls(argv: list[str]) -> bool:
    return argv[1:3] == ["-m", "framework.ls"]


def test_the_section_has_the_commands_this_test_knows_how_to_check():
    cmds = commands()
    assert sum(f"ckpt_path={FIRST_RUN}/checkpoints/last.ckpt" in c for c in cmds) == 1  # the resume line
    assert cmds[0] == ["python", "-m", "framework.train", "recipe=char_lm", f"hydra.run.dir={FIRST_RUN}"]
    assert all(c[:3] in (["python", "-m", "framework.train"], ["python", "-m", "framework.ls"]) for c in cmds)


@pytest.mark.ddp
@pytest.mark.long
def test_every_command_of_running_and_composing_runs_as_printed(tmp_path):
    cmds = commands()
    resume = next(i for i, c in enumerate(cmds) if any(a.startswith("ckpt_path=") for a in c))
    dirs = [tmp_path / f"cmd{i}" for i in range(len(cmds))]
    for d in dirs:
        d.mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time: most of each is the import
        futures = {i: pool.submit(run, c, dirs[i]) for i, c in enumerate(cmds) if i != resume and not _ls(c)}
        done = {i: run(c, dirs[i]) for i, c in enumerate(cmds) if _ls(c)}  # in this thread: it redirects stdout
        first = futures[0].result()
        assert first.returncode == 0, first.stderr[-3000:]
        run_dir = dirs[0] / FIRST_RUN
        futures[resume] = pool.submit(run, cmds[resume], dirs[0])  # as printed, where the first one ran
        done.update({i: f.result() for i, f in futures.items()})
    for i, proc in sorted(done.items()):
        assert proc.returncode == 0, f"{shlex.join(cmds[i])}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for i, cmd in enumerate(cmds):  # and each did what its comment says
        out, line = done[i].stdout, " ".join(cmd)
        if "--help" in cmd:
            assert "== Configuration groups ==" in out and "recipe: char_lm" in out
        elif "--cfg" in cmd:
            assert "_target_: framework.data.text.ByteCorpus" in out and not (dirs[i] / "outputs").exists()
        elif "-m" in cmd[3:]:
            runs = sorted((dirs[i] / "multirun").glob("train/*/*/results.json"))
            assert sorted(json.loads(r.read_text())["choices"]["optimizer"] for r in runs) == ["adamw", "sgd"]
        elif cmd[2] == "framework.train":
            where = dirs[0 if i == resume else i] / "outputs" / "train"
            found = [run_dir / "results.json"] if i == 0 else list(where.glob("*/results.json"))
            results = [json.loads(r.read_text()) for r in found]
            assert len(results) == 1, line
            assert all(r["recipe"] == "char_lm" for r in results)
            if "optimizer=sgd" in cmd:
                assert results[0]["choices"]["optimizer"] == "sgd"
            if "trainer.max_steps=50" in cmd:
                assert results[0]["global_step"] == 50 and results[0]["choices"]["optimizer"] == "adamw"
            if "trainer.devices=2" in cmd:
                assert (where / Path(results[0]["run_dir"]).name / "results.rank1.json").is_file()
        else:
            assert out.strip(), line  # framework.ls lists something
    (resumed_json,) = (dirs[0] / "outputs" / "train").glob("*/results.json")
    resumed = json.loads(resumed_json.read_text())
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert "ckpt_path=" in resumed["command"] and resumed["global_step"] == ckpt["global_step"] > 0


def test_the_sample_error_in_the_section_is_what_the_command_prints(tmp_path):
    blocks = [lines for lang, lines in section_blocks(GUIDE.read_text()) if lang == ""]
    shown = [(lines[0][2:], lines[1]) for lines in blocks if lines and lines[0].startswith("$ ")]
    assert shown, "the section shows a command and its error"
    for command, printed in shown:
        proc = run(shlex.split(command), tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1].startswith(printed.split("...")[0].rstrip(". ")), proc.stderr
        assert not any(tmp_path.iterdir())  # nothing written


def test_the_python_snippet_of_what_is_registered_runs():
    text = GUIDE.read_text()
    part = re.split(r"^##? ", text.split("## What is registered", 1)[1], maxsplit=1, flags=re.M)[0]
    blocks = [code.splitlines() for code in re.findall(r"^```python\n(.*?)^```", part, flags=re.M | re.S)]
    assert blocks
    for lines in blocks:
        scope: dict = {}
        exec(compile("\n".join(lines), str(GUIDE), "exec"), scope)  # noqa: S102 - the guide's own code
        assert isinstance(scope["opt"], torch.optim.AdamW)
