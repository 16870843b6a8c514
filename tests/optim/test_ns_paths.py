"""OLion's Newton–Schulz paths: the measured dtype choice (forced each way), the Gram form against float64 NS5,
the CPU workspace (bit for bit the same numbers) and the exact norm of a sign matrix."""

from __future__ import annotations

import io
import math
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import framework.optim.olion as olion_module
from framework.optim import OLion
from framework.optim import ns_dtype as nsd
from framework.optim.newton_schulz import (
    Workspace,
    gram_newton_schulz5,
    newton_schulz5,
    orthogonalize,
    sign_norm,
    uses_gram,
)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
    monkeypatch.delenv(nsd.ENV_VAR, raising=False)
    nsd.forget()
    yield
    nsd.forget()


def force_support(monkeypatch, native: bool) -> list[int]:
    """Make the device report bf16 matrix instructions (`native`) or none; returns a list counting the asks."""
    calls = []
    monkeypatch.setattr(nsd, "bf16_matrix_support", lambda device: calls.append(1) or (native, "stated by the test"))
    return calls


def record_dtypes(monkeypatch) -> list[torch.dtype]:
    seen = []
    original = olion_module.orthogonalize
    monkeypatch.setattr(olion_module, "orthogonalize", lambda x, **kw: seen.append(kw["dtype"]) or original(x, **kw))
    return seen


def stepped(opt_kwargs: dict | None = None, steps: int = 1) -> tuple[nn.Linear, OLion]:
    layer = nn.Linear(32, 48, bias=False)
    opt = OLion([("w", layer.weight)], lr=1e-2, **(opt_kwargs or {}))
    for k in range(steps):
        layer.weight.grad = torch.randn(48, 32, generator=torch.Generator().manual_seed(k))
        opt.step()
    return layer, opt


@pytest.mark.parametrize(("native", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_the_default_dtype_follows_the_devices_bf16_instructions(monkeypatch, native, expected):
    calls, seen = force_support(monkeypatch, native), record_dtypes(monkeypatch)
    _, opt = stepped(steps=3)
    assert seen == [expected] * 3 and len(calls) == 1  # asked once, then cached
    assert opt.param_groups[0][nsd.AUTO_KEY] == str(expected).removeprefix("torch.")
    stepped()  # a second optimizer in the same process reuses the answer
    assert len(calls) == 1
    name = str(expected).removeprefix("torch.")
    assert nsd.ns_record([opt]) == {"ns_dtype": name, "ns_dtype_from": "stated by the test"}


def test_the_choice_does_not_depend_on_a_timing(monkeypatch):
    """Two identical runs on a machine whose matmul timings swing (the issue: bf16 134x fp32's once, 0.57x the next)
    choose the same dtype: the timing is not consulted at all."""
    timings = iter([134.53, 0.57])
    monkeypatch.setattr(nsd, "measured_ratio", lambda device: next(timings))
    first = nsd.fast_ns_dtype("cpu")
    nsd.forget()
    assert nsd.fast_ns_dtype("cpu") == first
    assert next(timings) == 134.53  # never asked
    native, why = nsd.bf16_matrix_support("cpu")
    assert first == (torch.bfloat16 if native else torch.float32) and "CPU" in why


def test_an_explicit_dtype_or_the_environment_overrides_the_measurement(monkeypatch):
    calls, seen = force_support(monkeypatch, True), record_dtypes(monkeypatch)
    _, opt = stepped({"ns_dtype": "float32"})
    assert nsd.ns_record([opt]) == {"ns_dtype": "float32", "ns_dtype_from": "given (ns_dtype)"}
    monkeypatch.setenv(nsd.ENV_VAR, "float32")
    stepped()
    assert seen == [torch.float32, torch.float32] and not calls
    monkeypatch.setenv(nsd.ENV_VAR, "bf16")
    with pytest.raises(ValueError, match=r"FRAMEWORK_NS_DTYPE='bf16' is invalid: valid: bfloat16, float32"):
        stepped()


def test_a_resumed_optimizer_keeps_the_dtype_it_started_with(monkeypatch):
    force_support(monkeypatch, True)
    layer, opt = stepped()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    nsd.forget()
    force_support(monkeypatch, False)  # a machine without bf16 instructions would pick fp32
    seen = record_dtypes(monkeypatch)
    opt2 = OLion([("w", layer.weight)], lr=1e-2)
    opt2.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    layer.weight.grad = torch.randn(48, 32)
    opt2.step()
    assert seen == [torch.bfloat16]
    assert nsd.ns_record([opt2]) == {"ns_dtype": "bfloat16", "ns_dtype_from": "the checkpoint this run resumed"}


def test_a_checkpoint_from_before_ns_form_resumes_with_the_standard_fp32_iteration(monkeypatch):
    force_support(monkeypatch, True)
    layer, opt = stepped()
    state = opt.state_dict()
    for group in state["param_groups"]:  # what OLion saved before ns_form and the measured dtype existed
        del group["ns_form"], group[nsd.AUTO_KEY]
    opt2 = OLion([("w", layer.weight)], lr=1e-2)
    opt2.load_state_dict(state)
    assert opt2.param_groups[0]["ns_form"] == "standard"
    assert opt2.param_groups[0][nsd.AUTO_KEY] == "float32"


def test_the_real_device_answer_is_logged_with_its_reason(caplog):
    with caplog.at_level("INFO", logger=nsd.__name__):
        dtype = nsd.fast_ns_dtype("cpu")
    assert dtype in (torch.bfloat16, torch.float32)
    assert nsd.bf16_matrix_support("cpu")[1] in caplog.text and nsd.ENV_VAR in caplog.text


def test_a_bad_ns_form_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"ns_form='fast' is invalid: valid: auto, standard, gram"):
        OLion([("w", nn.Parameter(torch.randn(4, 4)))], ns_form="fast")


def fixed_matrices() -> list[tuple[str, torch.Tensor]]:
    """Gaussian and low-rank-plus-noise matrices (the hard case for 16-bit Gram iterations), every orientation."""
    gen, mats = torch.Generator().manual_seed(0), []
    for shape in [(128, 128), (256, 128), (128, 512), (512, 128), (3, 64, 256)]:
        mats.append((f"gaussian {shape}", torch.randn(*shape, generator=gen)))
        low = torch.randn(*shape[:-1], 6, generator=gen) @ torch.randn(6, shape[-1], generator=gen)
        mats.append((f"low-rank {shape}", low + 0.1 * torch.randn(*shape, generator=gen)))
    return mats


def agreement(q: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.sign(q.double()) == torch.sign(ref)).double().mean().item()


@pytest.mark.parametrize(("form", "dtype", "floor"), [
    ("standard", torch.float32, 0.999), ("standard", torch.bfloat16, 0.98),
    ("gram", torch.float32, 0.999), ("gram", torch.bfloat16, 0.98),
])  # fmt: skip
def test_every_path_agrees_in_sign_with_float64_ns5(form, dtype, floor):
    for name, g in fixed_matrices():
        ref = newton_schulz5(g.double(), dtype=None)
        assert agreement(orthogonalize(g, dtype=dtype, form=form), ref) >= floor, name


def test_the_gram_form_is_the_same_map_and_needs_its_restart_in_bf16():
    for name, g in fixed_matrices():
        ref = newton_schulz5(g.double(), dtype=None)
        torch.testing.assert_close(gram_newton_schulz5(g.double(), dtype=None), ref, rtol=0, atol=1e-9)
        if name.startswith("low-rank"):  # without the restart bf16 rounding of X·Xᵀ loses the small directions
            assert agreement(gram_newton_schulz5(g, restart=99), ref) < 0.9, name


def test_auto_uses_the_gram_form_from_aspect_ratio_two():
    assert [uses_gram(s, "auto") for s in [(384, 384), (500, 384), (768, 384), (384, 1536), (2, 64, 32)]] == [
        False, False, True, True, True]  # fmt: skip
    assert uses_gram((64, 64), "gram") and not uses_gram((64, 256), "standard")


def _rank_worker(rank: int, init_file: str, out: str) -> None:
    import os

    torch.set_num_threads(1)
    os.environ[nsd.ENV_VAR] = ("float32", "bfloat16")[rank]  # the two ranks would choose differently
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        _, opt = stepped({"distributed": "redundant"})
        Path(f"{out}.{rank}").write_text(opt.param_groups[0][nsd.AUTO_KEY])
    finally:
        dist.destroy_process_group()


def test_every_rank_runs_rank_zeros_choice():
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "choice")
        mp.start_processes(_rank_worker, args=(str(Path(tmp) / "init"), out), nprocs=2, join=True,
                           start_method="fork")
        assert [Path(f"{out}.{r}").read_text() for r in range(2)] == ["float32", "float32"]


def exact_root(count: int) -> torch.Tensor:
    """√count correctly rounded to fp32: math.sqrt rounds correctly in fp64, and rounding that on to fp32 is still
    correct for an integer count < 2^24 (√n lies ≥ 4 fp64 ulps from every fp32 rounding midpoint)."""
    return torch.tensor(math.sqrt(count), dtype=torch.float32)


def ulp(t: torch.Tensor) -> torch.Tensor:
    """The spacing of fp32 values at |t|, elementwise."""
    return torch.nextafter(t.abs(), torch.tensor(math.inf)) - t.abs()


@pytest.mark.parametrize("ns_dtype", [torch.bfloat16, torch.float32])
def test_the_fused_sign_update_is_the_scaled_fp32_one_up_to_rounding(ns_dtype):
    gen = torch.Generator().manual_seed(4)
    w = nn.Parameter(torch.randn(96, 384, generator=gen))
    w.grad = torch.randn(96, 384, generator=gen)
    before = w.detach().clone()
    OLion([("w", w)], lr=0.02, ns_dtype=ns_dtype).step()
    c = w.grad.lerp(torch.zeros_like(w).lerp_(w.grad, 1 - 0.98), 0.95)  # the first step's direction
    u = torch.sign(orthogonalize(c, dtype=ns_dtype, form="auto")).float()  # the unfused update, written out
    scale = 96**0.5 / (exact_root(int(torch.count_nonzero(u))) + 1e-8) * (0.2 * 384**0.5)
    expected = before.mul_(1 - 0.02 * 0.1).add_(u * scale, alpha=-0.02)
    # addcmul_(q, scale, value=−lr) and add_(q·scale, alpha=−lr) compute the same product and sum (q·scale is exact)
    # in different kernels, either of which may round lr·scale before adding it (an FMA or not, per CPU build): they
    # agree to one spacing of the result (two at a binade edge) plus the rounding of the step itself
    bound = 2 * ulp(expected) + ulp(0.02 * scale)
    assert ((w.detach() - expected).abs() <= bound).all()


@pytest.mark.parametrize("form", ["standard", "gram"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ns_in_a_workspace_is_bit_for_bit_ns_without_one(form, dtype):
    gen = torch.Generator().manual_seed(5)
    ws = Workspace()
    shapes = [(96, 384), (384, 96), (64, 64), (3, 40, 20), (3, 20, 40), (2, 2, 30, 8)]
    for rnd in range(2):  # the second round reuses every buffer the first one made
        for shape in shapes:
            G = torch.randn(*shape, generator=gen)
            expected = orthogonalize(G, dtype=dtype, form=form)
            assert torch.equal(orthogonalize(G, dtype=dtype, form=form, ws=ws), expected)
            scratch = G.to(dtype, copy=True)  # the caller's own buffer, divided in place
            assert torch.equal(orthogonalize(scratch, dtype=dtype, form=form, ws=ws, scratch=True),
                               orthogonalize(G.to(dtype), dtype=dtype, form=form))
        if rnd == 0:
            made = len(ws)
    assert len(ws) == made  # nothing new after the first round


def test_olion_on_cpu_makes_its_buffers_once_and_reuses_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 96), nn.GELU(), nn.Linear(96, 96), nn.GELU(), nn.Linear(96, 32))
    opt = OLion(model.named_parameters(), lr=0.01, ns_dtype=torch.bfloat16)
    sizes = []
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        sizes.append(len(opt._workspace))
    assert sizes[0] > 0 and sizes == [sizes[0]] * 3
    assert torch.isfinite(torch.cat([p.detach().flatten() for p in model.parameters()])).all()


@pytest.mark.parametrize("shape", [(96, 384), (7, 13), (1536, 384), (3, 5), (2, 48, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8])
def test_sign_norm_is_the_correctly_rounded_root_of_the_nonzero_count(shape, dtype):
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(*shape, generator=gen).sign()
    q[..., 0, :] = 0  # zero rows (a zero gradient row) must not count
    q = q.to(dtype)
    exact = exact_root(int(torch.count_nonzero(q)))  # (96, 384): √36480, which torch's fp32 sqrt misrounds on an EPYC
    for view in (q, q.mT):
        assert torch.equal(sign_norm(view), exact)
        # vector_norm takes its own root, not promised to be correctly rounded: within one ulp
        ref = torch.linalg.vector_norm(view.float())
        assert torch.nextafter(exact, torch.tensor(0.0)) <= ref <= torch.nextafter(exact, torch.tensor(math.inf))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_sign_norm_rounds_every_count_correctly(dtype):
    for n in range(36_000, 37_000):  # torch's own fp32 sqrt misrounds ~1 in 5 integers here on an AMD EPYC
        assert torch.equal(sign_norm(torch.ones(n, dtype=dtype)), exact_root(n)), n
