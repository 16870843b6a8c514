"""The MoE transformer: router conventions, the load-balancing loss and its gradient path, rebuild by config."""

import copy

import pytest
import torch

from framework.models.moe import ROUTERS, MoE, MoETransformerLM, load_balancing_loss, route


def tiny(**kw):
    torch.manual_seed(0)
    return MoETransformerLM(vocab_size=50, dim=32, depth=2, heads=4, num_experts=4, top_k=2, **kw)


@pytest.mark.parametrize("router", [r for r in ROUTERS if r != "softmax_topk" and r != "sigmoid_topk"])
def test_normalised_router_weights_sum_to_one_over_the_top_k(router):
    logits = torch.randn(64, 6)
    weights, idx, probs = route(logits, 3, router)
    assert weights.shape == idx.shape == (64, 3)
    assert torch.allclose(weights.sum(-1), torch.ones(64), atol=1e-6)
    assert torch.allclose(probs.sum(-1), torch.ones(64), atol=1e-6)
    assert torch.equal(idx.sort(-1).values, logits.topk(3, -1).indices.sort(-1).values)  # same experts chosen


def test_softmax_topk_without_renorm_keeps_the_full_softmax_mass_and_sigmoid_topk_the_raw_scores():
    logits = torch.randn(16, 6)
    weights, idx, _ = route(logits, 2, "softmax_topk")
    assert torch.allclose(weights, logits.softmax(-1).gather(1, idx))
    assert (weights.sum(-1) < 1).all()
    weights, idx, _ = route(logits, 2, "sigmoid_topk")
    assert torch.allclose(weights, logits.sigmoid().gather(1, idx))


def test_bad_router_names_the_value_and_the_valid_ones():
    with pytest.raises(ValueError, match="router='softmax_top1'.*valid: softmax_topk, softmax_topk_renorm"):
        tiny(router="softmax_top1")
    with pytest.raises(ValueError, match="top_k=5 must be between 1 and num_experts=4"):
        MoE(8, 4, 5, 16)


def test_balance_loss_is_one_when_perfectly_balanced_and_grows_with_collapse():
    even = torch.full((8, 4), 0.25)
    idx = torch.arange(8).remainder(4)[:, None]
    assert load_balancing_loss(even, idx, 4).item() == pytest.approx(1.0)
    collapsed = torch.tensor([[1.0, 0, 0, 0]]).repeat(8, 1)
    assert load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long), 4).item() == pytest.approx(4.0)


def test_aux_loss_changes_gradients_but_never_the_output():
    x = torch.randint(0, 50, (2, 12))
    with_aux, without = tiny(aux_loss_coef=0.5), tiny(aux_loss_coef=0.0)
    a, b = with_aux(x), without(x)
    assert torch.equal(a, b)
    a.sum().backward()
    b.sum().backward()
    ga, gb = with_aux.blocks[0].moe.router.weight.grad, without.blocks[0].moe.router.weight.grad
    assert not torch.allclose(ga, gb)
    assert 1.0 <= with_aux.aux_loss().item() <= 4.0  # E·Σ f·P lies in [1, E]


def test_aux_gradient_equals_the_gradient_of_coef_times_the_balance_loss():
    torch.manual_seed(0)
    x = torch.randn(2, 10, 8)
    layer = MoE(8, 4, 2, 16, aux_loss_coef=0.5)
    layer(x).sum().backward()
    plain = copy.deepcopy(layer)
    plain.aux_loss_coef = 0.0
    plain.zero_grad()
    _, idx, probs = route(plain.router(x.reshape(-1, 8)), 2, plain.router_type)
    (plain(x).sum() + 0.5 * load_balancing_loss(probs, idx, 4)).backward()
    assert torch.allclose(layer.router.weight.grad, plain.router.weight.grad, atol=1e-6)


def test_causal_moe_output_at_t_ignores_tokens_after_t():
    model = tiny().eval()
    x = torch.randint(0, 50, (2, 12))
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 1) % 50
    assert torch.allclose(model(x)[:, :7], model(y)[:, :7], atol=1e-6)


def test_init_config_rebuilds_the_same_shapes_and_every_expert_is_its_own_matrix():
    model = tiny(shared_hidden=16, kv_heads=2)
    clone = MoETransformerLM(**model.init_config)
    assert {k: v.shape for k, v in clone.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    assert "blocks.1.moe.experts.3.fc.weight" in names and "blocks.0.moe.shared.proj.weight" in names
    assert model.blocks[0].moe.experts[0].fc.weight.shape == (2 * 64, 32)  # gate and up, expert_hidden = 2·dim
