"""MuonAdamW (torch.optim.Muon + AdamW as one optimizer) and `ortho_momentum` (OLion minus the sign step)."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from framework.optim import MuonAdamW, OLion

torch.set_num_threads(1)


def small_lm() -> nn.Module:
    """Embedding → two hidden Linear → LayerNorm → head, plus a conv kernel that Muon cannot take."""
    torch.manual_seed(0)
    return nn.ModuleDict(
        {
            "wte": nn.Embedding(32, 16),
            "fc": nn.Linear(16, 48),
            "proj": nn.Linear(48, 16),
            "conv": nn.Conv1d(16, 16, 3, padding=1),
            "ln_f": nn.LayerNorm(16),
            "lm_head": nn.Linear(16, 32, bias=False),
        }
    )


def loss_of(m: nn.Module, seed: int) -> torch.Tensor:
    idx = torch.randint(0, 32, (4, 9), generator=torch.Generator().manual_seed(seed))
    x = m["wte"](idx[:, :-1])
    x = x + m["proj"](F.gelu(m["fc"](x)))
    x = x + m["conv"](x.transpose(1, 2)).transpose(1, 2)
    return F.cross_entropy(m["lm_head"](m["ln_f"](x)).flatten(0, 1), idx[:, 1:].flatten())


def train(m: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for s in steps:
        opt.zero_grad()
        loss_of(m, s).backward()
        opt.step()


def test_routes_only_2d_hidden_weights_to_muon_and_conv_to_adamw():
    opt = MuonAdamW(small_lm().named_parameters())
    muon = [n for g in opt.param_groups if g["use_muon"] for n in g["param_names"]]
    decay = [
        n for g in opt.param_groups if not g["use_muon"] and g["weight_decay"] > 0 for n in g["param_names"]
    ]
    assert muon == ["fc.weight", "proj.weight"]
    assert sorted(decay) == ["conv.weight", "lm_head.weight", "wte.weight"]
    assert isinstance(opt, torch.optim.Optimizer) and len(opt.param_groups) == 3


def test_steps_exactly_like_separate_torch_muon_and_adamw():
    a, b = small_lm(), small_lm()
    ours = MuonAdamW(a.named_parameters(), lr=1e-2, weight_decay=0.1, adamw_lr=3e-3)
    hidden = {"fc.weight", "proj.weight"}
    named = dict(b.named_parameters())
    muon = torch.optim.Muon([named[n] for n in sorted(hidden)], lr=1e-2, weight_decay=0.1,
                            adjust_lr_fn="match_rms_adamw")  # fmt: skip
    adamw = torch.optim.AdamW(
        [{"params": [p for n, p in named.items() if n not in hidden and p.ndim >= 2], "weight_decay": 0.1},
         {"params": [p for n, p in named.items() if p.ndim < 2], "weight_decay": 0.0}],
        lr=3e-3, betas=(0.9, 0.95), eps=1e-10,
    )  # fmt: skip
    train(a, ours, range(3))
    for s in range(3):
        muon.zero_grad()
        adamw.zero_grad()
        loss_of(b, s).backward()
        muon.step()
        adamw.step()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), n


def test_state_dict_round_trip_continues_bitwise():
    a = small_lm()
    make = lambda m: MuonAdamW(m.named_parameters(), lr=1e-2)
    opt_a = make(a)
    train(a, opt_a, range(3))
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    b = copy.deepcopy(a)
    opt_b = make(b)
    opt_b.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    assert len(opt_b.state) == sum(1 for _ in b.parameters())
    train(a, opt_a, range(3, 5))
    train(b, opt_b, range(3, 5))
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), n


def test_lr_scheduler_reaches_both_inner_optimizers():
    m = small_lm()
    opt = MuonAdamW(m.named_parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.0 if s else 1.0)
    train(m, opt, range(1))
    sched.step()  # lr → 0: the next step must change nothing, in either branch
    before = copy.deepcopy(m.state_dict())
    train(m, opt, range(1, 2))
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert {g["lr"] for g in opt.param_groups} == {0.0}


def test_add_param_group_after_construction_routes_new_params():
    m = small_lm()
    extra = nn.Linear(16, 16)
    opt = MuonAdamW([(n, p) for n, p in m.named_parameters() if not n.startswith("fc")])
    opt.add_param_group({"params": list(extra.named_parameters(prefix="adapter"))})
    muon = [n for g in opt.param_groups if g["use_muon"] for n in g["param_names"]]
    assert muon == ["proj.weight", "adapter.weight"]
    extra(torch.randn(2, 16)).sum().backward()
    w0 = extra.weight.detach().clone()
    opt.step()
    assert not torch.equal(w0, extra.weight)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"adjust_lr_fn": "moonlight"}, "adjust_lr_fn='moonlight'"), ({"lr": -1e-3}, "lr=-0.001"),
     ({"momentum": 1.0}, r"momentum=1.0.*\[0, 1\)")],
)  # fmt: skip
def test_bad_input_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MuonAdamW(small_lm().named_parameters(), **kwargs)


def test_ortho_momentum_is_olion_minus_the_sign_with_rms_exactly_0_2_lr():
    g = torch.randn(48, 80, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = {}
    for sign in (True, False):
        w = nn.Parameter(torch.zeros(48, 80, dtype=torch.float64))
        w.grad = g.clone()
        OLion([("w", w)], lr=1e-3, ns_dtype=torch.float32, sign=sign).step()
        out[sign] = w.detach()
    ortho, olion = out[False], out[True]
    assert math.isclose(ortho.pow(2).mean().sqrt().item(), 2e-4, rel_tol=1e-8)  # eps/‖Q‖_F ≈ 2e-9
    assert len(ortho.abs().unique()) > 100 and torch.allclose(olion.abs(), torch.full_like(olion, 2e-4))
    agree = (torch.sign(ortho) == torch.sign(olion)).double().mean()
    assert agree == 1.0  # sign(NS5(c)) is OLion's direction; only the magnitudes differ


def test_ortho_momentum_without_renorm_equals_torch_muon_match_rms_adamw():
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    w0 = torch.randn(64, 32, generator=torch.Generator().manual_seed(2))
    ws = [nn.Parameter(w0.clone()) for _ in range(2)]
    ours = OLion(
        [("w", ws[0])], lr=1e-2, betas=(0.95, 0.95), use_scale=False, ns_dtype=torch.bfloat16, sign=False,
        ns_form="standard",  # the standard iteration is what torch.optim.Muon runs, bit for bit
    )
    theirs = torch.optim.Muon([ws[1]], lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for k in range(2):
        for w in ws:
            w.grad = g * (k + 1)
        ours.step()
        theirs.step()
    assert torch.allclose(ws[0], ws[1], rtol=0, atol=1e-7)


def test_the_registered_ortho_momentum_is_olion_without_the_sign_step():
    from framework.catalog.optimizers import OPTIMIZERS

    opt = OPTIMIZERS.build("ortho_momentum", small_lm().named_parameters())
    assert type(opt) is OLion
    assert [g["sign"] for g in opt.param_groups if any(g["orthogonal"])] == [False]


@pytest.mark.parametrize("cls", [OLion, MuonAdamW])
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"weight_decay": -0.1}, r"weight_decay=-0\.1 is invalid: must be >= 0"),
     ({"adamw_betas": (0.9, 1.0)}, r"adamw_betas=\(0\.9, 1\.0\) is invalid"),
     ({"ns_steps": 0}, r"ns_steps=0 is invalid: must be an integer >= 1")],
)  # fmt: skip
def test_olion_and_muon_refuse_a_bad_shared_option_in_the_same_words(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(small_lm().named_parameters(), **kwargs)
