"""Packing documents into rows: the batch contract of user text, the flat arrays on disk, the atomic cache."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from framework.data import packing
from framework.data.packing import IGNORE, FileArray, PackedRows, cached, pack, token_dtype


def _docs(lengths: list[int], start: int = 1) -> list[tuple[np.ndarray, None]]:
    """Documents whose tokens count up from `start`, so every token is distinct and traceable."""
    out, nxt = [], start
    for n in lengths:
        out.append((np.arange(nxt, nxt + n), None))
        nxt += n
    return out


def _real(row: dict) -> torch.Tensor:
    keep = row["attention_mask"].bool() if "attention_mask" in row else row["labels"] != IGNORE
    return row["input_ids"][keep]


def test_packed_rows_hold_every_token_in_order_with_positions_restarting_per_document(tmp_path):
    docs = _docs([5, 3, 12, 2])  # 22 tokens into rows of 8: the 12-token document crosses two row ends
    rows = pack(docs, tmp_path / "p", seq_len=8, dtype=np.uint16)
    assert len(rows) == 3 and rows.meta["tokens"] == 22 and rows.meta["documents"] == 4
    got = [rows[i] for i in range(3)]
    assert set(got[0]) == {"input_ids", "labels", "position_ids", "index"}
    flat = torch.cat([r["input_ids"] for r in got])[:22]
    assert flat.tolist() == list(range(1, 23))
    assert got[0]["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert got[1]["position_ids"].tolist() == list(range(8))  # the piece that continues is its own document
    assert got[2]["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 0, 1]  # last doc piece, doc 4, then the padding
    for r in got:  # labels are the ids (not shifted), -100 on each document's first token and on the padding
        starts = r["position_ids"] == 0
        assert (r["labels"][starts] == IGNORE).all()
        kept = r["labels"] != IGNORE
        assert torch.equal(r["labels"][kept], r["input_ids"][kept])
    assert got[0]["labels"].tolist() == [IGNORE, 2, 3, 4, 5, IGNORE, 7, 8]
    assert got[2]["labels"].tolist() == [IGNORE, 18, 19, 20, IGNORE, 22, IGNORE, IGNORE]
    assert got[2]["input_ids"][6:].tolist() == [0, 0]  # pad id
    assert [int(r["index"]) for r in got] == [0, 1, 2]
    assert rows.meta["efficiency"] == pytest.approx(22 / 24)


def test_whole_documents_per_row_start_a_new_row_when_they_do_not_fit(tmp_path):
    rows = pack(_docs([5, 3, 6, 11]), tmp_path / "p", seq_len=8, split_documents=False)
    firsts = [rows[i]["input_ids"][0].item() for i in range(len(rows))]
    assert firsts == [1, 9, 15, 23]  # [5+3], [6] (did not fit after 5+3), the 11-token one cut into 8 + 3
    assert rows[1]["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]


def test_unpacked_rows_hold_one_document_each_right_padded_with_an_attention_mask(tmp_path):
    rows = PackedRows(pack(_docs([5, 3, 10]), tmp_path / "p", seq_len=8, packing=False).folder, pad_id=7)
    assert len(rows) == 4  # 5 | 3 | 8 + 2 (a document longer than a row continues in the next)
    r = rows[0]
    assert set(r) == {"input_ids", "labels", "attention_mask", "index"}
    assert r["input_ids"].tolist() == [1, 2, 3, 4, 5, 7, 7, 7]
    assert r["attention_mask"].tolist() == [1] * 5 + [0] * 3
    assert r["labels"].tolist() == [1, 2, 3, 4, 5] + [IGNORE] * 3
    assert [len(_real(rows[i])) for i in range(4)] == [5, 3, 8, 2]


def test_labels_mark_only_the_documents_targets(tmp_path):
    ids = np.arange(10, 16)
    labels = np.where(np.arange(6) < 3, IGNORE, ids)  # a prompt of 3 tokens, then 3 targets
    rows = pack([(ids, labels), (np.arange(20, 22), None)], tmp_path / "p", seq_len=8)
    assert rows.meta["targets"]
    assert rows[0]["labels"].tolist() == [IGNORE, IGNORE, IGNORE, 13, 14, 15, IGNORE, 21]
    with pytest.raises(ValueError, match="labels of shape"):
        pack([(ids, labels[:3])], tmp_path / "q", seq_len=8)


def test_targets_begin_when_a_document_first_masks_a_token_and_cover_the_tokens_before(tmp_path, monkeypatch):
    monkeypatch.setattr(packing, "_FLUSH_TOKENS", 3)  # flushes before and after the first masked document
    ids = np.arange(10, 16)
    docs = [(np.arange(1, 6), None), (ids, np.where(np.arange(6) < 3, IGNORE, ids)), (np.arange(20, 23), None)]
    rows = pack(docs, tmp_path / "p", seq_len=7)
    targets = np.fromfile(tmp_path / "p" / "targets.bin", dtype=np.uint8).tolist()
    assert targets == [1] * 5 + [0, 0, 0, 1, 1, 1] + [1] * 3
    got = [int(t) for i in range(len(rows)) for t in rows[i]["labels"]]
    assert got == [IGNORE, 2, 3, 4, 5, IGNORE, IGNORE, IGNORE, 13, 14, 15, IGNORE, 21, 22]
    assert not (tmp_path / "q").exists() and not pack(docs[:1], tmp_path / "q", seq_len=7).meta["targets"]
    assert not (tmp_path / "q" / "targets.bin").exists()


def test_rows_are_flat_arrays_read_by_position_that_survive_pickling(tmp_path):
    rows = pack(_docs([300] * 4), tmp_path / "p", seq_len=64, dtype=token_dtype(2000))
    raw = np.fromfile(tmp_path / "p" / "tokens.bin", dtype=np.uint16)
    assert raw.tolist() == list(range(1, 1201)) and token_dtype(256) == np.uint8 and token_dtype(70_000) == np.uint32
    assert isinstance(rows.arrays()["tokens"], FileArray)  # read by pread: nothing stays mapped
    again = pickle.loads(pickle.dumps(rows))  # a DataLoader worker gets the paths, and opens its own files
    assert again._arrays is None and torch.equal(again[5]["input_ids"], rows[5]["input_ids"])
    with pytest.raises(ValueError, match="do not fit uint8"):
        pack([(np.array([3, 300]), None)], tmp_path / "q", seq_len=4)


def test_the_cache_is_built_once_and_a_failed_build_leaves_nothing(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "x").write_text("made")

    first, made = cached(tmp_path, "key", build)
    second, again = cached(tmp_path, "key", build)
    assert made and not again and first == second and len(calls) == 1 and (first / "x").read_text() == "made"

    def broken(folder):
        (folder / "half").write_text("partial")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        cached(tmp_path, "other", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]  # neither a final nor a temporary folder left


def test_encode_gives_the_tokenizers_own_ids_and_leaves_a_tokenizer_json_padding_alone():
    """The Rust backend called directly gives what `tokenizer(texts, add_special_tokens=False)` gives; a tokenizer
    whose tokenizer.json turns padding and truncation on is called as transformers calls it (both off)."""
    from support.tiny_chat import CHATML, tiny_tokenizer

    from framework.data.packing import encode

    tok = tiny_tokenizer(CHATML, eos="<|im_end|>")
    texts = ["What is 3 plus 5?", "", "<|im_start|>user\nhi<|im_end|>", "a much longer text " * 20]
    expected = tok(texts, add_special_tokens=False)["input_ids"]
    assert encode(tok, texts) == expected and len({len(ids) for ids in expected}) == 4
    tok.backend_tokenizer.enable_padding(pad_id=0, pad_token="<|im_end|>")
    tok.backend_tokenizer.enable_truncation(max_length=3)
    assert encode(tok, texts) == expected
