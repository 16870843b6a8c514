"""GeneratedRows: the one dataset behind needle, kv_recall and pointer_chase."""

import pytest
import torch

from framework.data.kv_recall import kv_rows
from framework.data.needle import needle_rows
from framework.data.pointer_chase import chase_rows
from framework.data.rows import GeneratedRows


def test_generated_rows_are_the_rows_function_called_once_with_the_seeded_generator():
    data = GeneratedRows(needle_rows, 5, seed=3, context_len=8)
    want = needle_rows(5, torch.Generator().manual_seed(3), context_len=8)
    assert len(data) == 5
    for i in range(5):
        assert set(data[i]) == set(want)
        assert all(torch.equal(data[i][k], want[k][i]) for k in want)


def test_tensor_rows_give_tensor_items_and_the_same_seed_the_same_rows():
    a, b = GeneratedRows(chase_rows, 4, seed=1, n_pairs=4), GeneratedRows(chase_rows, 4, seed=1, n_pairs=4)
    assert isinstance(a[0], torch.Tensor)
    assert torch.equal(torch.stack([a[i] for i in range(4)]), torch.stack([b[i] for i in range(4)]))
    c = GeneratedRows(chase_rows, 4, seed=2, n_pairs=4)
    assert not torch.equal(a.rows, c.rows)


def test_kv_rows_pass_their_shape_through():
    data = GeneratedRows(kv_rows, 3, seed=0, n_pairs=4, max_eos=2)
    assert data[2]["tokens"].shape == kv_rows(1, torch.Generator(), n_pairs=4, max_eos=2)["tokens"].shape[1:]


def test_no_rows_is_refused():
    with pytest.raises(ValueError, match="n=0 rows must be >= 1"):
        GeneratedRows(needle_rows, 0, seed=0)
