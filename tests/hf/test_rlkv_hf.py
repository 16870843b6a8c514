"""RLKV on transformers models, through transformers' attention interface (no forward method replaced): per-KV-head
gates blend full and streaming attention, and a mixed KV cache (a transformers `Cache`) inside `generate()` gives
HF's own tokens at s = 0 and the hard-gated no-cache model's at s > 0, holds exactly the theory's KV bytes, and
allocates no cache memory while decoding. Tiny configs of each family; nothing downloaded."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import assert_greedy_up_to_rounding
from hf_models import CAUSAL_FAMILIES, save_model
from support import warm_cli

pytest.importorskip("transformers")

from framework.models.hf import HFCausalLM  # noqa: E402
from framework.serving.attention import stream_mask  # noqa: E402
from framework.serving.decoding import decode, decode_uncached  # noqa: E402
from framework.serving.hf_attention import cache_nbytes  # noqa: E402

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "mixtral"]
WINDOW = (1, 4)


def _head_dim(model: HFCausalLM) -> int:
    config = model.hf.config
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _model(family: str, seed: int = 0) -> HFCausalLM:
    torch.manual_seed(seed)
    values = {k: v for k, v in CAUSAL_FAMILIES[family].items()}
    return HFCausalLM(config=values, vocab_size=96).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_gates_blend_full_and_streaming_attention_per_kv_head(family):
    model = _model(family)
    ids = torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    layers, kv_heads = model.gate_shape
    assert (layers, kv_heads) == (2, 2)
    with torch.no_grad():
        plain = model(ids)
        full = model(ids, gates=torch.ones(layers, kv_heads), window=WINDOW)
        streaming = model(ids, gates=torch.zeros(layers, kv_heads), window=WINDOW)
        mask = stream_mask(24, 24, *WINDOW)[None, None].expand(2, 1, 24, 24)  # transformers takes a 4-D mask as is
        reference = model.hf(input_ids=ids, attention_mask=mask).logits
        again = model(ids)
    assert torch.equal(full, plain) and torch.equal(again, plain)  # gates of 1: the model, unchanged
    torch.testing.assert_close(streaming, reference, rtol=0, atol=1e-5)
    assert (streaming - plain).abs().max() > 1e-3  # the window does cut something off
    gates = torch.full((layers, kv_heads), 0.5, requires_grad=True)
    model(ids, gates=gates, window=WINDOW).logsumexp(-1).mean().backward()
    assert gates.grad is not None and bool((gates.grad != 0).all())  # every KV head's gate gets a gradient


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mixed_cache_inside_generate_matches_hf_at_s0_and_the_hard_gated_model_at_s_half(family):
    model = _model(family)
    prompt = torch.randint(3, 96, (3, 12), generator=torch.Generator().manual_seed(2))
    new = 10
    with torch.no_grad():
        own = model.hf.generate(prompt, max_new_tokens=new, do_sample=False, min_new_tokens=new)
        cache = model.mixed_cache(None, WINDOW, capacity=12 + new)
        ours = model.hf.generate(prompt, max_new_tokens=new, do_sample=False, min_new_tokens=new, cache=cache)
    assert torch.equal(ours, own)
    full = torch.tensor([[True, False], [False, True]])
    with torch.no_grad():
        cache = model.mixed_cache(full, WINDOW, capacity=12 + new)
        mixed = model.hf.generate(prompt, max_new_tokens=new, do_sample=False, min_new_tokens=new, cache=cache)
    reference = decode_uncached(model, prompt, new, gates=full.float(), window=WINDOW)
    assert torch.equal(mixed[:, 12:], reference)
    assert torch.equal(decode(model, prompt, new, full_heads=full, window=WINDOW), reference)  # the probes' path
    # what the cache holds: every position for the 2 full heads, sink + recent for the 2 others (fp32, k and v)
    length, head_dim = cache.get_seq_length(), _head_dim(model)
    assert length == 12 + new - 1  # the last token is sampled, never fed back
    assert cache_nbytes(cache) == (2 * length + 2 * sum(WINDOW)) * 2 * 3 * head_dim * 4


def test_decoding_a_thousand_tokens_allocates_no_cache_memory_and_holds_the_theorys_bytes():
    model = _model("llama")
    prompt = torch.randint(3, 96, (1, 16), generator=torch.Generator().manual_seed(3))
    full = torch.tensor([[True, False], [False, False]])
    steps = 1000
    cache = model.mixed_cache(full, WINDOW, capacity=16 + steps)
    head_dim = _head_dim(model)
    with torch.no_grad():
        token = model(prompt, cache=cache)[:, -1:].argmax(-1)
        buffers = [(layer.kv.k_full, layer.kv.v_full, layer.kv.k_stream, layer.kv.v_stream) for layer in cache.layers]
        pointers = [tuple(-1 if b is None else b.data_ptr() for b in group) for group in buffers]
        for step in range(steps):
            token = model(token, cache=cache)[:, -1:].argmax(-1)
            if step in (0, 499, steps - 1):
                length = 16 + step + 1
                assert cache_nbytes(cache) == (length + 3 * sum(WINDOW)) * 2 * head_dim * 4
    after = [tuple(-1 if b is None else b.data_ptr() for b in (layer.kv.k_full, layer.kv.v_full, layer.kv.k_stream,
                                                                layer.kv.v_stream)) for layer in cache.layers]
    assert after == pointers  # every step wrote in place into the buffers the prefill made


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_under_bf16_autocast_the_cache_keeps_keys_and_values_in_the_dtypes_hf_caches_them(family):
    """In a bf16-mixed run (the probes' evaluation, every GPU size) a transformers layer hands its cache a rotated
    key in float32 and a value in bfloat16. The mixed cache stores each as given, as HF's own cache does, counts
    its bytes at each dtype, and decodes what the hard-gated model computes under the same autocast."""
    from transformers import DynamicCache

    model = _model(family)
    prompt = torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(4))
    full = torch.tensor([[True, False], [False, True]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        own = DynamicCache(config=model.hf.config)
        model.hf(prompt, cache=own)
        cache = model.mixed_cache(full, WINDOW, capacity=20)
        cached = torch.cat([model(prompt, cache=cache)] + [model(prompt[:, t : t + 1], cache=cache)
                                                           for t in range(8)], dim=1)
        reference = model(torch.cat([prompt, prompt[:, :8]], 1), gates=full.float(), window=WINDOW)
    k_dtype, v_dtype = own.layers[0].keys.dtype, own.layers[0].values.dtype
    for layer in cache.layers:
        assert (layer.kv.k_full.dtype, layer.kv.v_full.dtype) == (k_dtype, v_dtype)
        assert (layer.kv.k_stream.dtype, layer.kv.v_stream.dtype) == (k_dtype, v_dtype)
    sizes = k_dtype.itemsize + v_dtype.itemsize
    assert cache_nbytes(cache) == (2 * 20 + 2 * sum(WINDOW)) * 2 * _head_dim(model) * sizes  # 2 layers x 1 full
    # the same bf16 computations as the no-cache forward, in another order: apart by bf16 rounding only
    assert (cached.float() - reference.float()).abs().max() <= 0.05 * reference.float().abs().max()


def _left_padded(lengths: list[int], seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Rows of the given lengths, left-padded with id 0 to the longest: (rows, ids, attention mask)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, 96, (n,), generator=g) for n in lengths]
    ids, mask = torch.zeros(len(rows), max(lengths), dtype=torch.long), torch.zeros(len(rows), max(lengths), dtype=bool)
    for r, row in enumerate(rows):
        ids[r, ids.shape[1] - len(row):], mask[r, ids.shape[1] - len(row):] = row, True
    return rows, ids, mask


@pytest.mark.parametrize(("family", "window", "prefill", "chunk"), [
    ("llama", (1, 4), "streaming", 1024), ("qwen3", (2, 3), "streaming", 4), ("mixtral", (0, 5), "full", 1024),
    ("llama", (4, 16), "streaming", 5),
])
def test_a_left_padded_batch_gives_each_row_what_it_gives_alone(family, window, prefill, chunk, monkeypatch):
    """Rows of 12, 7 and 3 tokens in one left-padded batch (the 3-token row shorter than the window), then 10
    one-token steps: every row's logits are its logits decoded alone, and (streaming prefill) the hard-gated
    model's without a cache: each row keeps its own sink and recent window, counted from its first token. Chunked
    prompts (`prefill_chunk` 4 and 5) give the same."""
    from framework.serving.kv_cache import LayerKVCache

    monkeypatch.setattr(LayerKVCache, "prefill_chunk", chunk)
    model = _model(family)
    full = torch.tensor([[True, False], [False, True]])
    rows, ids, mask = _left_padded([12, 7, 3], seed=5)
    steps = torch.randint(3, 96, (3, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        cache = model.mixed_cache(full, window, capacity=22, prefill=prefill)
        logits = [model(ids, key_padding_mask=mask, cache=cache)]
        for s in range(10):
            mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.bool)], dim=1)
            logits.append(model(steps[:, s : s + 1], key_padding_mask=mask, cache=cache))
        batched = torch.cat(logits, dim=1)
        for r, row in enumerate(rows):
            alone_cache = model.mixed_cache(full, window, capacity=len(row) + 10, prefill=prefill)
            alone = torch.cat([model(row[None], cache=alone_cache)]
                              + [model(steps[r : r + 1, s : s + 1], cache=alone_cache) for s in range(10)], dim=1)
            mine = batched[r : r + 1, ids.shape[1] - len(row):]
            scale = alone.abs().max()
            assert (mine - alone).abs().max() <= 1e-5 * scale  # the same sums in other kernels: rounding apart
            if prefill == "streaming":
                gated = model(torch.cat([row, steps[r]])[None], gates=full.float(), window=window)
                assert (mine - gated).abs().max() <= 1e-5 * scale
    assert bool(batched.isfinite().all())


def test_generate_decodes_a_left_padded_batch_and_refuses_right_padding():
    model = _model("qwen2")
    full = torch.tensor([[False, True], [False, False]])
    rows, ids, mask = _left_padded([10, 4], seed=7)
    with torch.no_grad():
        cache = model.mixed_cache(full, WINDOW, capacity=18)
        out = model.hf.generate(ids, attention_mask=mask.long(), max_new_tokens=8, min_new_tokens=8,
                                do_sample=False, cache=cache, pad_token_id=0)
    for r, row in enumerate(rows):  # each row's greedy tokens are the hard-gated model's for that row alone
        assert_greedy_up_to_rounding(model, row[None], out[r : r + 1, 10:], gates=full.float(), window=WINDOW)
    right = mask.flip(1)
    with pytest.raises(ValueError, match="the mixed KV cache takes left-padded prompts"):
        model(ids.flip(1), key_padding_mask=right, cache=model.mixed_cache(full, WINDOW))
    cache = model.mixed_cache(full, WINDOW)
    model(ids, key_padding_mask=mask, cache=cache)
    with pytest.raises(ValueError, match="after a left-padded prompt the mixed KV cache takes one token per call"):
        model(ids[:, :2], key_padding_mask=torch.ones(2, 12, dtype=torch.bool), cache=cache)


def test_a_model_outside_the_attention_interface_and_a_wrong_pattern_shape_are_refused():
    gpt_neo = HFCausalLM(config={"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                                 "attention_types": [[["global"], 2]], "max_position_embeddings": 64}, vocab_size=50,
                         attn_implementation="eager")
    with pytest.raises(ValueError, match="GPTNeoForCausalLM does not route its attention through transformers' "
                                         "AttentionInterface"):
        gpt_neo.gate_shape  # noqa: B018
    model = _model("llama")
    with pytest.raises(ValueError, match=r"full_heads of shape \(3, 2\) do not fit LlamaForCausalLM: expected "
                                         r"\(layers, kv_heads\) = \(2, 2\)"):
        model.mixed_cache(torch.ones(3, 2, dtype=torch.bool), WINDOW)
    with pytest.raises(ValueError, match=r"gates of shape \(2, 4\) do not fit"):
        model(torch.zeros(1, 4, dtype=torch.long), gates=torch.ones(2, 4), window=WINDOW)


# make test-slow: make test's small run of the kv_cache guide (tests/hf/test_readme_hf.py) probes a model by name
# with module=duo_attention and checks its weights were pushed as loaded, with the allocation in both layouts
@pytest.mark.slow
def test_duoattentions_probe_runs_on_an_hf_model_by_name_and_keeps_its_weights(tmp_path):
    """`recipe=rlkv_probe module=duo_attention` on a Llama folder (the pointer-chase task in its tokenizer's tokens;
    its final hidden states distilled): the loaded weights are probed as they are, never pretrained, and the
    allocation is written in both layouts. (README's serving section runs `module=rlkv` and pushes it.)"""
    from safetensors.torch import load_file

    from framework.probes.allocation import HeadAllocation

    folder = save_model("llama", tmp_path / "llama")
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FRAMEWORK_SMOKE": "1"}
    args = ["recipe=rlkv_probe", "module=duo_attention", "model=hf_causal_lm", f"model.name_or_path={folder}",
            f"hydra.run.dir={run}"]
    proc = warm_cli.run("framework.train", args, env, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alloc = HeadAllocation.load(run)
    assert alloc.shape == (2, 2) and alloc.method == "duo_attention"
    assert HeadAllocation.load(run / "attn_pattern").gates == alloc.gates
    assert json.loads((run / "attn_pattern" / "config.json").read_text())["sink_size"] == 1
    results = json.loads((run / "results.json").read_text())
    assert results["global_step"] > 0 and "pretrain_steps" not in json.dumps(results.get("metrics", {}))
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    saved = load_file(str(folder / "model.safetensors"))
    assert all(torch.equal(state[f"model.hf.{k}"], v) for k, v in saved.items())  # probed as loaded, not trained
