"""The one LM shell under `TransformerLM` and `MoETransformerLM`: state_dict keys and the GPT-2 init draw order
pinned against an explicit list (checkpoints and seeded runs of either model must not change), the meta device."""

import math

import pytest
import torch

from framework.models.moe import MoETransformerLM
from framework.models.transformer import TransformerLM

DIM, DEPTH = 16, 2


def dense_matrices(i: int) -> list[str]:
    return [f"blocks.{i}.attn.q", f"blocks.{i}.attn.kv", f"blocks.{i}.attn.proj", f"blocks.{i}.ffn.fc",
            f"blocks.{i}.ffn.proj"]


def moe_matrices(i: int) -> list[str]:
    experts = [f"blocks.{i}.moe.experts.{e}.{part}" for e in range(2) for part in ("fc", "proj")]
    return [f"blocks.{i}.attn.q", f"blocks.{i}.attn.kv", f"blocks.{i}.attn.proj", f"blocks.{i}.moe.router",
            *experts, f"blocks.{i}.moe.shared.fc", f"blocks.{i}.moe.shared.proj"]


CASES = {
    "dense": (lambda: TransformerLM(vocab_size=11, dim=DIM, depth=DEPTH, heads=2, mlp_ratio=2.0), dense_matrices),
    "moe": (lambda: MoETransformerLM(vocab_size=11, dim=DIM, depth=DEPTH, heads=2, num_experts=2, top_k=1,
                                     shared_hidden=8), moe_matrices),
}


@pytest.mark.parametrize("kind", CASES)
def test_keys_and_init_draws_follow_the_gpt2_order_of_the_old_models(kind, monkeypatch):
    build, block_matrices = CASES[kind]
    states = []  # the generator state before each normal_ draw (the embedding's own, then the initialisation's)
    normal_ = torch.nn.init.normal_
    monkeypatch.setattr(torch.nn.init, "normal_", lambda t, *a, **k: (states.append(torch.get_rng_state()),
                                                                      normal_(t, *a, **k))[1])
    torch.manual_seed(0)
    model = build()
    matrices = ["embed"] + [m for i in range(DEPTH) for m in block_matrices(i)] + ["head"]
    norms = [f"{n}.{p}" for n in [f"blocks.{i}.norm{j}" for i in range(DEPTH) for j in (1, 2)] + ["norm"]
             for p in ("weight", "bias")]
    assert sorted(model.state_dict()) == sorted([f"{m}.weight" for m in matrices] + norms)

    draws = len(matrices) + sum(m.endswith("proj") for m in matrices)
    torch.set_rng_state(states[-draws])  # the reference: every matrix ~ N(0, 0.02) in module order, then every
    expected = {f"{m}.weight": torch.empty_like(model.get_parameter(f"{m}.weight")).normal_(0, 0.02)
                for m in matrices}  # residual projection redrawn with std 0.02/sqrt(2·depth), in the same order
    for m in matrices:
        if m.endswith("proj"):
            expected[f"{m}.weight"].normal_(0, 0.02 / math.sqrt(2 * DEPTH))
    for name, want in expected.items():
        assert torch.equal(model.get_parameter(name), want), name


@pytest.mark.parametrize("kind", CASES)
def test_the_meta_device_builds_shapes_without_drawing(kind):
    build, _ = CASES[kind]
    state = torch.get_rng_state()
    with torch.device("meta"):
        model = build()
    assert model.head.weight.is_meta and torch.equal(torch.get_rng_state(), state)


def test_the_moe_model_serves_gated_streaming_attention_like_the_dense_one():
    torch.manual_seed(0)
    model = MoETransformerLM(vocab_size=11, dim=DIM, depth=DEPTH, heads=2, num_experts=2).eval()
    x = torch.randint(0, 11, (1, 8))
    full = torch.ones(DEPTH, 2)
    assert torch.allclose(model(x, gates=full, window=(1, 2)), model(x), atol=1e-6)
    assert not torch.allclose(model(x, gates=torch.zeros(DEPTH, 2), window=(1, 2)), model(x))
