"""DataSelection under 2-process DDP (gloo, CPU): identical selections and score tables, disjoint equal shards."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO

SCRIPT = Path(__file__).with_name("ddp_selection_run.py")


@pytest.mark.ddp
@pytest.mark.long
@pytest.mark.parametrize("policy", [pytest.param("data_agent", marks=pytest.mark.slow),  # 17 s; make test gathers
                                    # the ranks' scores in process (tests/samplers/test_rank_gather.py)
                                    pytest.param("data_agent_staleness", marks=pytest.mark.slow),
                                    pytest.param("infobatch", marks=pytest.mark.slow)])
def test_two_ranks_select_identically_train_disjoint_shards_and_keep_identical_tables(tmp_path, policy):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), policy], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                      "PYTHONPATH": os.pathsep.join([str(REPO), *_inherited()])})
    assert proc.returncode == 0, proc.stderr[-3000:]  # finishing at all: no rank hung at an epoch end
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    assert r0["selections"].keys() == r1["selections"].keys() == {0, 1, 2}
    for epoch, selection in r0["selections"].items():
        assert torch.equal(selection, r1["selections"][epoch])
        a, b = r0["seen"][epoch], r1["seen"][epoch]
        assert len(a) == len(b) and a == selection[0::2].tolist() and b == selection[1::2].tolist()
        distinct = len(set(selection.tolist()))
        assert len(a) + len(b) - distinct <= 1  # at most world_size - 1 padded duplicates
    assert len(r0["seen"][2]) == 85 and min(len(r0["seen"][0]), len(r0["seen"][1])) < 85  # pruned; last full
    assert len(r0["tables"]) == len(r1["tables"]) > 0
    assert all(torch.equal(x, y) for x, y in zip(r0["tables"], r1["tables"], strict=True))
    assert all(torch.equal(r0["model"][k], r1["model"][k]) for k in r0["model"])
    if policy.startswith("data_agent"):
        assert all(torch.equal(x, y) for x, y in zip(r0["agent"], r1["agent"], strict=True))
    assert r0["cost"] == r1["cost"] < 1


def _inherited() -> list[str]:
    """The caller's PYTHONPATH entries: the repository under test must win over any installed copy."""
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
