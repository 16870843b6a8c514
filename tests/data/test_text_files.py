"""Text as users hold it (`framework.data.text_files`, `sources`): one big file read in bounded pieces, what a
document is (`data.sample_by`), compressed files, a byte-order mark, `.md` files, a bad JSON line named by file and
line, nested columns, a single document's held-out tail (cached and streamed), and an epoch's order that is no
Python list."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import tracemalloc

import numpy as np
import pytest

from framework.data import sources, text_files
from framework.data.packing import tail_start
from framework.data.resumable import EpochSampler
from framework.data.user_text import TextData
from framework.errors import InputError

TEXT = "\ufeffFirst line of the first paragraph.\r\nIts second line.\r\n\r\nA second paragraph,\n one line.\n\n\n" \
       "Third.\nx" + "y" * 300 + "\n"
BODY = TEXT[1:].replace("\r\n", "\n")


def _write(path, text=TEXT):
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix)
    if opener:
        with opener(path, "wt", encoding="utf-8", newline="") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


@pytest.mark.parametrize("name", ["a.txt", "a.txt.gz", "a.txt.bz2", "a.txt.xz", "a.md"])
def test_every_file_reads_as_the_same_documents_bom_dropped_newlines_universal(tmp_path, name):
    path = _write(tmp_path / name)
    pieces = list(text_files.documents(path, "document", piece=64))
    assert "".join(pieces) == BODY and max(map(len, pieces)) <= 64 and len(pieces) > 5
    assert all(p.endswith("\n") for p in pieces[:-1] if "\n" in p)  # cut after a line end where a piece has one
    assert list(text_files.documents(path, "line")) == [line for line in BODY.split("\n") if line]
    assert list(text_files.documents(path, "paragraph")) == [
        "First line of the first paragraph.\nIts second line.", "A second paragraph,\n one line.",
        "Third.\nx" + "y" * 300]
    assert sources.resolve(str(path)).builder == "text"


def test_zstd_files_read_by_their_inner_extension(tmp_path):
    zstandard = pytest.importorskip("zstandard")  # the dev extra installs it
    path = tmp_path / "rows.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "one"}\n{"text": "two"}\n'))
    src = sources.resolve(str(path))
    assert src.builder == "json"
    assert [t for b in sources.read_texts(src, "train", "text") for t in b] == ["one", "two"]


def test_one_big_file_trains_held_out_by_pieces_and_a_single_document_by_its_last_tokens(tmp_path, cache):
    one = _write(tmp_path / "one.txt", "just one short document, the whole corpus\n")
    data = TextData(str(one), seq_len=8, batch_size=1)
    data.setup()
    text = b"just one short document, the whole corpus\n"
    keep = tail_start(len(text), 0.05)
    assert (data.meta["train"]["tokens"], data.meta["val"]["tokens"]) == (keep, len(text) - keep) == (39, 3)
    assert bytes(data.val_set[0]["input_ids"][:3].tolist()) == b"us\n"
    assert "last 0.05 of the single document" in data.record()["validation"]

    lines = _write(tmp_path / "lines.txt", "".join(f"line {i}\n" for i in range(40)))
    by_line = TextData(str(lines), seq_len=8, batch_size=1, sample_by="line")
    by_line.setup()
    assert (by_line.meta["train"]["documents"], by_line.meta["val"]["documents"]) == (38, 2)
    with pytest.raises(InputError, match="data.sample_by='sentence'; valid: document, line, paragraph"):
        TextData(str(lines), sample_by="sentence")
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"text": "a"}\n')
    with pytest.raises(InputError, match="data.sample_by=line applies to text files"):
        TextData(str(jsonl), sample_by="line")


def test_a_streamed_single_document_validates_on_its_last_tokens_and_trains_on_the_rest(tmp_path, cache):
    from framework.data import streaming

    one = _write(tmp_path / "one.txt", "just one short document, the whole corpus\n")
    data = TextData(str(one), seq_len=8, batch_size=1, streaming=True)
    data.setup()
    assert data.tails and "last 0.05 of each document" in data.record()["validation"]
    val = b"".join(bytes(r["input_ids"][r["labels"] != -100].tolist()) for r in data.val_set)
    assert val == b"s\n"  # the tail's first token is no target (it starts the document)
    trained = b"".join(bytes(b["input_ids"][0].tolist()).rstrip(b"\0") for b in streaming.train_loader(data))
    assert trained == b"just one short document, the whole corp"


def test_a_folder_reads_md_counts_what_it_leaves_out_and_takes_data_format_for_every_file(tmp_path, caplog):
    (tmp_path / "notes.md").write_text("# a heading\n\nsome notes\n")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG")
    with caplog.at_level("WARNING"):
        src = sources.resolve(str(tmp_path))
    assert [f.rsplit("/", 1)[1] for f in src.files["train"]] == ["notes.md"] and "1 .png file left out" in caplog.text
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.log").write_text("a log line\n")
    with pytest.raises(InputError, match=r"holds no .*it holds 1 .log file: name their format with data.format="):
        sources.resolve(str(other))
    assert sources.resolve(str(other), format="text").files["train"][0].endswith("a.log")


def test_a_bad_json_line_is_named_by_file_and_line_number(tmp_path, cache, capfd):
    path = tmp_path / "big.jsonl"
    lines = [json.dumps({"text": f"row {i} " + "w" * 200}) for i in range(10_000)]
    lines[4999] = '{"text": "a line cut short'
    path.write_text("\n".join(lines) + "\n")
    bad = r"big.jsonl line 5000 is not a JSON object .*'\{\"text\": \"a line cut short'"
    with pytest.raises(InputError, match=bad):
        TextData(str(path), seq_len=64, batch_size=2).setup()
    assert "Failed to load JSON" not in capfd.readouterr().err  # said once, by us


def test_a_nested_column_is_read_by_its_dotted_path(tmp_path, cache):
    path = tmp_path / "nested.jsonl"
    path.write_text("".join(json.dumps({"meta": {"text": f"nested {i}", "n": i}}) + "\n" for i in range(30)))
    src = sources.resolve(str(path))
    assert [t for b in sources.read_texts(src, "train", "meta.text") for t in b][:2] == ["nested 0", "nested 1"]
    with pytest.raises(InputError, match=r"data.column='meta.body' is not a column .*nested: meta.text, meta.n"):
        TextData(str(path), column="meta.body")
    data = TextData(str(path), column="meta.text", seq_len=16, batch_size=2)
    data.setup()
    assert data.meta["train"]["documents"] + data.meta["val"]["documents"] == 30


def test_an_epoch_order_of_a_million_rows_is_never_one_python_list():
    sampler = EpochSampler(1_000_000, batch_size=10, seed=3)
    tracemalloc.start()
    it = iter(sampler)
    first = [next(it) for _ in range(5)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 << 20, peak  # a list of a million ints is about 36 MB
    import torch

    g = torch.Generator().manual_seed(3 * 1_000_003)
    assert first == torch.randperm(1_000_000, generator=g)[:5].tolist()  # the order is unchanged
    assert np.array_equal(np.fromiter(iter(EpochSampler(50, batch_size=5, seed=1)), int),
                          torch.randperm(50, generator=torch.Generator().manual_seed(1_000_003)).numpy())


def test_reading_one_big_file_holds_the_same_memory_at_ten_times_the_size(tmp_path, cache, monkeypatch):
    """Traced allocations (Python and numpy: where file contents would live) while packing into the cache and while
    streaming one epoch of a single .txt file, then of one 10x larger: the peak stays within 10 % (+0.5 MB). The
    buffers are shrunk so that the small file already fills them all (the real sizes: BENCHMARKS.md ## data)."""
    import random

    import datasets  # noqa: F401 - imported before tracing: its import is no part of reading

    from framework.data import file_ids, packing, streaming

    monkeypatch.setattr(text_files, "PIECE", 1 << 13)
    monkeypatch.setattr(packing, "_FLUSH_TOKENS", 1 << 15)
    monkeypatch.setattr(file_ids, "_BLOCK", 1 << 15)
    monkeypatch.setattr(sources.check_utf8, "__defaults__", (None, 1 << 15))
    monkeypatch.setattr(streaming.val_rows, "__defaults__", (8,))  # validation rows read at the start
    rng = random.Random(0)
    block = " ".join(rng.choices(["alpha", "beta", "gamma", "delta\n", "epsilon.\n\n"], k=50_000))
    peaks = {}
    for name, blocks in (("small", 1), ("large", 10)):  # about 0.3 MB, then 3 MB
        path = tmp_path / f"{name}.txt"
        path.write_text(block * blocks)
        for mode in ("prepare", "stream"):
            tracemalloc.start()
            data = TextData(str(path), seq_len=512, batch_size=16, streaming=mode == "stream")
            if mode == "prepare":
                rows = len(PackedRowsOf(data.build()))
            else:
                data.setup()
                rows = 16 * sum(1 for _ in streaming.train_loader(data))
            peaks[(name, mode)] = (tracemalloc.get_traced_memory()[1], rows)
            tracemalloc.stop()
    for mode in ("prepare", "stream"):
        (small, rows_small), (large, rows_large) = peaks[("small", mode)], peaks[("large", mode)]
        assert rows_large > 9 * rows_small > 0
        assert large <= 1.1 * small + 250_000, (mode, peaks)


def PackedRowsOf(folder):  # noqa: N802 - reads like the class it opens
    from framework.data.packing import PackedRows

    return PackedRows(folder / "train")
