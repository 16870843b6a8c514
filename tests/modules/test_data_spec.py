"""DataSpec: what a component learns from its data, read once and filled into the arguments a recipe left unset."""

import functools

import pytest
import torch

from framework.models.transformer import TransformerLM
from framework.modules.causal_lm import CausalLM
from framework.modules.data_spec import DataSpec
from framework.probes.duo_attention import DuoAttentionProbe


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


class _PromptData:
    vocab_size, pad_id, prompt_length, max_new_tokens, eos_id = 12, 0, 5, 3, 2


def test_prompt_facts_fill_only_arguments_that_ask_for_the_data():
    spec = DataSpec.of(_PromptData())
    assert spec.known() == {"vocab_size": 12, "pad_id": 0, "prompt_length": 5, "max_new_tokens": 3, "eos_id": 2}
    probe = spec.complete(functools.partial(DuoAttentionProbe))
    assert {k: probe.keywords[k] for k in ("prompt_length", "max_new_tokens", "eos_id", "pad_id")} == {
        "prompt_length": 5, "max_new_tokens": 3, "eos_id": 2, "pad_id": 0}
    lm = spec.complete(functools.partial(CausalLM))  # prompt_length=0 (score every token) is not a blank
    assert "prompt_length" not in lm.keywords and lm.keywords["vocab_size"] == 12


def test_a_probe_built_outside_train_reads_the_datamodule_spec_in_setup():
    torch.manual_seed(0)
    probe = DuoAttentionProbe(TransformerLM(vocab_size=12, dim=16, depth=1, heads=2), eos_id=7)
    probe._trainer = type("Trainer", (), {"datamodule": _PromptData()})()
    probe.setup("fit")
    assert (probe.prompt_length, probe.max_new_tokens, probe.eos_id, probe.pad_id) == (5, 3, 7, 0)  # passed wins
    bare = DuoAttentionProbe(TransformerLM(vocab_size=12, dim=16, depth=1, heads=2))
    bare._trainer = type("Trainer", (), {"datamodule": _Data()})()
    with pytest.raises(ValueError, match="DuoAttentionProbe needs prompt_length, max_new_tokens, eos_id:"):
        bare.setup("fit")
