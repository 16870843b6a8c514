"""`data.streaming=true`: a corpus read as a stream, packed on the fly into the rows the packed cache holds; peak
memory flat in the corpus' size; a run killed with SIGKILL resumes to the same next batch, streamed or not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import KILL, REPO, finish, start_cli, train_state
from helpers import assert_same_state as assert_same
from support.batch_log import corpus

from framework.data import streaming
from framework.data.packing import pack
from framework.data.streaming import RankStream, collate, held_out, open_split
from framework.data.user_text import TextData


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_DATA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _rows(stream: RankStream, n: int | None = None) -> list:
    out = []
    while (stream.has_fresh() if n is None else len(out) < n):
        out.append(stream.next_row())
    return out


@pytest.mark.parametrize("packing,split_documents", [(True, True), (True, False), (False, True)])
def test_streamed_rows_are_the_rows_the_packed_cache_holds(tmp_path, cache, packing, split_documents):
    data = TextData(str(corpus(tmp_path / "c", {"train": 60, "validation": 5})), seq_len=24, batch_size=4,
                    packing=packing, streaming=True)
    stream = RankStream(open_split(data, "train", shuffle=False), streaming.documents_of(data, None), 24, packing,
                        split_documents)
    streamed = collate(_rows(stream), 24, packing, data.pad_id, 0)
    cached = pack(((ids, None) for ids in data._documents("train")), tmp_path / "packed", 24, packing,
                  split_documents)
    assert stream.repeated == 0 and len(streamed["input_ids"]) == len(cached) > 10
    for key in ("input_ids", "labels", "position_ids" if packing else "attention_mask"):
        assert torch.equal(streamed[key], torch.stack([cached[i][key] for i in range(len(cached))])), key


def test_a_stream_resumed_at_any_row_gives_the_same_rows_repeats_included(tmp_path, cache):
    data = TextData(str(corpus(tmp_path / "c", {"train-0": 9, "train-1": 40, "train-2": 3, "train-3": 14,
                                                "validation": 3})), seq_len=16, batch_size=2, streaming=True)

    opened = open_split(data, "train", 0, 2)

    def rank_stream():
        return RankStream(opened, streaming.documents_of(data, None), 16, True)

    stream, positions, rows = rank_stream(), [], []
    stream.start(epoch=3)
    while stream.repeated < 5:  # on through the end of rank 0's share (2 files of 4) into its repeats
        positions.append(stream.position())
        rows.append(stream.next_row())
    assert stream.passes == 1 and len(rows) > 10
    for i in range(0, len(rows), 4):
        again = rank_stream()
        again.start(3, positions[i])
        for want in rows[i:]:
            got = again.next_row()
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]
    first = {}  # each epoch reads the files in another order (the same on every rank)
    for epoch in range(4):
        stream.start(epoch)
        first[epoch] = bytes(stream.next_row()[0]).split(b"/")[0]
    assert len(set(first.values())) > 1


def test_held_out_documents_are_validation_never_training_and_together_they_are_the_split(tmp_path, cache):
    data = TextData(str(corpus(tmp_path / "c", {"train": 300})), seq_len=32, batch_size=4, val_fraction=0.1,
                    streaming=True)
    data.setup()
    loader = data.train_dataloader()
    trained = b"".join(bytes(row[row != 0].tolist()) for batch in loader for row in batch["input_ids"])
    held = b"".join(bytes(row["input_ids"][row["input_ids"] != 0].tolist()) for row in data.val_set)
    docs = [json.loads(line)["text"].encode() for line in open(tmp_path / "c" / "train.jsonl", encoding="utf-8")]
    train_docs = [d + b"#" for d in trained.split(b"#")[:-1]]
    val_docs = [d + b"#" for d in held.split(b"#")[:-1]]
    assert set(val_docs) == {d for d in docs if held_out(np.frombuffer(d, np.uint8), 0.1)} and 15 < len(val_docs) < 45
    assert set(train_docs) == set(docs) - set(val_docs)
    assert loader.totals["repeated"] < data.batch_size  # only the last batch is filled with repeats
    assert data.record()["repeated_rows"] == loader.totals["repeated"]


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _chat_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant"] + [f"w{i}" for i in range(40)]
    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=model, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHATML
    return tok


def _conversations(rows) -> list[tuple]:
    """Each packed document of `rows` (a batch dict) as its (id, label) pairs: documents start at position 0."""
    docs: list[list] = []
    for ids, labels, pos in zip(*(rows[k].tolist() for k in ("input_ids", "labels", "position_ids")), strict=True):
        for token, label, p in zip(ids, labels, pos, strict=True):
            if p == 0:
                docs.append([])
            docs[-1].append((token, label))
    return sorted(tuple(d) for d in docs if any(label != -100 for _, label in d))  # padding: no target


def test_chat_rows_stream_as_the_whole_conversations_the_cache_holds(tmp_path, cache):
    from framework.data.user_chat import ChatData

    folder = tmp_path / "chat"
    folder.mkdir()
    for name, n in (("train", 50), ("validation", 5)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"messages": [
            {"role": "user", "content": " ".join(f"w{(i + k) % 40}" for k in range(1 + i % 5))},
            {"role": "assistant", "content": f"w{i % 40} w{(i * 3) % 40}"}]}) + "\n" for i in range(n)))
    streamed, cached = (ChatData(str(folder), seq_len=48, batch_size=4, streaming=s) for s in (True, False))
    for data in (streamed, cached):
        data.use_tokenizer(_chat_tokenizer())
        data.setup()
    stream = RankStream(open_split(streamed, "train", shuffle=False), streaming.documents_of(streamed, None), 48,
                        True, streamed.split_documents)
    rows = collate(_rows(stream), 48, True, streamed.pad_id, 0)
    packed = cached.train_set
    whole = {k: torch.stack([packed[i][k] for i in range(len(packed))]) for k in ("input_ids", "labels",
                                                                                    "position_ids")}
    assert _conversations(rows) == _conversations(whole) and len(_conversations(rows)) == 50
    assert len(streamed.val_set) == 2 and streamed.record()["streaming"]


# ---- peak memory: a subprocess reads a corpus, then one 10x larger -----------------------------------------------
RSS = r"""
import json, random, resource, sys
from pathlib import Path
root, small, size, seq = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng, words = random.Random(0), ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
def write(folder, files):  # files of `size` bytes, as a sharded corpus is
    folder.mkdir(parents=True)
    for k in range(files):
        with open(folder / f"part-{k:04d}.jsonl", "w") as f:
            n = 0
            while n < size:
                line = json.dumps({"text": " ".join(rng.choices(words, k=rng.randrange(20, 400)))}) + "\n"
                n += f.write(line)
from framework.data.user_text import TextData
out = {}
for name, files in (("small", small), ("large", 10 * small)):
    write(root / name, files)
    data = TextData(source=str(root / name), streaming=True, seq_len=seq, batch_size=16, val_fraction=0.01,
                    cache_dir=str(root / "cache"))
    data.setup()
    loader = data.train_dataloader()
    steps = sum(1 for _ in loader)
    out[name] = {"bytes": files * size, "steps": steps, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
print(json.dumps(out))
"""


def _peaks(tmp_path: Path, files: int, size: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", RSS, str(tmp_path), str(files), str(size), "512"], capture_output=True,
                          text=True, cwd=REPO, timeout=900, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                                  "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# make test-slow (10 s a run): make test holds a streamed single .txt file's traced memory at 10x its size in process
# (tests/data/test_text_files.py) and the map-style epoch order's (same file)
@pytest.mark.slow
@pytest.mark.parametrize("files,size", [(2, 250_000), (10, 1_000_000)])
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path, files, size):
    """Peak RSS (maxrss: the process's high-water mark) after streaming one epoch of `files` files of `size` bytes,
    then after one of 10x as many in the same process: reading 10x more raises the peak by under 10%."""
    out = _peaks(tmp_path, files, size)
    small, large = out["small"], out["large"]
    assert large["steps"] > 9 * small["steps"] > 0
    assert large["peak_kb"] <= 1.1 * small["peak_kb"], out


# ---- a SIGKILLed run resumes to the same next batch ------------------------------------------------------------
TINY = ["recipe=char_lm", "data=text", "data.seq_len=32", "data.batch_size=4", "model.dim=16", "model.depth=1",
        "model.heads=2", "trainer.limit_val_batches=1", "trainer.val_check_interval=null",
        "trainer.check_val_every_n_epoch=1", "threads=1", "callbacks.checkpoint.every_n_train_steps=1",
        "+callbacks.batches._target_=support.batch_log.BatchLog"]


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("streamed,signal", [(True, "SIGKILL"), pytest.param(False, "SIGKILL", marks=pytest.mark.slow),
                                             pytest.param(True, "SIGTERM", marks=pytest.mark.slow)])
def test_a_run_killed_mid_epoch_resumes_to_the_same_next_batch(tmp_path, streamed, signal):
    """SIGKILL: resumed from the last step checkpoint; SIGTERM: from the one the run writes as it stops (before the
    step it had fetched: the position must be the last batch trained on, not the one fetched)."""
    source = corpus(tmp_path / "c", {"train-0": 8, "train-1": 3, "validation": 2})  # ~17 rows: 4 steps an epoch
    args = [*TINY, f"data.source={source}", f"data.streaming={str(streamed).lower()}", "trainer.max_steps=12",
            f"data.cache_dir={tmp_path / 'cache'}"]  # (an argument, not the environment: the CLI is served warm)
    full, cut, resumed = (tmp_path / name for name in ("full", "cut", "resumed"))
    ref = start_cli([*args, f"+callbacks.batches.path={full}.jsonl", f"hydra.run.dir={full}"])
    killed = start_cli([*args, *KILL, "+callbacks.kill.step=6", f"+callbacks.kill.signal_name={signal}",
                        f"+callbacks.batches.path={cut}.jsonl", f"hydra.run.dir={cut}"])
    (code, err), (kcode, kerr) = finish(ref), finish(killed)
    assert code == 0, err[-3000:]
    assert kcode == (-9 if signal == "SIGKILL" else 143), kerr[-3000:]
    ckpt = cut / "checkpoints" / ("last.ckpt" if signal == "SIGKILL" else "interrupted.ckpt")
    step = train_state(ckpt)["global_step"]
    assert step in (6, 7)  # mid-way through the 2nd epoch
    code, err = finish(start_cli([*args, f"ckpt_path={ckpt}", f"+callbacks.batches.path={resumed}.jsonl",
                                  f"hydra.run.dir={resumed}"]))
    assert code == 0, err[-3000:]
    want, got = _log(tmp_path / "full.jsonl"), _log(tmp_path / "resumed.jsonl")
    assert [b["step"] for b in want] == list(range(12)) and [b["step"] for b in got] == list(range(step, 12))
    assert got == want[step:]  # the same batches, bit for bit (a hash of every tensor), from the next one on
    assert _log(tmp_path / "cut.jsonl")[:step] == want[:step]
    assert_same(train_state(full / "checkpoints" / "last.ckpt"), train_state(resumed / "checkpoints" / "last.ckpt"))
    epochs = [b["epoch"] for b in want]
    assert epochs[step - 1] == epochs[step] == 1 and epochs[-1] >= 2  # stopped mid-epoch, the run went on past it


@pytest.mark.slow  # composes the run's config twice (~3 s); the text side's test runs prepare in make test
def test_prepare_prints_where_the_cache_is_and_its_fingerprint_and_a_second_prepare_reuses_it(tmp_path, cache,
                                                                                            monkeypatch, capsys):
    from framework.data import sources
    from framework.data.prepare import main

    folder = corpus(tmp_path / "c", {"train": 30})
    argv = ["prepare", "recipe=char_lm", "data=text", f"data.source={folder}", "data.seq_len=32",
            f"hydra.run.dir={tmp_path / 'unused'}"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert Path(first["cache"]).parent == cache / "text" and Path(first["cache"]).name == first["fingerprint"]
    assert (Path(first["cache"]) / "train" / "tokens.bin").stat().st_size == first["tokens"] > 0
    monkeypatch.setattr(sources, "read_texts", lambda *a, **k: pytest.fail("the second prepare read the source"))
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == first


def test_a_selection_sampler_on_a_stream_is_refused_before_anything_is_written(tmp_path, cli):
    """A stream has no stable row index for a selection sampler to score: one line, exit 2, in the preflight."""
    folder = corpus(tmp_path / "c", {"train": 8})
    run_dir = tmp_path / "run"
    proc = cli("recipe=char_lm", "data=text", f"data.source={folder}", "data.streaming=true", "sampler=infobatch",
               f"hydra.run.dir={run_dir}", env={"FRAMEWORK_SMOKE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["error: sampler=infobatch: a selection sampler scores and re-draws rows by their index, which a "
                     "stream (data.streaming=true) does not have; drop one (data.streaming=false reads the cached "
                     "rows)"], lines
    assert not run_dir.exists()


def test_ranks_share_whole_files_only_when_their_bytes_come_out_even():
    from framework.data.sources import Source
    from framework.data.stream_state import share_strategy

    def source(sizes):
        files = [f"/data/part-{i}.jsonl" for i in range(len(sizes))]
        return Source("corpus/", "json", {"train": files}, tuple((f, n, 0) for f, n in zip(files, sizes, strict=True)))

    assert share_strategy(source([600, 30, 300, 20]), "train", 2) == {"strategy": "examples"}  # 900 vs 50 bytes
    assert share_strategy(source([100, 98, 101, 100]), "train", 2) == {"strategy": "shards"}
    assert share_strategy(source([100, 100, 100]), "train", 2) == {"strategy": "examples"}  # 3 files, 2 ranks
    assert share_strategy(source([100, 5]), "train", 1) == {}


def _with_a_bad_line(folder: Path, at: int = 300) -> Path:
    """A corpus whose train-1.jsonl has a line cut short at line `at` (and a validation split of its own); the
    first 1,000 rows, which the preflight reads, are good."""
    source = corpus(folder, {"train-0": 1200, "train-1": 400, "validation": 3})
    lines = (source / "train-1.jsonl").read_text().splitlines(keepends=True)
    lines[at - 1] = '{"text": "a line cut short\n'
    (source / "train-1.jsonl").write_text("".join(lines))
    return source


def test_a_streamed_bad_line_is_skipped_and_counted_naming_file_and_line(tmp_path, cache, caplog):
    data = TextData(str(_with_a_bad_line(tmp_path / "c")), seq_len=32, batch_size=4, streaming=True)
    data.setup()
    with caplog.at_level("WARNING"):
        rows = sum(len(b["input_ids"]) for b in streaming.train_loader(data))
    record = data.record()
    assert rows > 0 and record["bad_lines"] == 1
    assert record["bad_line_examples"][0].startswith("train-1.jsonl line 300:")
    assert "train-1.jsonl line 300: " in caplog.text and "skipped and counted" in caplog.text


@pytest.mark.slow  # 10 s of a CLI run; make test skips and counts a bad line in process (above)
def test_a_streamed_bad_line_under_strict_stops_as_an_interruption_with_a_checkpoint(tmp_path):
    source = _with_a_bad_line(tmp_path / "c", at=200)
    run = tmp_path / "run"
    plain = [a for a in TINY if not a.startswith(("callbacks.checkpoint", "+callbacks.batches"))]
    proc = start_cli([*plain, f"data.source={source}", "data.streaming=true", "data.strict=true",
                      "trainer.max_steps=800", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run}"])
    code, err = finish(proc, timeout=300)
    assert code == 130, err[-3000:]  # an interruption's exit code, not a refusal's 2
    assert "resume with: python -m framework.train" in err  # the error itself goes through the log (below)
    assert (run / "checkpoints" / "interrupted.ckpt").is_file()
    assert json.loads((run / "results.json").read_text())["status"] == "interrupted"
    assert "line 200 is not a JSON object" in "".join(p.read_text() for p in run.glob("*.log"))
