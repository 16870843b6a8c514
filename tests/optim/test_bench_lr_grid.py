"""The optimizer benchmark's sweep logic: a best lr on a grid's edge extends the grid; the lr ratio's first match."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "bench" / "optimizers.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_optimizers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(name: str, results: dict[float, float]) -> list[dict]:
    return [{"optimizer": name, "lr": lr, "bpb": v} for lr, v in results.items()]


def test_a_best_on_an_edge_adds_one_point_past_it_and_an_interior_best_adds_none(bench):
    grids = {"olion": [0.01, 0.02, 0.04], "adamw": [0.001, 0.003, 0.01], "lion": [1e-4, 3e-4, 1e-3]}
    found = (rows("olion", {0.01: 3.0, 0.02: 2.9, 0.04: 2.8}) + rows("adamw", {0.001: 3.0, 0.003: 2.5, 0.01: 2.7})
             + rows("lion", {1e-4: 4.0, 3e-4: 4.5, 1e-3: 5.0}))
    added = bench.extend(found, "bpb", grids)
    assert sorted(added) == [("lion", pytest.approx(1e-4 / 3)), ("olion", pytest.approx(0.08))]
    assert grids["adamw"] == [0.001, 0.003, 0.01] and grids["olion"][-1] == pytest.approx(0.08)


def test_the_lr_ratio_uses_the_smallest_lr_that_reaches_the_target(bench):
    found = rows("olion", {0.003: 3.3, 0.01: 3.1, 0.03: 2.9, 0.1: 3.0})
    assert bench.first_match(found, "bpb", "olion", 3.15)["lr"] == 0.01
    assert bench.first_match(found, "bpb", "olion", 2.95)["lr"] == 0.03
    assert bench.first_match(found, "bpb", "olion", 2.0) is None
