"""How OLion splits Newton–Schulz work: cost-balanced owners, same-shape batches, and batched == loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.optim import OLion
from framework.optim.ns_sharing import assign_owners, make_units, ns_cost

torch.set_num_threads(1)


def test_owners_balance_newton_schulz_cost_not_matrix_count():
    # one big matrix costs as much as the eight small ones together: 1 vs 8 matrices, equal cost
    costs = [ns_cost((64, 64))] + [ns_cost((32, 32))] * 8
    owners = assign_owners(costs, 2)
    assert owners[0] != owners[1] and len(set(owners[1:])) == 1
    loads = [sum(c for c, o in zip(costs, owners, strict=True) if o == r) for r in range(2)]
    assert loads[0] == loads[1]


def test_owner_assignment_is_longest_first_and_deterministic():
    costs = [ns_cost(s) for s in [(384, 384), (1536, 384), (384, 1536), (768, 384)] * 6]
    owners = assign_owners(costs, 2)
    assert owners == assign_owners(costs, 2)
    loads = [sum(c for c, o in zip(costs, owners, strict=True) if o == r) for r in range(2)]
    assert max(loads) / sum(loads) < 0.51  # within 1% of an even split
    assert assign_owners(costs, 1) == [0] * len(costs)


def test_cost_views_conv_kernels_as_out_by_in_times_kernel():
    assert ns_cost((8, 4, 3, 3)) == ns_cost((8, 36)) == 8 * 8 * (10 * 36 + 5 * 8)


def test_gram_cost_is_the_multiply_count_of_the_gram_form():
    # per 384³: standard NS5 of a 1536×384 matrix 45, the Gram form with its restart 30; at aspect 2: 25 vs 22
    unit = 384**3
    assert ns_cost((1536, 384)) == 45 * unit and ns_cost((1536, 384), gram=True) == 30 * unit
    assert ns_cost((384, 768)) == 25 * unit and ns_cost((384, 768), gram=True) == 22 * unit


def test_units_group_equal_keys_in_order_and_cut_at_the_batch_size():
    keys = ["a", "b", "a", "a", "b", "a", "c"]
    assert make_units(keys, [2] * 7) == [[0, 2], [1, 4], [3, 5], [6]]
    assert make_units(keys, [1] * 7) == [[i] for i in range(7)]
    assert make_units(keys, [8] * 7) == [[0, 2, 3, 5], [1, 4], [6]]


def stacked_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(48, 48) for _ in range(4)], nn.Linear(48, 96), nn.Linear(96, 48))


@pytest.mark.parametrize("sign", [True, False])
def test_batched_newton_schulz_steps_equal_the_per_matrix_loop_within_fp32_rounding(sign):
    runs = []
    for ns_batch in (1, 4):
        model = stacked_model()
        opt = OLion(model.named_parameters(), lr=1e-2, ns_dtype=torch.float32, ns_batch=ns_batch, sign=sign)
        for step in range(3):
            x = torch.randn(32, 48, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        runs.append([p.detach().clone() for p in model.parameters()])
    start = [p.detach() for p in stacked_model().parameters()]
    for loop, batched, w0 in zip(*runs, start, strict=True):
        assert not torch.equal(loop, w0)
        torch.testing.assert_close(batched, loop, rtol=0, atol=1e-6)


def test_batched_calls_stack_same_shape_matrices(monkeypatch):
    import framework.optim.olion as olion_module

    seen = []
    original = olion_module.orthogonalize

    def recording(x, **kw):
        seen.append(tuple(x.shape))
        return original(x, **kw)

    monkeypatch.setattr(olion_module, "orthogonalize", recording)
    model = stacked_model()
    opt = OLion(model.named_parameters(), lr=1e-2, ns_batch=3)
    model(torch.randn(4, 48)).sum().backward()
    opt.step()
    assert seen == [(3, 48, 48), (48, 48), (96, 48), (48, 96)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"distributed": "ring"}, "distributed='ring' is invalid: valid: round_robin, redundant"),
     ({"ns_batch": 0}, "ns_batch=0 is invalid"), ({"ns_batch": 2.0}, "ns_batch=2.0 is invalid")],
)
def test_bad_sharing_options_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OLion(stacked_model().named_parameters(), **kwargs)
