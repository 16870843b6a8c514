"""OLion: update magnitudes, momentum, routing, conv view, state_dict, errors, convergence."""

from __future__ import annotations

import copy
import io
import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import framework.optim.olion as olion_module
from framework.optim import OLion, is_hidden_matrix, newton_schulz5
from framework.optim.olion_groups import adamw_lr

torch.set_num_threads(1)
LR, WD = 1e-3, 0.1


def branches(opt: OLion) -> dict[bool, list[tuple[str, torch.Tensor]]]:
    """{True: the orthogonal branch's (name, param), False: the AdamW branch's}, over all groups in order."""
    out: dict[bool, list[tuple[str, torch.Tensor]]] = {True: [], False: []}
    for g in opt.param_groups:
        names = g.get("param_names") or [""] * len(g["params"])
        for name, p, orthogonal in zip(names, g["params"], g["orthogonal"], strict=True):
            out[orthogonal].append((name, p))
    return out


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.ModuleDict({k: nn.Linear(d, d) for k in ("q", "k", "v", "proj")})
        self.mlp = nn.ModuleDict({"fc": nn.Linear(d, 4 * d), "proj": nn.Linear(4 * d, d)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        a = F.scaled_dot_product_attention(*(self.attn[k](h) for k in "qkv"), is_causal=True)
        x = x + self.attn["proj"](a)
        return x + self.mlp["proj"](F.gelu(self.mlp["fc"](self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 32, d: int = 16, n_layer: int = 2, block: int = 8) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def conv_net() -> nn.Module:
    body = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 32, 3))
    return nn.Sequential(
        OrderedDict(stem=nn.Conv2d(3, 16, 3), body=body, pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(),
                    classifier=nn.Linear(32, 10))
    )  # fmt: skip


def lm_loss(model: nn.Module, seed: int) -> torch.Tensor:
    idx = torch.randint(0, 32, (4, 9), generator=torch.Generator().manual_seed(seed))
    return F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())


def one_step(shape, grad=None, dtype=torch.float64, seed=0, **kw):
    """(W before, W after, grad) for one OLion step on a single hidden matrix named 'w'."""
    gen = torch.Generator().manual_seed(seed)
    w = nn.Parameter(torch.randn(*shape, generator=gen, dtype=dtype))
    w.grad = torch.randn(*shape, generator=gen, dtype=dtype) if grad is None else grad.to(dtype)
    before = w.detach().clone()
    opt = OLion([("w", w)], **{"lr": LR, "weight_decay": WD, "ns_dtype": torch.float32, "ns_form": "standard", **kw})
    opt.step()
    return before, w.detach().clone(), w.grad, opt


# entries are exact up to the eps in 1/(‖S‖_F + eps): a relative 1e-8/‖S‖_F, below 1e-9 for these shapes


def first_step_direction(g: torch.Tensor) -> torch.Tensor:
    m = torch.zeros_like(g).lerp_(g, 1 - 0.98)
    return g.lerp(m, 0.95)


@pytest.mark.parametrize("shape", [(768, 768), (3072, 768), (768, 3072)])
def test_default_scales_move_every_entry_by_exactly_0_2_lr(shape):
    before, after, g, _ = one_step(shape)
    upd = after - before * (1 - LR * WD)
    assert torch.allclose(upd.abs(), torch.full_like(upd, 0.2 * LR), rtol=1e-9, atol=0)
    q = newton_schulz5(first_step_direction(g), dtype=torch.float32)
    assert torch.equal(torch.sign(upd), -torch.sign(q).double())
    assert math.isclose(upd.pow(2).mean().sqrt().item(), 0.2 * LR, rel_tol=1e-9)


def test_fp32_params_move_by_0_2_lr_to_one_ulp():
    _, after, _, _ = one_step((256, 128), dtype=torch.float32, weight_decay=0.0)
    w = torch.nn.Parameter(torch.zeros(256, 128))
    w.grad = torch.randn(256, 128, generator=torch.Generator().manual_seed(9))
    OLion([("w", w)], lr=LR).step()
    assert torch.allclose(w.detach().abs(), torch.full_like(w, 0.2 * LR), rtol=2e-7, atol=0)


def test_a_zero_gradient_row_only_decays_and_the_rest_absorbs_its_share():
    g = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    g[0] = 0
    before, after, _, _ = one_step((64, 128), grad=g)
    decayed = before * (1 - LR * WD)
    assert torch.equal(after[0], decayed[0])
    upd = (after - decayed)[1:]
    expected = 0.2 * math.sqrt(8192 / 8064) * LR  # 0.2016·lr
    assert torch.allclose(upd.abs(), torch.full_like(upd, expected), rtol=1e-9, atol=0)
    assert math.isclose((after - decayed).pow(2).mean().sqrt().item(), 0.2 * LR, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("use_scale", "rms_scale", "factor"),
    [
        (True, True, 0.2),
        (False, False, 1.0),
        (True, False, 1 / math.sqrt(80)),
        (False, True, 0.2 * math.sqrt(80)),
    ],
)
def test_scale_flags_set_the_entry_magnitude_from_min_and_max_dims(use_scale, rms_scale, factor):
    before, after, _, _ = one_step((48, 80), use_scale=use_scale, rms_scale=rms_scale)
    upd = (after - before * (1 - LR * WD)).abs()
    assert torch.allclose(upd, torch.full_like(upd, factor * LR), rtol=1e-9, atol=0)


def test_momentum_bookkeeping_over_two_steps(monkeypatch):
    seen = []
    # NS stand-in: records c and, like NS, returns a new tensor
    monkeypatch.setattr(olion_module, "orthogonalize", lambda c, **kw: seen.append(c.clone()) or c.clone())
    gen = torch.Generator().manual_seed(2)
    g1, g2 = (
        torch.randn(8, 6, generator=gen, dtype=torch.float64),
        torch.randn(8, 6, generator=gen, dtype=torch.float64),
    )
    w = nn.Parameter(torch.zeros(8, 6, dtype=torch.float64))
    opt = OLion([("w", w)], ns_dtype=torch.float64)  # c reaches NS in NS's dtype: float64 keeps it exact here
    w.grad = g1
    opt.step()
    m = opt.state[w]["momentum_buffer"]
    assert torch.allclose(m, 0.02 * g1) and torch.allclose(seen[0], 0.069 * g1)
    w.grad = g2
    opt.step()
    m2 = 0.98 * 0.02 * g1 + 0.02 * g2
    assert torch.allclose(m, m2) and torch.allclose(seen[1], 0.05 * g2 + 0.95 * m2)


@pytest.mark.parametrize(
    ("flags", "c2"), [({"pre_update_momentum": True}, "old"), ({"nesterov": False}, "m")]
)
def test_lion_order_uses_the_old_momentum_and_no_nesterov_uses_m(monkeypatch, flags, c2):
    seen = []
    # NS stand-in: records c and, like NS, returns a new tensor
    monkeypatch.setattr(olion_module, "orthogonalize", lambda c, **kw: seen.append(c.clone()) or c.clone())
    gen = torch.Generator().manual_seed(3)
    g1, g2 = (
        torch.randn(5, 7, generator=gen, dtype=torch.float64),
        torch.randn(5, 7, generator=gen, dtype=torch.float64),
    )
    w = nn.Parameter(torch.zeros(5, 7, dtype=torch.float64))
    opt = OLion([("w", w)], ns_dtype=torch.float64, **flags)
    for g in (g1, g2):
        w.grad = g
        opt.step()
    m1, m2 = 0.02 * g1, 0.98 * 0.02 * g1 + 0.02 * g2
    assert torch.allclose(seen[1], 0.05 * g2 + 0.95 * m1 if c2 == "old" else m2)


def test_zero_gradient_leaves_only_the_decay():
    before, after, _, _ = one_step((32, 16), grad=torch.zeros(32, 16), dtype=torch.float32)
    assert torch.equal(after, before.mul_(1 - LR * WD))


def reference_olion(w, grads, lr, wd, b1=0.95, b2=0.98, eps=1e-8):
    """The authors' SIT `olion_update` math, written out in float64 with plain matmuls."""
    m = torch.zeros_like(w)
    for g in grads:
        m = b2 * m + (1 - b2) * g
        x = (1 - b1) * g + b1 * m
        tall = x.shape[0] > x.shape[1]
        x = x.T if tall else x
        x = x / (torch.linalg.matrix_norm(x) + 1e-7)
        for _ in range(5):
            a = x @ x.T
            x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
        s = torch.sign(x.T if tall else x)
        s = s * math.sqrt(min(s.shape)) / (torch.linalg.matrix_norm(s) + eps) * 0.2 * math.sqrt(max(s.shape))
        w = w * (1 - lr * wd) - lr * s
    return w


@pytest.mark.parametrize("shape", [(48, 32), (32, 48)])
def test_three_steps_match_the_authors_update_in_float64(shape):
    gen = torch.Generator().manual_seed(4)
    w0 = torch.randn(*shape, generator=gen, dtype=torch.float64)
    grads = [torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3)]
    w = nn.Parameter(w0.clone())
    opt = OLion([("w", w)], lr=1e-2, ns_dtype=torch.float64)
    for g in grads:
        w.grad = g
        opt.step()
    ref = reference_olion(w0, grads, 1e-2, 0.1)
    assert (w.detach() - ref).abs().max() <= 1e-12


def test_gpt_routing_sends_only_hidden_linear_weights_to_olion():
    model = TinyGPT()
    opt = OLion(model.named_parameters())
    assert len(opt.param_groups) == 1  # the user's one group; routing is per parameter
    hidden = [n for n, _ in branches(opt)[True]]
    assert len(hidden) == 12 and all(n.startswith("h.") and n.endswith(".weight") for n in hidden)
    assert not any("ln" in n for n in hidden)
    adamw = branches(opt)[False]
    assert sorted(n for n, p in adamw if p.ndim >= 2) == ["lm_head.weight", "wpe.weight", "wte.weight"]  # decayed
    assert len([n for n, p in adamw if p.ndim < 2]) == 22 and all(p.ndim in (1, 2) for _, p in adamw)
    assert all("lr" in g and "orthogonal" in g for g in opt.param_groups)


def test_conv_routing_sends_hidden_kernels_to_olion_and_stem_head_bn_bias_to_adamw():
    opt = OLion(conv_net().named_parameters())
    names = {k: [n for n, _ in v] for k, v in branches(opt).items()}
    assert names[True] == ["body.0.weight", "body.3.weight"]
    assert sorted(names[False]) == sorted(
        ["stem.weight", "stem.bias", "body.0.bias", "body.1.weight", "body.1.bias", "body.3.bias",
         "classifier.weight", "classifier.bias"]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "shape", "hidden"),
    [
        ("module.h.0.attn.q.weight", (16, 16), True),
        ("layers.0.feed_forward.w1.weight", (64, 16), True),
        ("encoder.layer.0.attention.self.query.weight", (16, 16), True),
        ("body.0.weight", (32, 16, 3, 3), True),
        ("module.lm_head.weight", (32, 16), False),
        ("model.embed_tokens.weight", (32, 16), False),
        ("output.weight", (32, 16), False),
        ("head.weight", (10, 16), False),
        ("patch_embed.proj.weight", (16, 3, 4, 4), False),
        ("cls_token", (1, 1, 16), False),
        ("blocks.0.norm1.weight", (16,), False),
        ("h.0.ln_1.weight", (16,), False),
        ("h.0.mlp.fc.bias", (64,), False),
        ("scale", (), False),
        ("", (16, 16), True),
    ],
)
def test_default_predicate_table(name, shape, hidden):
    assert is_hidden_matrix(name, torch.empty(shape)) is hidden


def test_plain_tensors_are_routed_by_ndim_only():
    model = TinyGPT()
    with pytest.warns(UserWarning, match="without names"):
        opt = OLion(model.parameters())
    olion = [p for _, p in branches(opt)[True]]
    assert any(p is model.wte.weight for p in olion) and all(p.ndim == 2 for p in olion)
    assert all("param_names" not in g for g in opt.param_groups)


def olion_warnings(make, steps: int = 0) -> list[str]:
    """The OLion routing warnings raised while building an optimizer with `make()` and taking `steps` steps."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = make()
        for _ in range(steps):
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = torch.ones_like(p)
            opt.step()
    return [str(w.message) for w in caught if "without names" in str(w.message)]


def test_unnamed_parameters_warn_once_that_embeddings_and_head_go_to_the_orthogonal_branch():
    model = TinyGPT()
    messages = olion_warnings(lambda: OLion(model.parameters(), lr=1e-3), steps=3)
    assert len(messages) == 1  # once per optimizer, never per step
    n_matrices = sum(p.ndim >= 2 for p in model.parameters())
    assert f"{n_matrices} here" in messages[0] and "embeddings and the output head" in messages[0]
    assert "model.named_parameters()" in messages[0]
    groups = [{"params": list(model.h.parameters())}, {"params": list(model.lm_head.parameters())}]
    assert len(olion_warnings(lambda: OLion(groups))) == 1  # two unnamed groups, still one warning


def test_no_routing_warning_with_names_an_explicit_branch_a_custom_predicate_or_no_matrices():
    model = TinyGPT()
    assert olion_warnings(lambda: OLion(model.named_parameters()), steps=1) == []
    assert olion_warnings(lambda: OLion([{"params": list(model.parameters()), "use_olion": False}])) == []
    assert olion_warnings(lambda: OLion(model.parameters(), predicate=lambda n, p: p.ndim == 2)) == []
    assert olion_warnings(lambda: OLion([model.ln_f.weight])) == []  # a vector goes to AdamW either way


def test_group_dicts_keep_their_options_and_can_force_a_branch():
    model = TinyGPT()
    head = list(model.lm_head.named_parameters(prefix="lm_head"))
    rest = [(n, p) for n, p in model.named_parameters() if not n.startswith("lm_head")]
    opt = OLion(
        [{"params": rest, "lr": 2e-3, "adamw_lr": 5e-4}, {"params": head, "use_olion": True}], lr=1e-3
    )
    rest_group, head_group = opt.param_groups
    assert rest_group["lr"] == 2e-3 and adamw_lr(rest_group) == 5e-4  # h.* on OLion at 2e-3, wte on AdamW at 5e-4
    assert head_group["lr"] == 1e-3 and head_group["orthogonal"] == [True]


def test_custom_predicate_overrides_routing():
    opt = OLion(TinyGPT().named_parameters(), predicate=lambda n, p: p.ndim == 2)
    hidden = [n for n, _ in branches(opt)[True]]
    assert "lm_head.weight" in hidden and "wte.weight" in hidden


@pytest.mark.parametrize("shape", [(64, 32, 3, 3)])
def test_conv_kernel_is_processed_as_out_by_in_times_kernel(shape):
    for use_scale, rms_scale, factor in [(True, True, 0.2), (False, True, 0.2 * math.sqrt(288)),
                                         (True, False, 1 / math.sqrt(288))]:  # fmt: skip
        before, after, g, opt = one_step(shape, use_scale=use_scale, rms_scale=rms_scale)
        upd = after - before * (1 - LR * WD)
        assert torch.allclose(upd.abs(), torch.full_like(upd, factor * LR), rtol=1e-9, atol=0)
    q = newton_schulz5(first_step_direction(g).reshape(64, 288), dtype=torch.float32).reshape(shape)
    assert torch.equal(torch.sign(upd), -torch.sign(q).double())
    assert opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"].shape == shape


@pytest.mark.parametrize(("shape", "lo", "hi"), [((768, 768), 1.4, 1.5), ((1536, 384), 1.2, 1.3)])
def test_sign_step_raises_spectral_norm_over_muon_and_breaks_orthogonality(shape, lo, hi):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    olion = one_step(shape, grad=g, dtype=torch.float32, weight_decay=0.0)
    w = nn.Parameter(olion[0].clone())
    w.grad = g.clone()
    OLion([("w", w)], lr=LR, weight_decay=0.0, use_scale=False, ns_dtype=torch.float32, ns_form="standard",
          sign=False).step()
    muon_norm = torch.linalg.matrix_norm(w.detach() - olion[0], ord=2)
    ratio = (torch.linalg.matrix_norm(olion[1] - olion[0], ord=2) / muon_norm).item()
    assert lo <= ratio <= hi, ratio  # measured 1.473 (768²), 1.234 (1536×384)
    if shape == (1536, 384):
        q = newton_schulz5(first_step_direction(g), dtype=torch.float32)
        sv = torch.linalg.svdvals(torch.sign(q) / math.sqrt(1536))
        assert 0.55 <= sv.min() <= 0.6 and 1.35 <= sv.max() <= 1.42  # measured [0.558, 1.399]


def run_lm(opt_factory, model, steps):
    opt = opt_factory(model)
    for s in range(steps):
        opt.zero_grad()
        lm_loss(model, s).backward()
        opt.step()
    return opt


def test_state_dict_round_trip_continues_bitwise():
    torch.manual_seed(0)
    make = lambda m: OLion(m.named_parameters(), lr=1e-2, ns_dtype="bfloat16")
    a = TinyGPT()
    opt_a = run_lm(make, a, 3)
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    b = copy.deepcopy(a)
    opt_b = make(b)
    opt_b.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    for s in (3, 4):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            lm_loss(model, s).backward()
            opt.step()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        for key, va in opt_a.state[pa].items():
            assert torch.equal(torch.as_tensor(va), torch.as_tensor(opt_b.state[pb][key])), key


def test_lr_scheduler_scales_every_group_and_keeps_the_adamw_lr_separate():
    model = TinyGPT()
    opt = OLion(model.named_parameters(), lr=1e-2, adamw_lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    lm_loss(model, 0).backward()
    opt.step()
    sched.step()
    (group,) = opt.param_groups
    assert group["lr"] == 5e-3 and math.isclose(adamw_lr(group), 5e-4, rel_tol=1e-15)


def test_adamw_branch_matches_torch_adamw():
    gen = torch.Generator().manual_seed(6)
    emb = nn.Parameter(torch.randn(10, 4, generator=gen, dtype=torch.float64))
    bias = nn.Parameter(torch.randn(4, generator=gen, dtype=torch.float64))
    twins = [nn.Parameter(p.detach().clone()) for p in (emb, bias)]
    ours = OLion([("wte.weight", emb), ("ln_f.bias", bias)], lr=0.05, adamw_lr=1e-2, weight_decay=0.1)  # at adamw_lr
    theirs = torch.optim.AdamW(
        [{"params": [twins[0]], "weight_decay": 0.1}, {"params": [twins[1]], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.95), eps=1e-10,
    )  # fmt: skip
    for _ in range(5):
        for p, t in zip((emb, bias), twins, strict=True):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            t.grad = p.grad.clone()
        ours.step()
        theirs.step()
    for p, t in zip((emb, bias), twins, strict=True):
        assert torch.allclose(p, t, rtol=1e-12, atol=1e-15)


def test_params_without_grad_are_skipped():
    model = TinyGPT()
    opt = OLion(model.named_parameters())
    before = copy.deepcopy(model.state_dict())
    opt.step()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()) and not opt.state


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": -1.0}, r"lr=-1.0 is invalid: must be >= 0"),
        ({"betas": (0.9, 1.0)}, r"betas=\(0.9, 1.0\) is invalid.*\[0, 1\)"),
        ({"adamw_betas": (-0.1, 0.9)}, r"adamw_betas=\(-0.1, 0.9\) is invalid.*\[0, 1\)"),
        ({"ns_steps": 0}, r"ns_steps=0 is invalid: must be an integer >= 1"),
        ({"ns_dtype": "bf16"}, r"ns_dtype='bf16' is invalid"),
        ({"predicate": lambda n, p: True}, r"'h.0.ln_1.weight' \(shape \(16,\)\).*ndim >= 2"),
    ],
)
def test_bad_input_raises_value_error_naming_value_and_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OLion(TinyGPT().named_parameters(), **kwargs)


def test_a_vector_forced_into_olion_is_refused_by_name():
    with pytest.raises(ValueError, match="'gain'"):
        OLion([{"params": [("gain", nn.Parameter(torch.ones(4)))], "use_olion": True}])


def test_fsdp_flat_params_are_refused():
    p = nn.Parameter(torch.zeros(64))
    p._is_flat_param = True
    with pytest.raises(NotImplementedError, match="sharded"):
        OLion([("flat", p)])


def teacher_student_losses(lr: float, steps: int = 100) -> list[float]:
    torch.manual_seed(0)
    x = torch.randn(512, 32)
    with torch.no_grad():
        y = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))(x)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = OLion(net.named_parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(("lr", "ratio"), [(3e-4, 0.9), (5e-3, 0.1)])
def test_smoke_loss_decreases_without_divergence_across_the_lr_range(lr, ratio):
    losses = teacher_student_losses(lr)
    assert all(math.isfinite(v) for v in losses) and max(losses) <= losses[0]
    assert losses[-1] < ratio * losses[0], (losses[0], losses[-1])
