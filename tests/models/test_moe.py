"""The MoE transformer: router conventions, the load-balancing loss and its gradient path, rebuild by config."""

import copy

import pytest
import torch
import torch.nn.functional as F

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
    x = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))  # not the global RNG: test order
    with_aux, without = tiny(aux_loss_coef=0.5), tiny(aux_loss_coef=0.0)
    a, b = with_aux(x), without(x)
    assert torch.equal(a, b)
    (a.sum() + with_aux.pop_aux_loss()).backward()
    assert without.pop_aux_loss() is None  # coef 0 queues nothing
    b.sum().backward()
    ga, gb = with_aux.blocks[0].moe.router.weight.grad, without.blocks[0].moe.router.weight.grad
    assert not torch.allclose(ga, gb)
    # E·Σ f·P is about 1 for a balanced router and at most E; f and P are means over different things (top-k
    # assignments, probabilities), so near-uniform routing can dip just below 1 (0.9998 on 2 of 200 random inputs)
    assert 0.95 <= with_aux.aux_loss().item() <= 4.0


def test_aux_gradient_equals_the_gradient_of_coef_times_the_balance_loss():
    torch.manual_seed(0)
    x = torch.randn(2, 10, 8)
    layer = MoE(8, 4, 2, 16, aux_loss_coef=0.5)
    (layer(x).sum() + layer.pop_aux_loss()).backward()
    plain = copy.deepcopy(layer)
    plain.aux_loss_coef = 0.0
    plain.zero_grad()
    _, idx, probs = route(plain.router(x.reshape(-1, 8)), 2, plain.router_type)
    (plain(x).sum() + 0.5 * load_balancing_loss(probs, idx, 4)).backward()
    assert torch.allclose(layer.router.weight.grad, plain.router.weight.grad, atol=1e-6)


def router_grads(model) -> torch.Tensor:
    return torch.cat([m.router.weight.grad.flatten() for m in model.moe_layers()])


def test_the_balance_term_scales_with_the_loss_it_is_part_of():
    """grad(c·L) = c·grad(L) for L = CE + pop_aux_loss(): a multiplier reaches the balance term too."""
    x = torch.randint(0, 50, (2, 12))
    grads = {}
    for c in (1.0, 3.0):
        model = tiny(aux_loss_coef=0.5).double()
        logits = model(x[:, :-1])
        total = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()) + model.pop_aux_loss()
        (c * total).backward()
        grads[c] = router_grads(model)
    assert grads[1.0].abs().max() > 0
    torch.testing.assert_close(grads[3.0], 3.0 * grads[1.0], rtol=1e-9, atol=1e-12)


def balance_by_hand(model, x: torch.Tensor) -> torch.Tensor:
    """Σ_layers coef · E·Σ f·P recomputed from each MoE layer's input (no use of the model's own queue)."""
    inputs = []
    hooks = [m.register_forward_hook(lambda mod, args, out: inputs.append((mod, args[0]))) for m in model.moe_layers()]
    try:
        logits = model(x[:, :-1])
    finally:
        for h in hooks:
            h.remove()
    model.pop_aux_loss()
    total = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    for mod, inp in inputs:
        _, idx, probs = route(mod.router(inp.flatten(0, 1)), mod.top_k, mod.router_type)
        total = total + mod.aux_loss_coef * load_balancing_loss(probs, idx, mod.num_experts)
    return total


def test_gradient_accumulation_weights_the_balance_term_like_the_main_loss(tmp_path):
    """Lightning with accumulate_grad_batches=2 gives the grads of the mean of the two micro-batch losses
    (CE + coef·balance); a balance gradient injected as a constant would count twice."""
    import lightning as L

    from framework.modules.causal_lm import CausalLM

    rows = torch.randint(0, 50, (4, 13), generator=torch.Generator().manual_seed(1))
    reference = tiny(aux_loss_coef=0.5)
    expected_model = copy.deepcopy(reference)
    ((balance_by_hand(expected_model, rows[:2]) + balance_by_hand(expected_model, rows[2:])) / 2).backward()
    expected = router_grads(expected_model)

    seen = {}

    class Grab(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            seen["grads"] = router_grads(pl_module.model).clone()

    module = CausalLM(copy.deepcopy(reference), optimizer=lambda ps: torch.optim.SGD([p for _, p in ps], lr=0.0))
    trainer = L.Trainer(max_steps=1, accumulate_grad_batches=2, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, default_root_dir=str(tmp_path), callbacks=[Grab()])
    trainer.fit(module, torch.utils.data.DataLoader(list(rows), batch_size=2))
    torch.testing.assert_close(seen["grads"], expected, rtol=1e-4, atol=1e-7)


def test_the_queue_is_training_only_never_in_the_state_dict_and_copies_start_empty():
    model = tiny(aux_loss_coef=0.5)
    keys = set(model.state_dict())
    x = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        model(x)
    model.eval()
    model(x)
    assert model.pop_aux_loss() is None  # eval or no-grad forwards queue nothing
    model.train()
    model(x)
    model(x)
    assert set(model.state_dict()) == keys  # old checkpoints load: no new parameters or buffers
    clone = copy.deepcopy(model)  # a queued term holds a live graph; the copy must not carry it
    assert clone.pop_aux_loss() is None
    assert model.pop_aux_loss().requires_grad and model.pop_aux_loss() is None  # two forwards, popped once


def test_an_uncollected_balance_term_warns_instead_of_growing_without_bound():
    from framework.models.moe import MAX_PENDING

    layer = MoE(8, 4, 2, 16, aux_loss_coef=0.5)
    x = torch.randn(1, 4, 8)
    with pytest.warns(UserWarning, match="pop_aux_loss"):
        for _ in range(MAX_PENDING + 1):
            layer(x)
    assert len(layer._pending) == 1


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


def test_the_mdlm_module_adds_the_balance_term_of_its_forward_to_the_training_loss():
    import warnings

    from framework.modules.mdlm import MDLMModule

    tokens = torch.randint(0, 49, (2, 12), generator=torch.Generator().manual_seed(0))
    losses, balance = {}, None
    for coef in (0.0, 0.5):
        module = MDLMModule(tiny(aux_loss_coef=coef, causal=False), mask_id=49)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log without a trainer
            losses[coef] = module.training_step(tokens, 0)
        assert module.model.pop_aux_loss() is None  # the step took what its forward queued
        if coef:
            balance = sum(m.last_aux_loss for m in module.model.moe_layers())
    assert losses[0.5].item() == pytest.approx(losses[0.0].item() + 0.5 * balance.item(), rel=1e-5)


def test_the_init_choice_reaches_the_experts_and_the_router():
    """`init="torch"` keeps PyTorch's Linear default, U(±1/√fan_in), in the router and every expert (the MoE
    parameters `init="gpt2"` would draw at std 0.02); the choice is recorded for rebuilding."""
    dim = 256
    torch.manual_seed(0)
    model = MoETransformerLM(vocab_size=64, dim=dim, depth=2, heads=4, num_experts=4, init="torch")
    torch.manual_seed(0)
    gpt2 = MoETransformerLM(vocab_size=64, dim=dim, depth=2, heads=4, num_experts=4)
    checked = 0
    for name, p in model.named_parameters():
        if ".moe." in name and name.endswith(("fc.weight", "router.weight")):
            tol = 4 / (2 * p.numel()) ** 0.5  # four standard errors of a sample std
            assert abs(p.std().item() * (3 * dim) ** 0.5 - 1) < tol, name
            assert abs(dict(gpt2.named_parameters())[name].std().item() / 0.02 - 1) < tol, name
            checked += 1
    assert checked == 2 * (4 + 1)  # per layer: 4 experts' fc and the router
    assert model.init_config["init"] == "torch" and gpt2.init_config["init"] == "gpt2"
    with pytest.raises(ValueError, match=r"init='xavier' is not an initialisation scheme; valid: gpt2, torch"):
        MoETransformerLM(vocab_size=64, dim=16, depth=1, heads=2, init="xavier")
