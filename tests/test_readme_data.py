"""The guide docs/guides/your_data.md, run as printed against the local Hub: every command line verbatim, in one
folder, in a fresh `python` process each, with the shell's environment (no smoke size). The folder holds what the
guide says a reader has: `my_corpus/` (.txt files, one document each), `chats.jsonl` (conversations), and on the Hub
a tiny stand-in under a text dataset's real id (`roneneldan/TinyStories`, a `text` column in `data/`) and under
`recipe=sft`'s default chat model (`HuggingFaceTB/SmolLM2-135M-Instruct`: a tiny Llama with SmolLM2's ChatML
template). Each line must exit 0 and its record must name the data the line gave it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import guide
from support import warm_cli
from support.stand_ins import serve_chat

pytest.importorskip("transformers")
pytest.importorskip("datasets")


STORIES = "roneneldan/TinyStories"  # a public text dataset (`text` column), served here by a stand-in


def _lines() -> list[list[str]]:
    body = guide("your_data")
    blocks = re.findall(r"^```bash\n(.*?)^```", body, flags=re.M | re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.strip()]


def _documents() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)][:60]


def _conversation(i: int) -> list[dict[str, str]]:
    a, b = i % 17, (i * 7) % 23
    return [{"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]


def _reader_files(cwd, hub) -> None:
    """What the reader holds: the files in `cwd` and, on the Hub, the dataset and the chat model the lines name."""
    corpus = cwd / "my_corpus"
    corpus.mkdir()
    docs = _documents()
    for i, text in enumerate(docs):
        (corpus / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    with open(cwd / "chats.jsonl", "w", encoding="utf-8") as f:
        for i in range(200):
            f.write(json.dumps({"messages": _conversation(i)}) + "\n")
    data = cwd / "hub_dataset"
    (data / "data").mkdir(parents=True)
    with open(data / "data" / "train-00000-of-00001.jsonl", "w", encoding="utf-8") as f:
        for text in docs:
            f.write(json.dumps({"text": text}) + "\n")
    hub.api.create_repo(STORIES, repo_type="dataset", exist_ok=True)
    hub.api.upload_folder(repo_id=STORIES, repo_type="dataset", folder_path=str(data))
    serve_chat(hub.api)  # recipe=sft's default model (and data) under their real ids


def _results(cwd, before: set) -> dict:
    """The results.json of the run the last line made (its run dir is the one new under outputs/)."""
    new = sorted(set((cwd / "outputs").rglob("results.json")) - before)
    assert len(new) == 1, new
    return json.loads(new[0].read_text())


def _run(argv: list[str], cwd, env: dict, smoke: bool, monkeypatch, capsys) -> subprocess.CompletedProcess:
    """The line in a fresh `python` (as printed), or at smoke size in a process forked from a warm one
    (`support.warm_cli`: the same module as `__main__`, less the import time); `framework.data prepare` at smoke
    size runs its `main` in this process (tests/data/test_user_text.py runs the command in a fresh one)."""
    if smoke and argv[1:3] == ["-m", "framework.data"]:
        from framework.data.prepare import main

        with monkeypatch.context() as m:
            m.chdir(cwd)
            for key in ("FRAMEWORK_DATA_CACHE", "FRAMEWORK_SMOKE", "HF_HOME"):
                m.setenv(key, env[key])
            capsys.readouterr()
            code = main(argv[3:])
            out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)
    if smoke:
        return warm_cli.run(argv[2], argv[3:], env, cwd, timeout=600)
    return subprocess.run([sys.executable, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# both in make test-slow: make test keeps each line's path (tests/data/test_user_text.py trains on files and a Hub
# dataset and prepares a cache, tests/data/test_streaming.py streams through the CLI,
# tests/data/test_methods_on_user_data.py fine-tunes an HF model on a chat file with OLion through the CLI)
@pytest.mark.parametrize("smoke", [pytest.param(False, marks=pytest.mark.slow, id="as-printed"),
                                   pytest.param(True, marks=pytest.mark.slow, id="smoke")])
def test_the_your_own_data_section_runs_as_printed(tmp_path, hub, smoke, monkeypatch, capsys):
    """As printed; and (`smoke`, a quick check of the lines) the same lines at the README's own small size
    (`FRAMEWORK_SMOKE=1`, which every `python -m framework.train` line honours; the chat line keeps a row length
    its conversations fit, as smoke's 32 tokens would cut every one to no target)."""
    lines = _lines()
    assert len(lines) == 4 and all(argv[0] == "python" for argv in lines), lines
    cwd = tmp_path / "reader"
    cwd.mkdir()
    _reader_files(cwd, hub)
    env = {**{k: v for k, v in os.environ.items() if k not in ("FRAMEWORK_SMOKE",)}, "HF_ENDPOINT": hub.url,
           "HF_TOKEN": "dummy", "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1",
           "FRAMEWORK_DATA_CACHE": str(tmp_path / "data_cache"), **({"FRAMEWORK_SMOKE": "1"} if smoke else {})}
    records = []
    for argv in lines:
        before = set((cwd / "outputs").rglob("results.json")) if (cwd / "outputs").exists() else set()
        if smoke and "recipe=sft" in argv:
            argv = [*argv, "data.seq_len=128"]
        proc = _run(argv, cwd, env, smoke, monkeypatch, capsys)
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        if argv[1:3] == ["-m", "framework.data"]:
            records.append(json.loads(proc.stdout[proc.stdout.index("{"):]))
        else:
            records.append(_results(cwd, before))
    text, prepared, streamed, chat = records
    assert json.dumps(text["data"]).count("my_corpus") >= 1, text["data"]
    assert text["data"]["fingerprint"] == prepared["fingerprint"]  # prepare built the cache the run reads
    assert STORIES in json.dumps(streamed["data"]) and streamed["data"]["streaming"]
    assert "chats.jsonl" in json.dumps(chat["data"]), chat["data"]
