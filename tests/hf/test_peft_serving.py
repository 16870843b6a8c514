"""A LoRA fine-tuned model under RLKV's gates and the mixed KV cache, with its adapters attached and merged into its
weights: each serves as its base does (gates of 1 are the model, a window cuts what a 4-D streaming mask cuts, the
mixed cache inside `generate()` gives the model's own tokens with every head full and the hard-gated model's
otherwise), and the merged model gives the adapter model's logits and tokens."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_greedy_up_to_rounding

pytest.importorskip("peft")

from framework.models.hf import HFCausalLM  # noqa: E402
from framework.models.peft_adapters import LoRA, attach, merged_state  # noqa: E402
from framework.serving.attention import stream_mask  # noqa: E402
from framework.serving.decoding import decode, decode_uncached  # noqa: E402

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128}
WINDOW = (1, 4)


def base(seed: int = 0) -> HFCausalLM:
    torch.manual_seed(seed)
    return HFCausalLM(config=LLAMA, vocab_size=96).eval()


@pytest.fixture(scope="module")
def adapted() -> HFCausalLM:
    """The base with LoRA on every linear layer, its B factors drawn so the adapters change the model (as training
    would: B starts at 0)."""
    model = base()
    attach(model, LoRA(r=4, alpha=8.0, dropout=0.0))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def test_the_adapter_model_takes_gates_as_its_base_does(adapted):
    ids = torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    layers, kv_heads = adapted.gate_shape
    with torch.no_grad():
        plain = adapted(ids)
        full = adapted(ids, gates=torch.ones(layers, kv_heads), window=WINDOW)
        streaming = adapted(ids, gates=torch.zeros(layers, kv_heads), window=WINDOW)
        mask = stream_mask(24, 24, *WINDOW)[None, None].expand(2, 1, 24, 24)
        reference = adapted.hf(input_ids=ids, attention_mask=mask).logits
        untouched = base()(ids)
    assert (plain - untouched).abs().max() > 1e-2  # the adapters are in the path
    assert torch.equal(full, plain)
    torch.testing.assert_close(streaming, reference, rtol=0, atol=1e-5)
    gates = torch.full((layers, kv_heads), 0.5, requires_grad=True)
    adapted(ids, gates=gates, window=WINDOW).logsumexp(-1).mean().backward()
    assert gates.grad is not None and bool((gates.grad != 0).all())  # a probe's gradient reaches every gate


def test_the_mixed_cache_serves_the_adapter_model_and_its_merge_alike(adapted):
    """Every head full: `generate()` with the mixed cache gives the adapter model's own greedy tokens; two heads full:
    the hard-gated model's (no cache). The merged model (W + scale·B·A) gives the same logits, and the same tokens
    under the same cache."""
    prompt = torch.randint(3, 96, (3, 12), generator=torch.Generator().manual_seed(2))
    new = 10
    merged = base()
    merged.load_state_dict(merged_state(adapted.state_dict(), adapted.peft_spec.record()))
    full = torch.tensor([[True, False], [False, True]])
    with torch.no_grad():
        torch.testing.assert_close(merged(prompt), adapted(prompt), rtol=1e-4, atol=1e-5)
        own = adapted.hf.generate(prompt, max_new_tokens=new, do_sample=False, min_new_tokens=new)
        cached = adapted.hf.generate(prompt, max_new_tokens=new, do_sample=False, min_new_tokens=new,
                                     cache=adapted.mixed_cache(None, WINDOW, capacity=12 + new))
        mixed = {}
        for name, model in (("adapter", adapted), ("merged", merged)):
            cache = model.mixed_cache(full, WINDOW, capacity=12 + new)
            mixed[name] = model.hf.generate(prompt, max_new_tokens=new, do_sample=False, min_new_tokens=new,
                                            cache=cache)[:, 12:]
    assert torch.equal(cached, own)
    reference = decode_uncached(adapted, prompt, new, gates=full.float(), window=WINDOW)
    assert torch.equal(mixed["adapter"], reference)
    assert torch.equal(decode(adapted, prompt, new, full_heads=full, window=WINDOW), reference)  # the probes' path
    # the merged weights differ from W + B·A in the last bits: its tokens are the adapter model's up to near-ties
    assert_greedy_up_to_rounding(adapted, prompt, mixed["merged"], gates=full.float(), window=WINDOW)
