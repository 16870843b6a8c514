"""DataSpec: what a component learns from its data, read once and filled into the arguments a recipe left unset."""

import functools

from framework.modules.data_spec import DataSpec


class _Data:
    vocab_size, mask_id, pad_id = 20, 3, 0


def _loss(mask_id=None, pad_id=None, lam=1.0):
    return mask_id, pad_id, lam


def test_the_spec_reads_what_the_data_states_and_leaves_the_rest_none():
    spec = DataSpec.of(_Data())
    assert spec == DataSpec(vocab_size=20, mask_id=3, pad_id=0)
    assert spec.known() == {"vocab_size": 20, "mask_id": 3, "pad_id": 0}


def test_complete_fills_only_the_arguments_a_factory_takes_and_left_unset():
    spec = DataSpec.of(_Data())
    assert spec.complete(functools.partial(_loss, lam=0.5))() == (3, 0, 0.5)
    assert spec.complete(functools.partial(_loss, mask_id=7))() == (7, 0, 1.0)  # a value set by the recipe wins
    assert spec.complete(_loss) is _loss  # a built object or plain callable is left as it is
