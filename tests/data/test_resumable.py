import pytest
import torch

from framework.data.resumable import EpochSampler
from framework.data.text import ByteCorpus, corpus_bytes


def test_epoch_order_depends_only_on_seed_and_epoch():
    a, b = EpochSampler(100, batch_size=4, seed=3), EpochSampler(100, batch_size=4, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(list(a)) == sorted(first)
    assert list(EpochSampler(100, batch_size=4, seed=4)) != first


def test_ranks_get_disjoint_equal_length_shards_of_whole_batches():
    shards = [list(EpochSampler(103, batch_size=4, seed=0, rank=r, world_size=2)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 48
    assert not set(shards[0]) & set(shards[1])


def test_skip_batches_resumes_mid_epoch_once():
    s = EpochSampler(40, batch_size=4, seed=1)
    full = list(s)
    s.skip_batches(3)
    assert list(s) == full[12:]
    assert list(s) == full  # the skip applies to one iteration only


def test_too_small_dataset_is_refused_with_sizes():
    with pytest.raises(ValueError, match="3 samples is too short for 2 rank"):
        EpochSampler(3, batch_size=2, world_size=2)


def test_byte_corpus_is_offline_deterministic_and_split_without_overlap():
    raw = corpus_bytes("pydoc")
    assert len(raw) > 400_000 and raw == corpus_bytes("pydoc")
    dm = ByteCorpus(seq_len=64, batch_size=8, max_bytes=20_000)
    dm.setup()
    x = dm.train_set[0]
    assert x.shape == (65,) and x.dtype == torch.long
    assert bytes(x.tolist()) == raw[:65]
    assert len(dm.train_set) * 64 <= 19_000 and len(dm.val_set) >= 1


def test_unknown_corpus_source_lists_valid_ones():
    with pytest.raises(ValueError, match="valid: pydoc, stdlib, both"):
        corpus_bytes("wikipedia")
