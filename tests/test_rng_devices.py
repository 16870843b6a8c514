"""Every random draw in framework/ runs on its generator's device, by construction (framework/rng.py): read from the
source, so a new draw that would raise "Expected a 'cpu' device type for generator" on a GPU fails here, on a CPU."""

from __future__ import annotations

import ast

import pytest
import torch
from helpers import REPO

from framework.rng import draw_device, to_generator

#: ops that make a tensor from nothing: they need `device=` taken from the generator
FACTORIES = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "empty", "normal"}
#: ops that sample from an input tensor: the input must be on the generator's device
FROM_INPUT = {"multinomial", "bernoulli", "poisson", "binomial", "_standard_gamma", "_sample_dirichlet"}


def _draws(tree: ast.AST):
    """(call, op name, generator source, the local names' assigned sources) for each draw with a generator."""
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] or [tree]
    seen = set()
    for scope in [*scopes, tree]:
        local = {t.id: ast.unparse(n.value) for n in ast.walk(scope) if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or id(node) in seen:
                continue
            gen = next((k.value for k in node.keywords if k.arg == "generator"), None)
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if gen is not None and not (isinstance(gen, ast.Constant) and gen.value is None) and name in (
                    FACTORIES | FROM_INPUT):
                seen.add(id(node))
                yield node, name, ast.unparse(gen), local


def violations(source: str, where: str = "<source>") -> list[str]:
    """The draws of `source` whose device does not come from their generator (a local name is followed to the
    value its function assigns it)."""
    bad = []
    for node, name, gen, local in _draws(ast.parse(source)):
        if name in FACTORIES:
            device = next((ast.unparse(k.value) for k in node.keywords if k.arg == "device"), "")
            device = local.get(device, device)
            ok = device.startswith(f"draw_device({gen}") or device == f"{gen}.device"
        else:
            first = ast.unparse(node.args[0]) if node.args else ""
            ok = (first.startswith("to_generator(") and first.endswith(f", {gen})")
                  or first.endswith(f".to({gen}.device)"))
        if not ok:
            bad.append(f"{where}:{node.lineno}: {ast.unparse(node)[:100]}")
    return bad


def test_every_draw_in_framework_takes_its_device_from_its_generator():
    files = sorted((REPO / "framework").rglob("*.py"))
    found = [v for f in files for v in violations(f.read_text(), str(f.relative_to(REPO)))]
    assert found == [], "draws whose device does not come from their generator:\n" + "\n".join(found)
    assert sum(1 for f in files for _ in _draws(ast.parse(f.read_text()))) >= 30  # the check sees the draws


@pytest.mark.parametrize(("source", "n_bad"), [
    ("torch.rand(3, generator=g)", 1),  # no device: the default device, maybe not the generator's
    ("torch.rand(3, generator=g, device=x.device)", 1),  # another tensor's device
    ("torch.rand(3, generator=g, device=g.device)", 0),
    ("torch.randint(0, 5, (3,), generator=gen, device=draw_device(gen, x.device))", 0),
    ("torch.multinomial(probs, 1, generator=g)", 1),
    ("torch.multinomial(to_generator(probs, g), 1, generator=g)", 0),
    ("torch.randperm(4, generator=None)", 0),
    ("def f(g, x):\n    where = draw_device(g, x.device)\n    return torch.rand(3, generator=g, device=where)", 0),
    ("def f(g, x):\n    where = x.device\n    return torch.rand(3, generator=g, device=where)", 1),
    ("decode(model, generator=g)", 0),  # passes it on: the callee's draws are checked where they are
])
def test_the_check_flags_a_draw_whose_device_is_not_its_generators(source, n_bad):
    assert len(violations(source)) == n_bad


def test_the_helpers_put_a_draw_on_the_generators_device():
    g = torch.Generator().manual_seed(0)
    assert draw_device(g, "meta") == torch.device("cpu") and draw_device(None, "meta") == "meta"
    x = torch.ones(2, dtype=torch.float64)
    assert to_generator(x, g).device == torch.device("cpu") and to_generator(x, None) is x
