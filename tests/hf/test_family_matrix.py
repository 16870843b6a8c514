"""The family matrix: every decoder family of transformers 5 in `hf_models.MATRIX` (tiny configs built offline), each
with what sets its attention apart (sliding windows, attention sinks, logit softcapping, MLA, fused or scaled
projections), checked under RLKV's gates and mixed KV cache against the model itself:

* gates of 1 give the model's own logits under its own attention implementation (eager for Gemma 2 and gpt-oss);
* the mixed cache at s = 0 gives transformers' own `generate()` tokens (its own cache, sliding layers included) on
  a prompt longer than any window, and the model's own logits position by position;
* at s > 0 it gives the hard-gated uncached model's logits, prompt and decode steps, on a window whose sink falls
  out of a sliding layer's reach; the bytes it holds are the theory's (MLA: keys and values at their own dims);
* a left-padded batch gives each row its logits alone;
* OLion and Muon train it.

Growth of the MoE families: tests/growth/test_growth_hf.py. The fast suite runs every check on every family; the
slow variant repeats the cache checks on longer prompts and more decode steps.
"""

from __future__ import annotations

import pytest
import torch
from hf_models import MATRIX

pytest.importorskip("transformers")

from framework.models.hf import HFCausalLM  # noqa: E402
from framework.registry import OPTIMIZERS  # noqa: E402
from framework.serving.decoding import decode  # noqa: E402
from framework.serving.hf_attention import cache_nbytes  # noqa: E402

VOCAB, WINDOW = 300, (1, 3)
FAMILIES = list(MATRIX)


def build(family: str, seed: int = 0) -> HFCausalLM:
    """The family's tiny model in its own attention implementation (transformers' choice), eval mode."""
    torch.manual_seed(seed)
    values = {**MATRIX[family], "vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": None,
              "initializer_range": 0.3}  # weights large enough that attention (windows, caps, sinks) moves the logits
    model = HFCausalLM(config=values, attn_implementation=None).eval()
    with torch.no_grad():  # sink logits of the size a trained gpt-oss has (its init leaves them near 0)
        for name, p in model.hf.named_parameters():
            if name.endswith("self_attn.sinks"):
                p.normal_(0.0, 2.0)
    return model


def tokens(rows: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")


def full_heads(model: HFCausalLM) -> torch.Tensor:
    layers, kv_heads = model.gate_shape
    return (torch.arange(layers * kv_heads).view(layers, kv_heads) % 2 == 0)


def cached_logits(model: HFCausalLM, seq: torch.Tensor, prompt: int, full: torch.Tensor | None) -> tuple:
    """Logits of `seq` through a mixed cache: the prompt in one call, then one token a call."""
    cache = model.mixed_cache(full, window=WINDOW, capacity=seq.shape[1])
    with torch.no_grad():
        steps = [model(seq[:, :prompt], cache=cache)]
        steps += [model(seq[:, t:t + 1], cache=cache) for t in range(prompt, seq.shape[1])]
    return torch.cat(steps, dim=1), cache


def windows(config) -> list[int | None]:
    """Each layer's sliding window, read from the config as transformers does (`layer_types`; Mistral's window
    spans every layer)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    return [window if kind == "sliding_attention" else None for kind in types]


def theory_nbytes(model: HFCausalLM, full: torch.Tensor, length: int, batch: int = 2) -> int:
    """Bytes a mixed cache holds after `length` positions: a full head every position (on a sliding layer the
    window - 1 a later query reaches), a compressed head sink + recent; keys and values at their own head dims."""
    key_dim, value_dim = head_dims(model.hf.config)
    positions = 0
    for layer, window in zip(full, windows(model.hf.config), strict=True):
        kept = min(length, window - 1) if window else length
        positions += int(layer.sum()) * kept + int((~layer).sum()) * min(length, sum(WINDOW))
    return positions * batch * (key_dim + value_dim) * 4


def head_dims(config) -> tuple[int, int]:
    """(key, value) head dims of a config: MLA's own, else head_dim (hidden / heads where there is none)."""
    if getattr(config, "kv_lora_rank", None):
        return config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return dim, dim


@pytest.mark.parametrize("family", FAMILIES)
def test_gates_of_one_are_the_model_under_its_own_attention(family):
    model = build(family)
    ids = tokens(2, 14)
    with torch.no_grad():
        own = model(ids)  # before the gates switch the model to framework_rlkv
        shape = model.gate_shape
        gated = model(ids, gates=torch.ones(shape), window=WINDOW)
        streamed = model(ids, gates=torch.zeros(shape), window=WINDOW)
    close(gated, own, family)
    assert (streamed - own).abs().max() > 1e-3, family  # the prompt passes the window: gates 0 change the model


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mixed_cache_at_s0_gives_generate_tokens_and_the_models_logits(family):
    model = build(family)
    ids = tokens(2, 14)
    with torch.no_grad():
        ref = model.hf.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[:, 14:]
        seq = torch.cat([ids, ref], dim=1)
        own = model(seq)
    assert torch.equal(decode(model, ids, 6, full_heads=None, window=WINDOW), ref), family
    logits, cache = cached_logits(model, seq, 14, None)
    close(logits, own, family)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mixed_cache_at_s_half_is_the_hard_gated_model_and_holds_the_theorys_bytes(family):
    model = build(family)
    seq = tokens(2, 20)
    full = full_heads(model)
    with torch.no_grad():
        gated = model(seq, gates=full.float(), window=WINDOW)
    logits, cache = cached_logits(model, seq, 14, full)
    close(logits, gated, family)
    assert cache_nbytes(cache) == theory_nbytes(model, full, 20), family


@pytest.mark.parametrize("family", FAMILIES)
def test_a_left_padded_batch_gives_each_row_its_logits_alone(family):
    model = build(family)
    long, short = tokens(1, 14, seed=2), tokens(1, 9, seed=3)
    batch = torch.cat([long, torch.cat([torch.zeros(1, 5, dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    full = full_heads(model)
    cache = model.mixed_cache(full, window=WINDOW, capacity=17)
    with torch.no_grad():
        steps = [model(batch, key_padding_mask=mask.bool(), cache=cache)[:, -1:]]
        nxt = tokens(2, 3, seed=4)
        for t in range(3):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            steps.append(model(nxt[:, t:t + 1], key_padding_mask=mask.bool(), cache=cache))
    batched = torch.cat(steps, dim=1)
    for row, alone in enumerate((long, short)):
        solo, _ = cached_logits(model, torch.cat([alone, nxt[row:row + 1]], dim=1), alone.shape[1], full)
        close(batched[row], solo[0, -4:], f"{family} row {row}")


@pytest.mark.parametrize("family", FAMILIES)
def test_olion_and_muon_train_each_family(family):
    batch = tokens(4, 17)
    for name, lr in (("olion", 3e-3), ("muon", 3e-2)):
        model = build(family).train()
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        opt = OPTIMIZERS.build(name, params, lr=lr)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0], (family, name, losses)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_long_prompts_in_small_chunks_keep_every_family_exact(family, monkeypatch):
    """The whole matrix at length: a 40-token prompt attended in chunks of 5 (inside, across and past the window and
    the sink), 12 decode steps: at s = 0 the model's own logits, at s > 0 the hard-gated model's; with
    `prefill="full"` the prompt's logits are the model's own (every head attends to the whole prompt)."""
    from framework.serving.kv_cache import LayerKVCache

    monkeypatch.setattr(LayerKVCache, "prefill_chunk", 5)
    model = build(family)
    seq = tokens(2, 52, seed=5)
    full = full_heads(model)
    with torch.no_grad():
        own = model(seq)
        gated = model(seq, gates=full.float(), window=WINDOW)
    logits, cache = cached_logits(model, seq, 40, None)
    close(logits, own, f"{family} s=0")
    assert cache_nbytes(cache) == theory_nbytes(model, torch.ones_like(full), 52), family
    logits, cache = cached_logits(model, seq, 40, full)
    close(logits, gated, f"{family} s>0")
    assert cache_nbytes(cache) == theory_nbytes(model, full, 52), family
    for layer, window in zip(cache.layers, windows(model.hf.config), strict=True):
        if window and layer.kv.k_full is not None:  # a sliding layer's full heads: a buffer of 2 windows, not 52
            assert layer.kv.k_full.shape[2] <= 2 * window + 1, (family, layer.kv.k_full.shape)
    cache = model.mixed_cache(full, window=WINDOW, prefill="full")
    with torch.no_grad():
        close(model(seq[:, :40], cache=cache), own[:, :40], f"{family} full prefill")


def test_readme_and_the_hf_docs_print_the_matrix_as_tested():
    """Both list every family of the matrix, what sets it apart and what it supports, from this file's table; the
    growth column is what `check_moe` says of each model (the function kept: tests/growth/test_growth_hf.py)."""
    from helpers import REPO
    from hf_models import GROWN, matrix_table

    from framework.grow.hf import check_moe

    for doc in ("docs/guides/your_model.md", "docs/hf_models.md"):
        assert matrix_table() in (REPO / doc).read_text(), f"{doc} lacks the family matrix as tests print it"
    for family in FAMILIES:
        model = build(family)
        if family in GROWN:
            check_moe(model.hf)
        else:
            with pytest.raises(ValueError, match="dense model"):
                check_moe(model.hf)


def test_an_attention_feature_the_gates_cannot_carry_is_refused_by_name(tmp_path, capsys):
    """DeepSeek-V3.2's sparse attention hands its attention `indices`: the gates, the cache and kv_generate refuse
    it by name (one `error:` line, exit 2), never run it as dense attention."""
    from framework.kv_generate import main
    from framework.probes.allocation import HeadAllocation

    values = {**MATRIX["deepseek_v3"], "model_type": "deepseek_v32", "index_topk": 4, "vocab_size": VOCAB,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": None}
    torch.manual_seed(0)
    model = HFCausalLM(config=values).eval()
    ids = tokens(1, 12)
    with pytest.raises(ValueError, match="DeepseekV32Attention hands its attention indices"):
        model(ids, gates=torch.ones(model.gate_shape), window=WINDOW)
    with pytest.raises(ValueError, match="indices|indexer"):  # transformers refuses our cache first
        decode(model, ids, 2, full_heads=None, window=WINDOW)
    model.save_pretrained(tmp_path / "model")
    HeadAllocation.from_gates(torch.rand(model.gate_shape), *WINDOW).save(tmp_path / "pattern")
    assert main([str(tmp_path / "model"), "--pattern", str(tmp_path / "pattern"), "--ids", "5 6 7 8 9", "-n", "2"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "index" in err[0], err
