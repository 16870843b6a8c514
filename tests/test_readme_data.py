"""The guide docs/guides/your_data.md against the guides' local Hub, every command line verbatim in one folder: as
printed (make test-slow: a fresh `python` process each, the shell's environment, no smoke size) and at the small size
(make test: `support.guides`). The folder holds what the
guide says a reader has: `my_corpus/` (.txt files, one document each), `chats.jsonl` (conversations), and on the Hub
a tiny stand-in under a text dataset's real id (`roneneldan/TinyStories`, a `text` column in `data/`) and under
`recipe=sft`'s default chat model (`HuggingFaceTB/SmolLM2-135M-Instruct`: a tiny Llama with SmolLM2's ChatML
template). Each line must exit 0 and its record must name the data the line gave it."""

from __future__ import annotations

import json

import pytest
from support import guides
from support.stand_ins import serve_chat

pytest.importorskip("transformers")
pytest.importorskip("datasets")


STORIES = "roneneldan/TinyStories"  # a public text dataset (`text` column), served here by a stand-in


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


# make test runs the lines at the guide's small size, make test-slow as printed
@pytest.mark.parametrize("smoke", [pytest.param(True, marks=pytest.mark.long, id="smoke"),
                                   pytest.param(False, marks=pytest.mark.slow, id="as-printed")])
def test_the_your_own_data_section_runs_as_printed(tmp_path, guide_hub, smoke):
    """As printed; and (`smoke`, a quick check of the lines) the same lines at the guides' small size
    (`FRAMEWORK_SMOKE=1`, which every `python -m framework.train` line honours; the chat line keeps a row length
    its conversations fit, as smoke's 32 tokens would cut every one to no target), each forked warm."""
    lines = guides.command_lines("your_data")
    assert len(lines) == 4 and all(argv[0] == "python" for argv in lines), lines
    cwd = tmp_path / "reader"
    cwd.mkdir()
    _reader_files(cwd, guide_hub)
    env = guides.reader_env(guide_hub, guide_hub.home, smoke, FRAMEWORK_DATA_CACHE=str(tmp_path / "data_cache"),
                            **({"FRAMEWORK_SMOKE": "1"} if smoke else {}))
    records = []
    for argv in lines:
        before = guides.outputs(cwd)
        if smoke and "recipe=sft" in argv:
            argv = [*argv, "data.seq_len=128"]
        proc = guides.run_line(argv, cwd, env, smoke, timeout=600)
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        if argv[1:3] == ["-m", "framework.data"]:
            records.append(json.loads(proc.stdout[proc.stdout.index("{"):]))
        else:
            records.append(guides.new_results(cwd, before))
    text, prepared, streamed, chat = records
    assert json.dumps(text["data"]).count("my_corpus") >= 1, text["data"]
    assert text["data"]["fingerprint"] == prepared["fingerprint"]  # prepare built the cache the run reads
    assert STORIES in json.dumps(streamed["data"]) and streamed["data"]["streaming"]
    assert "chats.jsonl" in json.dumps(chat["data"]), chat["data"]
