"""Head allocations in DuoAttention's and RLKV's own file layout, both ways: what we write is what a reader written
from DuoAttention's format description reads (a layers × KV heads matrix, tab-separated, one layer per line, values
clipped to [0, 1]; `config.json` with `sink_size` / `recent_size`), and files in their layouts (RLKV's
`adapter_weights.tsv` with slightly negative values included) load into an allocation and a mixed cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from framework.models.transformer import TransformerLM
from framework.probes.allocation import HeadAllocation
from framework.serving.decoding import decode, decode_uncached


def read_duo_pattern(folder) -> tuple[np.ndarray, int, int]:
    """DuoAttention's reader, from its format description: `full_attention_heads.tsv` via numpy with a tab
    delimiter, clipped to [0, 1]; the window from `config.json`."""
    heads = np.clip(np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t"), 0, 1)
    config = json.loads((folder / "config.json").read_text())
    return heads, config["sink_size"], config["recent_size"]


def test_what_we_write_duoattention_reads_back_and_so_do_we(tmp_path):
    gates = torch.tensor([[0.91, 0.125], [0.3, 1.0], [0.0, 0.55]])
    alloc = HeadAllocation.from_gates(gates, sink=4, recent=64, sparsity=0.5, method="rlkv")
    alloc.save(tmp_path)
    heads, sink, recent = read_duo_pattern(tmp_path / "attn_pattern")
    assert (sink, recent) == (4, 64) and heads.shape == (3, 2)
    assert heads.tolist() == alloc.gates  # 18 significant digits: the float32 gates' doubles come back exactly
    rlkv = np.loadtxt(tmp_path / "attn_pattern" / "adapter_weights.tsv", delimiter="\t")
    assert rlkv.tolist() == alloc.gates
    again = HeadAllocation.load(tmp_path / "attn_pattern")
    assert again.gates == alloc.gates and again.window == (4, 64) and again.method == "rlkv"
    assert torch.equal(again.full_heads(0.5), alloc.full_heads(0.5))


def test_rlkv_and_duoattention_files_load_clipped_into_an_allocation_and_a_mixed_cache(tmp_path):
    """RLKV's adapter weights may be slightly negative (its L1 pull) and come without a config: the window is
    passed; DuoAttention's come with `config.json`. Both drive a mixed cache on a model of their shape."""
    rng = np.random.default_rng(0)
    scores = rng.uniform(-0.02, 1.0, (2, 2))
    scores[0, 1], scores[1, 0] = -0.013, 0.9
    (tmp_path / "rlkv").mkdir()
    np.savetxt(tmp_path / "rlkv" / "adapter_weights.tsv", scores, delimiter="\t")
    with pytest.raises(ValueError, match="has no config.json with sink_size and recent_size"):
        HeadAllocation.from_pattern(tmp_path / "rlkv")
    rlkv = HeadAllocation.from_pattern(tmp_path / "rlkv", sink=1, recent=4)
    assert rlkv.method == "rlkv" and rlkv.gates[0][1] == 0.0 and min(min(r) for r in rlkv.gates) >= 0.0
    (tmp_path / "duo").mkdir()
    np.savetxt(tmp_path / "duo" / "full_attention_heads.tsv", np.clip(scores, 0, 1) * 1.5, delimiter="\t")
    (tmp_path / "duo" / "config.json").write_text(json.dumps({"sink_size": 1, "recent_size": 4, "lr": 0.02}))
    duo = HeadAllocation.load(tmp_path / "duo")
    assert duo.method == "duo_attention" and duo.window == (1, 4) and max(max(r) for r in duo.gates) == 1.0
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=16, dim=32, depth=2, heads=4, kv_heads=2, max_seq_len=64).eval()
    prompt = torch.randint(0, 16, (2, 10), generator=torch.Generator().manual_seed(1))
    for alloc in (rlkv, duo):
        alloc.check_model(model)
        full = alloc.full_heads(0.5)
        assert int(full.sum()) == 2
        assert torch.equal(decode(model, prompt, 6, full_heads=full, window=alloc.window),
                           decode_uncached(model, prompt, 6, gates=full.float(), window=alloc.window))


def test_a_pattern_of_the_wrong_shape_or_a_malformed_file_is_refused_naming_it(tmp_path):
    (tmp_path / "adapter_weights.tsv").write_text("0.5\t0.2\n0.1\n")
    with pytest.raises(ValueError, match=r"adapter_weights.tsv: rows of \[1, 2\] values"):
        HeadAllocation.from_pattern(tmp_path, sink=1, recent=4)
    (tmp_path / "adapter_weights.tsv").write_text("0.5\tnan-ish\n")
    with pytest.raises(ValueError, match=r"line 1: .* is not a row of numbers"):
        HeadAllocation.from_pattern(tmp_path, sink=1, recent=4)
    (tmp_path / "adapter_weights.tsv").write_text("0.5\t0.2\t0.7\n0.1\t0.9\t0.3\n")
    alloc = HeadAllocation.from_pattern(tmp_path, sink=1, recent=4)
    model = TransformerLM(vocab_size=16, dim=32, depth=2, heads=4, kv_heads=2, max_seq_len=64)
    with pytest.raises(ValueError, match=r"this allocation is for layers × kv_heads = \(2, 3\), the model has "
                                         r"\(2, 2\)"):
        alloc.check_model(model)
