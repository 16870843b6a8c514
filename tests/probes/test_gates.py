"""Per-KV-head gates in the transformer: limits, the streaming mask, GQA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from framework.models.transformer import TransformerLM, apply_rotary
from framework.serving.attention import stream_mask


def tiny(kv_heads: int | None = None, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(vocab_size=30, dim=32, depth=2, heads=4, kv_heads=kv_heads, max_seq_len=64).eval()


def reference_streaming_logits(model: TransformerLM, idx: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    """An independent forward pass where every head attends only to sink + recent keys (explicit softmax)."""
    t = idx.shape[1]
    cos, sin = model.rope_cos[:t], model.rope_sin[:t]
    allowed = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(i + 1):
            allowed[i, j] = j < sink or i - j < recent
    x = model.embed(idx)
    for block in model.blocks:
        a = block.attn
        h = block.norm1(x)
        b = h.shape[0]
        q = a.q(h).view(b, t, a.heads, a.head_dim).transpose(1, 2)
        k, v = a.kv(h).view(b, t, 2, a.kv_heads, a.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        group = a.heads // a.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) / a.head_dim**0.5
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + a.proj(out)
        x = x + block.ffn(block.norm2(x))
    return model.head(model.norm(x))


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_gates_all_one_equal_the_base_model(kv_heads):
    model = tiny(kv_heads)
    idx = torch.randint(0, 30, (3, 40))
    gates = torch.ones(2, kv_heads or 4)
    diff = (model(idx, gates=gates, window=(1, 4)) - model(idx)).abs().max()
    assert diff < 1e-5


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_gates_all_zero_equal_pure_sink_plus_recent_attention(kv_heads):
    model = tiny(kv_heads)
    idx = torch.randint(0, 30, (3, 40))
    gated = model(idx, gates=torch.zeros(2, kv_heads or 4), window=(2, 5))
    reference = reference_streaming_logits(model, idx, sink=2, recent=5)
    assert (gated - reference).abs().max() < 1e-4
    assert (gated - model(idx)).abs().max() > 1e-3  # streaming really differs from full attention here


def test_attention_output_is_linear_in_alpha_between_the_two_limits():
    model = tiny()
    attn, x = model.blocks[0].attn, torch.randn(2, 24, 32)
    cs = (model.rope_cos[:24], model.rope_sin[:24])
    full = attn(x, *cs, gates=torch.ones(4), window=(1, 4))
    stream = attn(x, *cs, gates=torch.zeros(4), window=(1, 4))
    quarter = attn(x, *cs, gates=torch.full((4,), 0.25), window=(1, 4))
    assert torch.allclose(quarter, 0.25 * full + 0.75 * stream, atol=1e-6)
    assert torch.equal(full, attn(x, *cs))  # alpha = 1 adds exactly 0 x streaming


def test_streaming_mask_row_ten_with_sink_one_recent_four_allows_exactly_0_7_8_9_10():
    mask = stream_mask(11, 11, sink=1, recent=4)
    assert mask[10].nonzero().flatten().tolist() == [0, 7, 8, 9, 10]
    assert mask[2].nonzero().flatten().tolist() == [0, 1, 2]  # short rows are plain causal
    assert not mask.triu(diagonal=1).any()  # never the future
    offset = stream_mask(1, 11, sink=1, recent=4, offset=10)  # one decoding query at position 10
    assert torch.equal(offset[0], mask[10])


def test_one_gate_per_kv_head_is_shared_by_every_query_head_of_its_group():
    model = tiny(kv_heads=2)
    attn = model.blocks[0].attn
    x = torch.randn(2, 20, 32)
    cos, sin = model.rope_cos[:20], model.rope_sin[:20]
    per_head = {}

    def capture(name):
        def hook(module, args):
            per_head[name] = args[0].view(2, 20, 4, 8)  # (batch, t, query heads, head_dim) before the projection
        return hook

    for name, gates in (("full", torch.ones(2)), ("stream", torch.zeros(2)), ("mixed", torch.tensor([0.0, 1.0]))):
        handle = attn.proj.register_forward_pre_hook(capture(name))
        attn(x, cos, sin, gates=gates, window=(1, 3))
        handle.remove()
    # KV head 0 serves query heads 0 and 1 (streaming here); KV head 1 serves query heads 2 and 3 (full)
    assert torch.allclose(per_head["mixed"][:, :, :2], per_head["stream"][:, :, :2], atol=1e-6)
    assert torch.allclose(per_head["mixed"][:, :, 2:], per_head["full"][:, :, 2:], atol=1e-6)
    assert not torch.allclose(per_head["stream"], per_head["full"], atol=1e-4)


def test_gates_of_the_wrong_shape_or_window_are_refused_with_the_expected_shape():
    model = tiny(kv_heads=2)
    idx = torch.randint(0, 30, (1, 8))
    with pytest.raises(ValueError, match=r"expected \(depth, kv_heads\) = \(2, 2\)"):
        model(idx, gates=torch.ones(2, 4), window=(1, 4))  # one per query head is wrong under GQA
    with pytest.raises(ValueError, match="recent >= 1"):
        model(idx, gates=torch.ones(2, 2), window=(1, 0))
    with pytest.raises(ValueError, match="causal=False"):
        bidirectional = TransformerLM(vocab_size=30, dim=32, depth=1, heads=4, causal=False)
        bidirectional(idx, gates=torch.ones(1, 4), window=(1, 4))


def test_gradients_reach_the_gates_through_a_frozen_model():
    model = tiny(kv_heads=2).requires_grad_(False)
    gates = torch.full((2, 2), 0.7, requires_grad=True)
    idx = torch.randint(0, 30, (2, 30))
    logits = model(idx[:, :-1], gates=gates, window=(1, 4))
    F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
    assert gates.grad is not None and gates.grad.abs().min() > 0
    assert all(p.grad is None for p in model.parameters())
