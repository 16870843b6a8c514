"""Every transformers entry point the framework's HF parts use, pinned: a release that renames or reshapes one fails
here, naming it, rather than giving users a silently different model. Where transformers offers a public API we use
it (its attention and mask interfaces, `is_backend_compatible`, `set_attn_implementation`, the cache-layer API);
the few private names left (`config._attn_implementation`, the keywords a family hands its attention function) are
pinned by what they do."""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from framework.serving import hf_attention  # noqa: E402


def test_the_attention_and_mask_interfaces_register_and_look_up_by_name():
    from transformers import AttentionInterface, AttentionMaskInterface

    assert "sdpa" in AttentionInterface() and "sdpa" in AttentionMaskInterface()
    assert callable(AttentionInterface()["sdpa"]) and callable(AttentionMaskInterface()["sdpa"])
    hf_attention._register()
    assert AttentionInterface()[hf_attention.NAME] is hf_attention.rlkv_attention
    assert AttentionMaskInterface()[hf_attention.NAME] is AttentionMaskInterface()["sdpa"]
    assert hf_attention.NAME in transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS.valid_keys()


def test_a_model_switches_to_the_registered_function_and_reports_it():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=50)
    model = AutoModelForCausalLM.from_config(config)
    assert type(model).is_backend_compatible() is True
    hf_attention.use_rlkv_attention(model)
    assert model.config._attn_implementation == hf_attention.NAME  # the private read we keep: pinned here
    calls = []
    original = transformers.AttentionInterface()[hf_attention.NAME]
    transformers.AttentionInterface.register(hf_attention.NAME, lambda *a, **k: calls.append(k) or original(*a, **k))
    try:
        model(torch.tensor([[1, 2, 3]]))
    finally:
        transformers.AttentionInterface.register(hf_attention.NAME, original)
    assert calls and {"dropout", "scaling"} <= set(calls[0])  # the keywords our function's signature names


def test_the_cache_layer_api_has_the_methods_and_signatures_the_mixed_cache_implements():
    from transformers.cache_utils import Cache, CacheLayerMixin

    abstract = set(getattr(CacheLayerMixin, "__abstractmethods__", ()))
    layer = hf_attention._cache_layer_class()
    assert abstract <= set(vars(layer)), sorted(abstract - set(vars(layer)))
    params = inspect.signature(CacheLayerMixin.lazy_initialization).parameters
    assert list(params)[:3] == ["self", "key_states", "value_states"]
    assert list(inspect.signature(CacheLayerMixin.get_mask_sizes).parameters)[:2] == ["self", "query_length"]
    assert "layers" in inspect.signature(Cache.__init__).parameters
    cache_update = inspect.getsource(transformers.models.llama.modeling_llama.LlamaAttention.forward)
    assert "kwargs=kwargs" in cache_update  # the attention keywords reach the cache layer (and so the attention)


def test_the_keywords_families_hand_their_attention_are_the_ones_we_carry():
    """A family's window, softcap and sinks reach the attention function under these names; a rename would let
    them fall into **kwargs unseen, so the names are read from the modeling code."""
    sources = {
        "sliding_window": transformers.models.mistral.modeling_mistral.MistralAttention.forward,
        "softcap": transformers.models.gemma2.modeling_gemma2.Gemma2Attention.forward,
        "s_aux": transformers.models.gpt_oss.modeling_gpt_oss.GptOssAttention.forward,
    }
    for keyword, forward in sources.items():
        assert f"{keyword}=" in inspect.getsource(forward), keyword
        assert keyword in inspect.signature(hf_attention.rlkv_attention).parameters
    assert set(sources) == set(hf_attention.CARRIED)
