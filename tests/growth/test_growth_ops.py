"""Growth operators: checks G1–G9 of docs/growth.md's test table (G10 state transfer at unit level)."""

import copy

import pytest
import torch

from framework.grow import (
    count_params,
    depth_sources,
    find_moe_layers,
    grow,
    grow_depth,
    grow_width,
    norm_profile,
    transfer_optimizer_state,
)
from framework.models.moe import MoE, MoETransformerLM
from framework.models.transformer import TransformerLM

NORMALISED = ("softmax_topk", "softmax_topk_renorm", "topk_softmax", "sigmoid_topk_norm")


def moe_lm(depth=4, dtype=torch.float32, **kw):
    torch.manual_seed(0)
    model = MoETransformerLM(vocab_size=40, dim=32, depth=depth, heads=4, num_experts=4, top_k=2, **kw).to(dtype)
    with torch.no_grad():  # a "trained" profile: norms that increase with depth, as in converged LLMs
        for i, block in enumerate(model.blocks):
            for p in block.parameters():
                if p.ndim >= 2:
                    p.mul_(1 + i)
    return model.eval()


def tokens(n=2, t=16):
    return torch.randint(0, 40, (n, t), generator=torch.Generator().manual_seed(1))


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# ---- G1, G2: layer maps ----------------------------------------------------------------------------------
def test_interposition_copies_each_layer_in_place_and_stack_repeats_the_sequence():
    assert depth_sources(4, 2, "interposition") == [0, 0, 1, 1, 2, 2, 3, 3]
    assert depth_sources(4, 2, "stack") == [0, 1, 2, 3, 0, 1, 2, 3]
    assert depth_sources(3, 3, "interposition") == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("method", ["interposition", "stack"])
def test_every_grown_tensor_equals_its_source_bitwise_in_its_own_storage(method):
    model = moe_lm()
    source = [copy.deepcopy(b.state_dict()) for b in model.blocks]
    new, growth = grow_depth(model.blocks, 2, method)
    expected = [j // 2 for j in range(8)] if method == "interposition" else [j % 4 for j in range(8)]
    assert growth.sources == expected
    for block, src in zip(new, expected, strict=True):
        assert all(torch.equal(v, source[src][k]) for k, v in block.state_dict().items())
    ptrs = [p.data_ptr() for block in new for p in block.parameters()]
    assert len(ptrs) == len(set(ptrs))  # no weight tying between copies


@pytest.mark.parametrize(("a", "b"), [(1, 0), (0, 1), (1, 2), (2, 2)])
def test_ignore_first_and_last_layers_appear_once(a, b):
    n = 6
    inter = depth_sources(n, 2, "interposition", a, b)
    assert len(inter) == 2 * n - a - b
    assert all(inter.count(i) == 1 for i in [*range(a), *range(n - b, n)])
    assert all(inter.count(i) == 2 for i in range(a, n - b))
    stack = depth_sources(n, 2, "stack", a, b)
    assert len(stack) == (n - b) + (n - a)
    assert all(stack.count(i) == 1 for i in [*range(a), *range(n - b, n)])


@pytest.mark.parametrize(("kw", "match"), [
    ({"method": "interleave"}, "depth_method='interleave' is invalid; valid: interposition, stack"),
    ({"factor": 0}, "depth_factor=0 must be an integer >= 1"),
    ({"ignore_first": 3, "ignore_last": 2}, "sum to at most the number of layers"),
    ({"ignore_first": 2, "ignore_last": 2}, "leaves no middle layer of the 4 to copy"),
])
def test_bad_depth_arguments_name_the_value(kw, match):
    with pytest.raises(ValueError, match=match):
        depth_sources(4, **{"factor": 2, **kw})


# ---- G3: parameter counts ------------------------------------------------------------------------------------
def test_depth_doubles_per_layer_parameters_and_width_doubles_expert_parameters():
    model = moe_lm(depth=3, shared_hidden=16)
    layer = sum(p.numel() for p in model.blocks[0].parameters())
    outside = count_params(model)["total"] - 3 * layer
    experts = sum(p.numel() for p in model.blocks[0].moe.experts.parameters())
    router = model.blocks[0].moe.router.weight.numel()
    grow(model, depth_factor=2)
    assert count_params(model)["total"] == outside + 6 * layer
    grow(model, width_factor=2)
    counts = count_params(model)
    assert counts["total"] == outside + 6 * (layer + experts + router)
    assert counts["active"] == counts["total"] - 6 * experts  # top-4 of 8 experts: half of them inactive
    assert model.init_config["depth"] == 6 and model.init_config["num_experts"] == 8
    assert model.init_config["top_k"] == 4


# The paper's 17B MoE (28 layers, 96 experts, top-6) is reconstructed, not published: hidden 2048, SwiGLU experts
# of width 1024, GQA 16/4 heads, untied vocabulary 184,320 (solved from the published totals; docs/growth.md).
PAPER_17B = dict(vocab_size=184320, dim=2048, heads=16, kv_heads=4, num_experts=96, top_k=6, expert_hidden=1024)


def paper_counts(depth):
    with torch.device("meta"):
        model = MoETransformerLM(depth=depth, **PAPER_17B)
    counts = [count_params(model)]
    grow(model, depth_factor=2)
    counts.append(count_params(model))
    grow(model, width_factor=2)
    counts.append(count_params(model))
    return counts


def test_paper_parameter_counts_follow_from_two_layer_growth_extrapolated_to_28_layers():
    one, two = paper_counts(1), paper_counts(2)  # [base, depth-grown, then width-grown] for 1 and 2 source layers
    layer = {k: [two[i][k] - one[i][k] for i in range(3)] for k in ("total", "active")}  # per source layer
    billions = [[round((one[i][k] + 27 * layer[k][i]) / 1e9, 1) for k in ("total", "active")] for i in range(3)]
    assert billions == [[18.0, 2.1], [35.2, 3.5], [69.0, 5.6]]


@pytest.mark.slow
def test_paper_parameter_counts_at_full_size_on_the_meta_device():
    billions = [[round(c[k] / 1e9, 1) for k in ("total", "active")] for c in paper_counts(28)]
    assert billions == [[18.0, 2.1], [35.2, 3.5], [69.0, 5.6]]


# ---- G4, G5: depth function preservation -----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["interposition", "stack"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_init_copies_preserve_the_logits_exactly(method, dtype):
    model = moe_lm(dtype=dtype, shared_hidden=16)
    before = model(tokens())
    grow(model, depth_factor=2, depth_method=method, zero_init_copies=True, ignore_first=1)
    assert len(model.blocks) == 7
    assert (model(tokens()) - before).abs().max().item() == 0.0


def test_zero_init_preserves_the_dense_transformer_too():
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=40, dim=32, depth=2, heads=4).eval()
    before = model(tokens())
    grow(model, depth_factor=2, zero_init_copies=True)
    assert torch.equal(model(tokens()), before) and model.init_config["depth"] == 4


def test_plain_copies_change_the_function():
    model = moe_lm()
    before = model(tokens())
    grow(model, depth_factor=2)
    assert rel(model(tokens()), before) > 1e-3


def test_zero_patterns_that_match_nothing_are_refused_with_the_module_names():
    with pytest.raises(ValueError, match=r"zero_patterns=\['\*o_proj'\] match no module.*attn.proj"):
        grow(moe_lm(depth=1), depth_factor=2, zero_init_copies=True, zero_patterns=["*o_proj"])


# ---- G6, G7: width ------------------------------------------------------------------------------------------------
def moe_layer(router, seed=0):
    torch.manual_seed(seed)
    layer = MoE(32, 8, 2, 64, router=router).double().eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer, torch.randn(4, 64, 32, dtype=torch.float64)


@pytest.mark.parametrize("router", NORMALISED)
def test_noise_free_width_growth_with_top_k_doubled_preserves_every_normalised_router(router):
    layer, x = moe_layer(router)
    before = layer(x)
    grow_width(layer, 2, alpha=0.0)
    assert layer.num_experts == 16 and layer.top_k == 4
    assert rel(layer(x), before) <= 1e-12


@pytest.mark.parametrize("router", NORMALISED)
def test_width_growth_without_doubling_top_k_breaks_the_function(router):
    layer, x = moe_layer(router)
    before = layer(x)
    grow_width(layer, 2, alpha=0.0, top_k_factor=1)
    assert rel(layer(x), before) >= 0.3


def test_unnormalised_sigmoid_gating_is_not_preserved_even_with_top_k_doubled():
    layer, x = moe_layer("sigmoid_topk")
    before = layer(x)
    grow_width(layer, 2, alpha=0.0)
    assert rel(layer(x), before) >= 0.3


def test_noisy_copies_have_std_alpha_times_the_source_std_and_originals_are_untouched():
    torch.manual_seed(0)
    layer = MoE(256, 4, 1, 128)  # expert fc: 256×256 = 65,536 entries, router 4×256
    originals = copy.deepcopy(layer.state_dict())
    grow_width(layer, 2, alpha=0.01, generator=torch.Generator().manual_seed(0))
    for i in range(4):
        for (name, src), (_, cp) in zip(layer.experts[i].named_parameters(), layer.experts[i + 4].named_parameters(),
                                        strict=True):
            assert torch.equal(src, originals[f"experts.{i}.{name}"])
            diff = (cp - src).detach()
            assert abs(diff.mean().item()) < 3 * 0.01 * src.std().item() / diff.numel() ** 0.5 + 1e-12
            assert diff.std().item() / src.std().item() == pytest.approx(0.01, rel=0.05)
    router = layer.router.weight.detach()
    assert torch.equal(router[:4], originals["router.weight"])
    noise = router[4:] - router[:4]
    assert 0 < noise.abs().max().item() < 6 * 0.01 * originals["router.weight"].std().item()


@pytest.mark.parametrize("router", NORMALISED)
def test_noisy_width_growth_changes_the_output_by_order_alpha(router):
    layer, x = moe_layer(router)
    before = layer(x)
    grow_width(layer, 2, alpha=0.01, generator=torch.Generator().manual_seed(0))
    assert 1e-4 < rel(layer(x), before) < 0.1


# ---- G8: norm profile ---------------------------------------------------------------------------------------------
def test_interposed_profile_repeats_each_entry_and_stacking_drops_at_the_seam():
    model = moe_lm()
    source = norm_profile(model.blocks)
    assert source == sorted(source)  # the "trained" model's norms increase with depth
    inter, stack = copy.deepcopy(model), copy.deepcopy(model)
    grow(inter, depth_factor=2)
    grow(stack, depth_factor=2, depth_method="stack")
    assert norm_profile(inter.blocks) == [v for v in source for _ in range(2)]
    stacked = norm_profile(stack.blocks)
    assert stacked == source + source and stacked[4] < stacked[3]  # the cliff at the seam


# ---- G9: order independence -------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.01])
def test_depth_then_width_equals_width_then_depth_in_structure_and_bitwise_without_noise(alpha):
    a, b = moe_lm(), moe_lm()
    grow(a, depth_factor=2)
    grow(a, width_factor=2, noise_alpha=alpha)
    grow(b, width_factor=2, noise_alpha=alpha)
    grow(b, depth_factor=2)
    sa, sb = a.state_dict(), b.state_dict()
    assert {k: v.shape for k, v in sa.items()} == {k: v.shape for k, v in sb.items()}
    assert a.init_config == b.init_config
    same = all(torch.equal(sa[k], sb[k]) for k in sa)
    assert same if alpha == 0 else not same


# ---- G10 (unit): optimizer state follows the weights ----------------------------------------------------------
def test_duplicated_optimizer_state_gives_each_copy_its_sources_state_and_router_rows_repeat():
    model = moe_lm(depth=2).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(tokens()).flatten(0, 1), tokens().flatten()).backward()
        opt.step()
        opt.zero_grad()
    src_router = model.blocks[1].moe.router.weight
    src_expert = model.blocks[1].moe.experts[2].fc.weight
    growth = grow(model, depth_factor=2, width_factor=2)
    new = torch.optim.AdamW(model.parameters(), lr=1e-3)
    moved = transfer_optimizer_state(opt, new, growth.param_map)
    assert moved == len(list(model.parameters()))
    copy_block = model.blocks[3]  # the copy of source layer 1
    assert torch.equal(new.state[copy_block.moe.experts[2].fc.weight]["exp_avg"], opt.state[src_expert]["exp_avg"])
    width_copy = new.state[copy_block.moe.experts[6].fc.weight]
    assert torch.equal(width_copy["exp_avg_sq"], opt.state[src_expert]["exp_avg_sq"])
    router_state = new.state[copy_block.moe.router.weight]["exp_avg"]
    assert torch.equal(router_state, opt.state[src_router]["exp_avg"].repeat(2, 1))
    assert new.state[model.blocks[0].attn.q.weight] is opt.state[model.blocks[0].attn.q.weight]  # originals keep theirs
    assert len(find_moe_layers(model)) == 4
