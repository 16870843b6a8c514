"""Every command line of docs/*.md's bash blocks, run as printed: each doc as one shell session, its lines in order.

As in tests/test_readme_commands.py, `python` is this interpreter and `FRAMEWORK_SMOKE=1` shrinks each training run to
its recipe's smoke size. A doc's lines run in one empty directory, which is also HOME (so `~` lands inside it), as a
reader would type them into one shell: `export` sets the session's environment and a line ending in `&` starts a
background process. A session whose doc does not serve its own Hub gets the one docs/hub.md serves, `python -m
framework.local_hub`, with HF_ENDPOINT and HF_TOKEN exported, so every push and pull stays on this machine. Every
line is pasteable as printed: no `[--option VALUE]` group, no `...` and no ALL-CAPS word for the reader to fill in
(optional flags and placeholders are in the prose, as `<...>`; a test checks). The one substitution made here is the
printed port 8765, which becomes a free one. Lines that cannot run here are in SKIPPED, each with its reason; a test
checks that each still names a printed line. docs/hub.md runs in the fast suite; the other docs, whose sessions take
minutes, are `slow`.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli

DOCS = sorted((REPO / "docs").glob("*.md"))
FAST = {"hub.md"}
#: a printed line (a fragment of it) that is not run → why
SKIPPED = {
    ".venv/bin/python -m pytest": "the test suite itself (`make test` and `make test-slow` run it)",
    "python tools/bench/": "benchmarks: minutes of timing for a quiet machine, and run_all.py rewrites BENCHMARKS.md",
    "ckpt_path=runs/moe-growth/checkpoints/step000300.ckpt": "needs the full-size run (growth at step 200, a "
                                                             "checkpoint at 300)",
    "runs/mdlm-text/checkpoints/step000200.ckpt": "needs the full-size run's step-200 checkpoint (smoke runs 4 steps)",
    "generate local-user/mdlm-text": "needs that repo on the Hub; docs/hub.md's walkthrough pushes one the same way",
    "data.source=my_": "the reader's own files (tests/data/test_user_text.py writes such files, trains on them)",
    "data.source='my_": "the reader's own files, by a quoted glob (tests/data/test_sources.py reads such globs)",
    "data.source=my-org/my-corpus": "the reader's Hub dataset (tests/data/test_user_text.py pushes one locally)",
    "data.source=books.txt.gz": "the reader's own compressed file (tests/data/test_text_files.py writes compressed "
                                "text files and reads them as data=text does)",
    "framework.metrics my_images/": "the reader's own image folders (tests/metrics/test_image_cli.py writes such "
                                    "folders, pushes a timm encoder and a Hub image dataset locally, scores them)",
    "timm.create_model('hf-hub:local-user/timm-digits'": "timm itself opening the run's push (README.md's images "
                                                          "lines run it as printed; tests/models/test_timm_models.py "
                                                          "opens a push in a fresh process)",
}
PRINTED_PORT = "8765"
#: a word the reader would have to replace: two or more capitals, digits or underscores standing alone; not a
#: variable being set (`export HF_ENDPOINT=...`, `OMP_NUM_THREADS=1 python ...`) or read (`$HF_TOKEN`), and not
#: inside a quoted string (a prompt may hold an acronym)
PLACEHOLDER = re.compile(r"(?<![\w${])[A-Z][A-Z0-9_]*[A-Z0-9](?![\w=])")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def commands(doc: Path) -> list[tuple[str, list[str]]]:
    """(printed line, argv) of every command of `doc`'s bash blocks: continuations joined, comments dropped."""
    found = []
    for code in re.findall(r"^```bash\n(.*?)^```", doc.read_text(), flags=re.M | re.S):
        for line in re.sub(r"\\\n\s*", " ", code).splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                found.append((line.split(" #")[0].strip(), argv))
    return found


def unpasteable(line: str) -> list[str]:
    """What in a printed command line (its comment dropped) a reader could not paste: an optional `[--...]` group,
    `...`, a placeholder word."""
    return [mark for mark in ("[--", "...") if mark in line] + PLACEHOLDER.findall(QUOTED.sub("", line))


def skip_reason(line: str) -> str | None:
    return next((why for fragment, why in SKIPPED.items() if fragment in line), None)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class Session:
    """One reader's shell in `cwd`: its environment, the processes it left running, what each command returned."""

    def __init__(self, cwd: Path) -> None:
        self.cwd, self.port = cwd, free_port()
        self.env = {"FRAMEWORK_SMOKE": "1", "HOME": str(cwd), "HF_HOME": str(cwd / ".cache" / "huggingface")}
        self.background: list[subprocess.Popen] = []

    def expand(self, argv: list[str]) -> list[str]:
        """What the shell and this test do to a printed line: `~` is this HOME, the printed port a free one."""
        out = [arg.replace("~", str(self.cwd), 1) if arg.startswith("~") else arg for arg in argv]
        return [a.replace(PRINTED_PORT, self.port) for a in out]

    def serve_hub(self, args: list[str]) -> str:
        """`python -m framework.local_hub ARGS &`: started in the background; returns the URL it serves."""
        proc = subprocess.Popen([sys.executable, "-m", "framework.local_hub", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.cwd, env={**os.environ, **self.env})
        self.background.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("LocalHub serving"), line or proc.stderr.read()
        return line.rsplit(" at ", 1)[1].strip()

    def run(self, argv: list[str]) -> subprocess.CompletedProcess | None:
        argv = self.expand(argv)
        if argv[0] == "export":
            key, _, value = argv[1].partition("=")
            self.env[key] = value
            return None
        assert argv[:2] == ["python", "-m"], f"not a command this test knows how to run: {shlex.join(argv)}"
        if argv[-1] == "&":
            assert argv[2] == "framework.local_hub", argv
            self.serve_hub(argv[3:-1])
            return None
        return run_cli(*argv[3:], module=argv[2], env=self.env, cwd=self.cwd, timeout=900)

    def close(self) -> None:
        for proc in self.background:
            proc.terminate()
            proc.wait(timeout=30)


def run_doc(doc: Path, tmp_path: Path) -> Session:
    """Run every line of `doc` that SKIPPED does not name, in order, and check each ran cleanly."""
    session = Session(tmp_path)
    try:
        cmds = commands(doc)
        if not any(argv[-1] == "&" and "framework.local_hub" in argv for _, argv in cmds):
            url = session.serve_hub(["--root", str(tmp_path / "hub"), "--port", "0"])
            session.env.update(HF_ENDPOINT=url, HF_TOKEN="dummy")
        for line, argv in cmds:
            if skip_reason(line) is None:
                proc = session.run(argv)
                assert proc is None or proc.returncode == 0, f"{doc.name}: {line}\n{proc.stderr[-3000:]}"
                assert proc is None or "Traceback" not in proc.stderr, f"{doc.name}: {line}\n{proc.stderr[-3000:]}"
    except BaseException:
        session.close()
        raise
    return session


def test_every_doc_command_is_run_or_skipped_for_a_stated_reason():
    lines = [line for doc in DOCS for line, _ in commands(doc)]
    assert len(lines) > 30 and FAST <= {d.name for d in DOCS}
    assert all(any(fragment in line for line in lines) for fragment in SKIPPED), "a SKIPPED entry names no line"
    ran = [line for line in lines if skip_reason(line) is None]
    assert all(line.startswith(("python -m framework.", "export ")) for line in ran), ran
    bad = {f"{doc.name}: {line}": unpasteable(line) for doc in DOCS for line, _ in commands(doc) if unpasteable(line)}
    assert not bad, f"lines a reader cannot paste as printed (say it in the prose, as <...>): {bad}"


def test_the_pasteable_check_tells_placeholders_from_real_values():
    """What `unpasteable` flags, on lines the docs had, and what it lets through."""
    assert unpasteable("python -m framework.hub pull local-user/char-lm [--revision BRANCH_OR_COMMIT]") == [
        "[--", "BRANCH_OR_COMMIT"]
    assert unpasteable("python -m framework.train recipe=moe_growth ckpt_path=RUN/checkpoints/step000300.ckpt") == [
        "RUN"]
    assert unpasteable('python -m framework.generate local-user/mdlm-text --prompt "..."') == ["..."]
    assert unpasteable("python -m framework.grow RUN_DIR --depth 2 --out DIR") == ["RUN_DIR", "DIR"]
    for fine in ("export HF_ENDPOINT=http://127.0.0.1:8765", "export HF_TOKEN=dummy", "echo $HF_TOKEN ${HF_HOME}",
                 "OMP_NUM_THREADS=1 python -m framework.train recipe=char_lm",
                 'python -m framework.kv_generate m/ --prompt "What does a GPU do?" --chat',
                 "python -m framework.metrics real.npy fake.npy --k 3 --le"):
        assert unpasteable(fine) == [], fine


# make test-slow: make test pushes, branches and pulls through the same calls (test_hub.py)
@pytest.mark.slow
def test_docs_hub_walkthrough_runs_as_printed_against_the_installed_local_hub(tmp_path):
    """docs/hub.md: serve, export, train and push (main, then a branch every 2nd validation), push again, pull."""
    session = run_doc(REPO / "docs" / "hub.md", tmp_path)
    try:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=session.env["HF_ENDPOINT"], token="dummy")
        branches = {ref.name for ref in api.list_repo_refs("local-user/char-lm").branches}
        assert branches == {"main", "exp1"} and "model.safetensors" in api.list_repo_files("local-user/char-lm")
        assert (tmp_path / ".cache" / "local-hub").is_dir()  # `--root ~/.cache/local-hub` went to this HOME
    finally:
        session.close()


@pytest.mark.slow
@pytest.mark.parametrize("doc", [d for d in DOCS if d.name not in FAST], ids=lambda d: d.name)
def test_every_command_of_a_doc_runs_as_printed(doc, tmp_path):
    run_doc(doc, tmp_path).close()


def test_the_guides_and_the_readme_print_only_pasteable_lines():
    """The same rule for the task guides and the README, whose lines their own tests run as printed."""
    pages = [REPO / "README.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]
    bad = {f"{page.name}: {line}": unpasteable(line) for page in pages for line, _ in commands(page)
           if unpasteable(line)}
    assert not bad, f"lines a reader cannot paste as printed (say it in the prose, as <...>): {bad}"
