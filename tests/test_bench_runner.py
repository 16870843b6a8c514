"""tools/bench/run_all.py writes BENCHMARKS.md: every section carries its own stamp (when, at which commit, whether
the tree differed, on which machine), a partial run replaces only its sections and keeps the others' stamps, and
BENCHMARKS.md is not written from a tree that differs from HEAD unless asked. The benchmarks themselves do not run
here: `run_one` is replaced by a stand-in that returns a fixed output."""

from __future__ import annotations

import datetime as dt
import importlib.util
import re

import pytest
from helpers import REPO

_spec = importlib.util.spec_from_file_location("bench_run_all", REPO / "tools" / "bench" / "run_all.py")
run_all = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_all)


def _sections(text: str) -> dict[str, str]:
    return {s.split("\n", 1)[0][3:]: s for s in re.split(r"^(?=## )", text, flags=re.M) if s.startswith("## ")}


@pytest.fixture
def bench(monkeypatch):
    """run_all with the benchmark replaced (prints 'new output'), on 'machine C' at commit c0ffee1, a clean tree."""
    calls = []

    def run_one(script, extra, assets):
        calls.append(script.stem)
        return 0, "new output\n", [], 90.0

    monkeypatch.setattr(run_all, "run_one", run_one)
    monkeypatch.setattr(run_all, "machine", lambda: "machine C")
    monkeypatch.setattr(run_all, "git_state", lambda *outputs: ("c0ffee1", []))
    return calls


def test_a_partial_run_replaces_its_section_and_keeps_the_other_sections_stamps(bench, tmp_path):
    old = {"gicdm": run_all.section("gicdm", "python tools/bench/gicdm.py", 60, 0, "gicdm rows", [],
                                    run_all.stamp(dt.datetime(2026, 12, 2, 18, 55), "30bc059", False, "machine A")),
           "kv_cache": run_all.section("kv_cache", "python tools/bench/kv_cache.py", 66, 0, "old rows", [],
                                       run_all.stamp(dt.datetime(2026, 12, 4, 8, 51), "4e482c5", True, "machine B"))}
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(run_all.HEADER + "\n" + "\n".join(old.values()))
    assert run_all.main(["--only", "kv_cache", "--out", str(out)]) == 0 and bench == ["kv_cache"]
    text = out.read_text()
    assert text.startswith(run_all.HEADER) and list(_sections(text)) == ["gicdm", "kv_cache"]
    assert _sections(text)["gicdm"].strip() == old["gicdm"].strip()  # untouched, its own stamp included
    new = _sections(text)["kv_cache"]
    (stamp,) = run_all.STAMP.finditer(new)
    assert (stamp["commit"], stamp["dirty"], stamp["machine"]) == ("c0ffee1", None, "machine C")
    assert "new output" in new and "old rows" not in new and "`python tools/bench/kv_cache.py` — 1.5 min" in new
    (gicdm_stamp,) = run_all.STAMP.finditer(_sections(text)["gicdm"])
    assert (gicdm_stamp["date"], gicdm_stamp["commit"], gicdm_stamp["machine"]) == ("2026-12-02 18:55", "30bc059",
                                                                                    "machine A")


def test_a_full_run_stamps_every_section_and_says_when_the_tree_differed(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(run_all, "git_state", lambda *outputs: ("c0ffee1", ["framework/optim/olion.py"]))
    out = tmp_path / "quick.md"  # not BENCHMARKS.md: a scratch file may come from a dirty tree, and says so
    assert run_all.main(["--out", str(out)]) == 0
    sections = _sections(out.read_text())
    assert list(sections) == bench and len(bench) >= 4
    for name, text in sections.items():
        (stamp,) = run_all.STAMP.finditer(text)
        assert (stamp["commit"], stamp["dirty"]) == ("c0ffee1", " with uncommitted changes"), name


def test_benchmarks_md_is_not_written_from_a_dirty_tree(bench, monkeypatch, capsys):
    monkeypatch.setattr(run_all, "git_state", lambda *outputs: ("c0ffee1", ["framework/optim/olion.py", "x.py"]))
    before = (REPO / "BENCHMARKS.md").read_bytes()
    assert run_all.main(["--only", "kv_cache"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: the working tree differs from commit c0ffee1 (framework/optim/olion.py and 1 more)")
    assert "--allow-dirty" in line and bench == [] and (REPO / "BENCHMARKS.md").read_bytes() == before


def test_every_section_of_benchmarks_md_carries_its_own_stamp():
    text = (REPO / "BENCHMARKS.md").read_text()
    assert text.startswith(run_all.HEADER)
    sections = _sections(text)
    assert {"gicdm", "kv_cache", "optimizers", "selection"} <= set(sections)
    for name, body in sections.items():
        assert run_all.STAMP.match(body.split("\n")[2]), f"## {name}: no stamp under its heading"
        assert len(list(run_all.STAMP.finditer(body))) == 1, name
