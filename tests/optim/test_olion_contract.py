"""OLion and torch's generic optimizer contract: deepcopy/pickle, the user's param groups (schedulers), torch's
bad-input errors, complex params refused, named-parameter routing, bitwise the same updates as before the change,
and state_dicts of the earlier layout (internal groups per branch) still loading."""

from __future__ import annotations

import copy
import io
import math
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from framework.optim import OLion, newton_schulz5
from framework.optim.olion_groups import adamw_lr, remap_old_layout_scheduler

torch.set_num_threads(1)
HIDDEN = ("fc1.weight", "fc2.weight", "conv.weight", "fc3.weight")  # default routing of Net's named params
DECAYED = ("wte.weight", "head.weight")  # the AdamW branch decays ≥2-D params only


class Net(nn.Module):
    """Embedding, Linear, LayerNorm, Conv1d and a head: every routing case of the default predicate."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(16, 8)
        self.fc1, self.ln, self.fc2 = nn.Linear(8, 12), nn.LayerNorm(12), nn.Linear(12, 12)
        self.conv, self.fc3, self.head = nn.Conv1d(12, 12, 3, padding=1), nn.Linear(12, 12), nn.Linear(12, 16)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.ln(torch.tanh(self.fc1(self.wte(idx))))
        x = self.conv(torch.tanh(self.fc2(x)).transpose(1, 2)).transpose(1, 2)
        return self.head(torch.tanh(self.fc3(x)))


def make_net(dtype: torch.dtype = torch.float32) -> Net:
    torch.manual_seed(0)
    return Net().to(dtype)


def backward(model: nn.Module, step: int) -> None:
    """Fresh grads of a next-token loss on batch `step`."""
    idx = torch.randint(0, 16, (4, 7), generator=torch.Generator().manual_seed(100 + step))
    model.zero_grad()
    F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        backward(model, step)
        opt.step()


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("round_trip", ["deepcopy", "pickle"])
def test_deepcopy_and_pickle_round_trips_step_like_the_original(round_trip):
    model = make_net()
    opt = OLion(model.named_parameters(), lr=1e-2, distributed="redundant")
    train(model, opt, range(2))
    twin = copy.deepcopy(opt) if round_trip == "deepcopy" else pickle.loads(pickle.dumps(opt))
    assert twin.distributed == "redundant" and twin.predicate is opt.predicate
    backward(model, 2)
    for p, q in zip(opt.param_groups[0]["params"], twin.param_groups[0]["params"], strict=True):
        assert p is not q and torch.equal(p, q)
        q.grad = p.grad.clone()
    opt.step()
    twin.step()
    for p, q in zip(opt.param_groups[0]["params"], twin.param_groups[0]["params"], strict=True):
        assert torch.equal(p, q)
        assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(twin.state[q][k])) for k, v in opt.state[p].items())


@pytest.mark.parametrize("round_trip", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))])
def test_add_param_group_after_a_round_trip_routes_the_new_group(round_trip):
    opt = round_trip(OLion(make_net().named_parameters(), lr=1e-2))
    extra = {"params": [("extra.weight", nn.Parameter(torch.randn(6, 5))), ("extra.bias", nn.Parameter(torch.ones(6)))]}
    opt.add_param_group(extra)
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["orthogonal"] == [True, False]
    assert opt.param_groups[1]["lr"] == 1e-2
    for p in opt.param_groups[1]["params"]:
        p.grad = torch.ones_like(p)
    opt.step()


def test_complex_parameters_are_refused_by_name_at_construction_and_in_add_param_group():
    z = nn.Parameter(torch.randn(4, 4, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"complex parameters: parameter 'mix.weight'.*complex64.*valid: real"):
        OLion([("mix.weight", z)])
    with pytest.raises(ValueError, match=r"unnamed parameter of shape \(4,\).*valid: real floating-point"):
        OLion([nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.ones(4, dtype=torch.complex64))])  # AdamW's too
    opt = OLion([("fc.weight", nn.Parameter(torch.randn(4, 4)))])
    with pytest.raises(ValueError, match="'gain'"):
        opt.add_param_group({"params": [("gain", nn.Parameter(torch.ones(4, dtype=torch.complex64)))]})
    assert len(opt.param_groups) == 1  # the refused group was not added


def torch_error(make: Any) -> Exception:
    """The exception torch.optim.AdamW raises for the same input."""
    with pytest.raises(Exception) as caught:
        make(torch.optim.AdamW)
    return caught.value


@pytest.mark.parametrize("params", [torch.randn(3, 4), nn.Parameter(torch.randn(3, 4))], ids=["tensor", "parameter"])
def test_a_single_tensor_as_params_raises_torchs_type_error(params):
    expected = torch_error(lambda cls: cls(params))
    assert isinstance(expected, TypeError)
    with pytest.raises(TypeError) as caught:
        OLion(params)
    assert str(caught.value) == str(expected)
    assert "iterable of Tensors or dicts, but got torch.FloatTensor" in str(caught.value)


def test_a_tensor_lr_of_two_elements_raises_torchs_value_error():
    lr = torch.tensor([1e-3, 1e-3])
    expected = torch_error(lambda cls: cls([nn.Parameter(torch.randn(4, 4))], lr=lr))
    assert isinstance(expected, ValueError) and str(expected) == "Tensor lr must be 1-element"
    with pytest.raises(ValueError) as caught:
        OLion(make_net().named_parameters(), lr=lr)
    assert str(caught.value) == str(expected)
    with pytest.raises(ValueError, match="Tensor adamw_lr must be 1-element"):
        OLion(make_net().named_parameters(), adamw_lr=lr)
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        OLion([{"params": list(make_net().named_parameters()), "lr": lr}])


def test_one_cycle_lr_steps_ten_times_and_sets_the_lr_of_the_users_one_group():
    model = make_net()
    opt = OLion(model.named_parameters(), lr=1e-3, adamw_lr=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.01], total_steps=10)
    lrs, start = [], params_of(model)
    for step in range(10):
        backward(model, step)
        opt.step()
        lrs.append(opt.param_groups[0]["lr"])
        group = opt.param_groups[0]
        assert math.isclose(adamw_lr(group), 0.5 * group["lr"], rel_tol=1e-12)  # the AdamW branch follows
        sched.step()
    assert len(opt.param_groups) == 1 and lrs[0] == pytest.approx(0.01 / 25) and max(lrs) == pytest.approx(0.01)
    assert lrs[-1] < lrs[0] and all(not torch.equal(p, start[n]) for n, p in model.named_parameters())


def test_cycle_momentum_cycles_the_orthogonal_beta1_and_leaves_the_adamw_betas():
    model = make_net()
    opt = OLion(model.named_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=10)  # cycle_momentum=True
    seen = []
    for step in range(10):
        backward(model, step)
        opt.step()
        seen.append(opt.param_groups[0]["betas"])
        assert opt.param_groups[0]["adamw_betas"] == (0.9, 0.95)
        sched.step()
    assert {b2 for _, b2 in seen} == {0.98} and min(b1 for b1, _ in seen) == pytest.approx(0.85)
    assert seen[0][0] == pytest.approx(0.95) and seen[-1][0] == pytest.approx(0.95)  # max_momentum at low lr
    model = make_net()
    fixed = OLion(model.named_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(fixed, max_lr=0.01, total_steps=10, cycle_momentum=False)
    train(model, fixed, range(1))
    sched.step()
    assert fixed.param_groups[0]["betas"] == (0.95, 0.98)


def test_a_schedule_on_lr_scales_the_adamw_branch_by_the_same_factor():
    model = make_net()
    opt = OLion(model.named_parameters(), lr=1e-2, adamw_lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    train(model, opt, range(1))
    sched.step()
    group = opt.param_groups[0]
    assert group["lr"] == 5e-3 and math.isclose(adamw_lr(group), 5e-4, rel_tol=1e-15)
    assert adamw_lr(OLion(make_net().named_parameters(), lr=1e-2, adamw_lr=None).param_groups[0]) == 1e-2  # tied
    assert adamw_lr(OLion(make_net().named_parameters(), lr=1e-2).param_groups[0]) == 1e-3  # default: AdamW's own


def test_param_groups_are_exactly_the_users_groups_in_order():
    named = list(make_net().named_parameters())
    users = [{"params": named[:5], "lr": 2e-3}, {"params": named[5:9]}, {"params": named[9:], "use_olion": False}]
    opt = OLion(users, lr=1e-3)
    assert len(opt.param_groups) == len(users)
    for group, user in zip(opt.param_groups, users, strict=True):
        assert all(p is q for p, (_, q) in zip(group["params"], user["params"], strict=True))
        assert group["param_names"] == [n for n, _ in user["params"]]
    assert [g["lr"] for g in opt.param_groups] == [2e-3, 1e-3, 1e-3]
    routed = [n for g in opt.param_groups for n, o in zip(g["param_names"], g["orthogonal"], strict=True) if o]
    assert routed == ["fc1.weight", "fc2.weight", "conv.weight"]  # fc3 sits in the use_olion=False group
    assert len(opt.state_dict()["param_groups"]) == len(users)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(OLion(make_net().parameters()).param_groups) == 1


def user_module(call: str) -> Any:
    """A user's own LightningModule whose configure_optimizers builds OLion the way `call` says."""
    import hydra.utils
    import lightning as L

    class UserModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64))
            self.head = nn.Linear(64, 10)  # the (10, 64) classifier head

        def configure_optimizers(self) -> OLion:
            cfg = {"_target_": "framework.optim.OLion", "lr": 1e-3}
            factory = hydra.utils.instantiate({**cfg, "_partial_": True})  # a Hydra `_partial_: true` config
            if call == "named":
                return OLion(self.named_parameters(), lr=1e-3)
            if call == "unnamed":
                return OLion(self.parameters(), lr=1e-3)  # <unnamed>
            if call == "hydra_partial":
                return factory(self.parameters())  # <hydra_partial>
            return hydra.utils.instantiate(cfg, params=self.parameters())  # <hydra_params>

    return UserModule()


def test_named_parameters_of_a_lightning_module_send_the_head_to_adamw_without_a_warning():
    module = user_module("named")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = module.configure_optimizers()
    group = opt.param_groups[0]
    routed = dict(zip(group["param_names"], group["orthogonal"], strict=True))
    assert routed == {
        "body.0.weight": True,
        "body.0.bias": False,
        "body.2.weight": True,
        "body.2.bias": False,
        "head.weight": False,
        "head.bias": False,
    }


@pytest.mark.parametrize("call", ["unnamed", "hydra_partial", "hydra_params"])
def test_the_unnamed_warning_points_at_the_users_line_and_quotes_the_fix(call):
    module = user_module(call)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = module.configure_optimizers()
    (warning,) = [w for w in caught if "without names" in str(w.message)]
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.endswith(f"# <{call}>"))
    assert (warning.filename, warning.lineno) == (__file__, line)
    assert "self.named_parameters() instead of self.parameters()" in str(warning.message)
    assert opt.param_groups[0]["orthogonal"][-2] is True  # unnamed: the head is orthogonalised, as it warns


# The pre-change OLion's options and its per-parameter math, written out (framework/optim/olion.py before the
# one-group layout; checked bit for bit against that implementation's saved outputs when the layout changed).
PRE_CHANGE_DEFAULTS = dict(
    lr=3e-4, betas=(0.95, 0.98), weight_decay=0.1, ns_steps=5, ns_dtype=None, use_scale=True, rms_scale=True,
    nesterov=True, pre_update_momentum=False, sign=True, eps=1e-8, adamw_lr=None, adamw_betas=(0.9, 0.95),
    adamw_eps=1e-10, adamw_weight_decay=None,
)  # fmt: skip


def pre_change_olion_update(p: torch.Tensor, st: dict[str, Any], o: dict[str, Any]) -> None:
    """Momentum mix, NS5 of the (out, in·k…) view, sign, scales, decoupled decay."""
    g = p.grad
    m = st.setdefault("momentum_buffer", torch.zeros_like(p))
    b1, b2 = o["betas"]
    c = g.lerp(m, b1) if o["nesterov"] and o["pre_update_momentum"] else None
    m.lerp_(g, 1 - b2)
    if c is None:
        c = g.lerp(m, b1) if o["nesterov"] else m
    q = newton_schulz5(c.reshape(p.shape[0], -1), steps=o["ns_steps"], dtype=o["ns_dtype"] or torch.float32)
    q = torch.sign(q) if o["sign"] else q
    u, scale = q.to(torch.promote_types(p.dtype, torch.float32)), 1.0
    fused = o["sign"] and o["use_scale"]
    if o["use_scale"]:
        norm = u.norm()
        if fused and u.dtype == torch.float32:  # √(nonzero count) correctly rounded, as `sign_norm` takes it (math.sqrt
            # then fp32 is, for counts < 2^24); u.norm() takes its own root, within 1 ulp of that
            norm = torch.tensor(math.sqrt(int(torch.count_nonzero(u))), dtype=torch.float32)
        scale = math.sqrt(min(q.shape)) / (norm + o["eps"])
    if o["rms_scale"]:
        scale = scale * (0.2 * math.sqrt(max(q.shape)))
    p.mul_(1 - o["lr"] * o["weight_decay"])
    if fused:  # the pre-change add_(u·scale, alpha=−lr) as OLion's one pass applies it: the same product and sum
        # (u·scale is exact) in another kernel, which may round lr·scale apart (test_ns_paths holds them within that)
        p.addcmul_(u.reshape(p.shape), scale, value=-o["lr"])
    else:
        p.add_((u * scale).reshape(p.shape), alpha=-o["lr"])


def pre_change_adamw_update(p: torch.Tensor, st: dict[str, Any], o: dict[str, Any]) -> None:
    """Bias-corrected AdamW at adamw_lr (None: lr), decaying ≥2-D params only."""
    lr = o["lr"] if o["adamw_lr"] is None else o["adamw_lr"]
    wd = o["weight_decay"] if o["adamw_weight_decay"] is None else o["adamw_weight_decay"]
    wd = wd if p.ndim >= 2 else 0.0
    if not st:
        st.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    st["step"] += 1
    (b1, b2), m, v, t = o["adamw_betas"], st["exp_avg"], st["exp_avg_sq"], st["step"]
    m.lerp_(p.grad, 1 - b1)
    v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(o["adamw_eps"])
    p.mul_(1 - lr * wd)
    p.addcdiv_(m, denom, value=-lr / (1 - b1**t))


def pre_change_run(model: Net, steps: int, opts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Train `model` for `steps` steps with the pre-change math; returns each parameter's state by name."""
    o, state = {**PRE_CHANGE_DEFAULTS, **opts}, {}
    for step in range(steps):
        backward(model, step)
        with torch.no_grad():
            for name, p in model.named_parameters():
                update = pre_change_olion_update if name in HIDDEN else pre_change_adamw_update
                update(p, state.setdefault(name, {}), o)
    return state


# the pre-change OLion ran the standard NS iteration, in fp32 on CPU: pinned, since the defaults now measure
PINNED = {"ns_dtype": torch.float32, "ns_form": "standard"}
BITWISE_CASES = {
    "defaults": (torch.float32, {"lr": 1e-2, **PINNED}),
    "flags": (torch.float32, {"lr": 1e-2, **PINNED, "sign": False, "nesterov": False, "use_scale": False,
                              "adamw_lr": 3e-3}),
    "lion_order": (torch.float32, {"lr": 1e-2, **PINNED, "pre_update_momentum": True, "adamw_weight_decay": 0.02,
                                   "adamw_betas": (0.8, 0.9)}),
    "float64": (torch.float64, {"lr": 1e-2, "ns_dtype": torch.float64, "ns_form": "standard", "weight_decay": 0.3}),
}  # fmt: skip


@pytest.mark.parametrize("case", BITWISE_CASES)
def test_updates_and_state_are_bitwise_those_of_the_pre_change_olion(case):
    dtype, opts = BITWISE_CASES[case]
    ours, theirs = make_net(dtype), make_net(dtype)
    opt = OLion(ours.named_parameters(), **{"adamw_lr": None, **opts})  # the pre-change default: the group's lr
    train(ours, opt, range(5))
    ref_state = pre_change_run(theirs, 5, opts)
    assert same_tensors(params_of(ours), params_of(theirs))
    for name, p in ours.named_parameters():
        assert opt.state[p].keys() == ref_state[name].keys(), name  # momentum_buffer | step, exp_avg, exp_avg_sq
        for key, value in ref_state[name].items():
            assert torch.equal(torch.as_tensor(opt.state[p][key]), torch.as_tensor(value)), (name, key)


NO_DECAY = ("fc1.bias", "ln.weight", "ln.bias", "fc2.bias", "conv.bias", "fc3.bias", "head.bias")
OLD_COMMON = dict(
    ns_steps=5, ns_dtype=None, use_scale=True, rms_scale=True, nesterov=True, pre_update_momentum=False, sign=True,
    adamw_lr=None, adamw_betas=(0.9, 0.95), adamw_eps=1e-10, adamw_weight_decay=None, ns_batch=None,
)  # fmt: skip
# The param_groups the pre-change OLion(Net().named_parameters(), lr=1e-2) saved: one internal group per branch
OLD_GROUPS = [
    {"param_names": list(HIDDEN), "lr": 0.01, "betas": (0.95, 0.98), "weight_decay": 0.1, "eps": 1e-8,
     "use_olion": True},
    {"param_names": list(DECAYED), "lr": 0.01, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-10,
     "use_olion": False},
    {"param_names": list(NO_DECAY), "lr": 0.01, "betas": (0.9, 0.95), "weight_decay": 0.0, "eps": 1e-10,
     "use_olion": False},
]  # fmt: skip


def old_layout(state_dict: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`state_dict` (this layout, params named `names`) rewritten as the pre-change OLion saved it."""
    order = [*HIDDEN, *DECAYED, *NO_DECAY]
    groups, start = [], 0
    lrs = {k: v for k, v in state_dict["param_groups"][0].items() if k in ("lr", "initial_lr")}  # as scheduled
    for group in OLD_GROUPS:
        ids = list(range(start, start + len(group["param_names"])))
        groups.append({**group, **OLD_COMMON, **lrs, "params": ids})
        start += len(group["param_names"])
    state = {order.index(names[i]): value for i, value in state_dict["state"].items()}
    return {"state": state, "param_groups": groups}


def test_a_state_dict_saved_in_the_old_layout_loads_and_resumes_bitwise():
    model = make_net()
    opt = OLion(model.named_parameters(), lr=1e-2, adamw_lr=None)  # the old layout's default: AdamW at the group's lr
    train(model, opt, range(3))
    names = [n for n, _ in model.named_parameters()]
    buffer = io.BytesIO()
    torch.save(old_layout(opt.state_dict(), names), buffer)  # a checkpoint from an earlier run
    resumed = copy.deepcopy(model)
    opt2 = OLion(resumed.named_parameters(), lr=1e-2)
    opt2.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert len(opt2.param_groups) == 1 and opt2.param_groups[0]["orthogonal"] == [n in HIDDEN for n in names]
    assert opt2.state_dict()["param_groups"][0]["betas"] == (0.95, 0.98)  # OLion's, not the AdamW group's
    train(model, opt, range(3, 5))
    train(resumed, opt2, range(3, 5))
    assert same_tensors(params_of(model), params_of(resumed))


def test_an_old_layout_state_dict_that_does_not_fit_the_routing_is_refused_clearly():
    model = make_net()
    opt = OLion(model.named_parameters(), lr=1e-2)
    train(model, opt, range(1))
    saved = old_layout(opt.state_dict(), [n for n, _ in model.named_parameters()])
    other = OLion(make_net().named_parameters(), predicate=lambda name, p: p.ndim >= 2)  # head and wte: OLion
    with pytest.raises(ValueError, match=r"earlier layout .* does not match this optimizer's routing"):
        other.load_state_dict(saved)


def test_an_old_layout_checkpoint_with_its_lr_schedule_resumes_bitwise_after_remapping_the_scheduler():
    from framework.optim.schedulers import warmup_cosine

    model = make_net()
    opt = OLion(model.named_parameters(), lr=1e-2, adamw_lr=None)  # the old layout's default
    sched = warmup_cosine(opt, total_steps=10, warmup_steps=2)
    for step in range(3):
        train(model, opt, range(step, step + 1))
        sched.step()
    names = [n for n, _ in model.named_parameters()]
    old_sched = sched.state_dict()  # the old run had 3 groups of one lr: one entry each
    old_sched.update(base_lrs=old_sched["base_lrs"] * 3, _last_lr=old_sched["_last_lr"] * 3, lr_lambdas=[None] * 3)
    resumed = copy.deepcopy(model)
    opt2 = OLion(resumed.named_parameters(), lr=1e-2)
    sched2 = warmup_cosine(opt2, total_steps=10, warmup_steps=2)
    opt2.load_state_dict(copy.deepcopy(old_layout(opt.state_dict(), names)))  # as if read from a file
    sched2.load_state_dict(old_sched)
    assert remap_old_layout_scheduler(sched2) and sched2.base_lrs == [1e-2] and len(sched2.get_last_lr()) == 1
    for step in range(3, 6):
        for m, o, s in ((model, opt, sched), (resumed, opt2, sched2)):
            train(m, o, range(step, step + 1))
            s.step()
    assert (
        same_tensors(params_of(model), params_of(resumed)) and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    )
