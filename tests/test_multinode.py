"""Several nodes, simulated on one machine: the cluster guide's two torchrun lines (2 nodes x 1 process, gloo), both
writing into one run dir. make test-slow runs them as printed (four fresh processes: two launchers, two workers) and
they end within 1e-6 of the same run as 1 node x 2 processes; make test runs the workers those lines start, with the
environment torchrun gives them, forked warm (`support.warm_cli`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import guides, warm_cli

pytestmark = pytest.mark.ddp


def cluster_lines() -> list[list[str]]:
    """The torchrun lines of docs/guides/cluster.md (its SLURM script's lines left out)."""
    return [line for line in guides.command_lines("cluster", comments=True) if line and line[0] == "torchrun"]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def _as_torchrun_starts_it(line: list[str]) -> tuple[str, list[str], dict[str, str]]:
    """The worker a torchrun line starts (one per node here, `--nproc-per-node=1`): its module, its arguments and the
    environment torchrun's local agent gives it (ranks, sizes, the rendezvous address; the static rendezvous's run id
    "none"). No agent runs, so no agent store: rank 0 hosts the store at the rendezvous address, as `env://` does."""
    at = line.index("-m")
    flags = dict(a.removeprefix("--").split("=", 1) for a in line[1:at])
    nodes, node = flags["nnodes"], flags["node-rank"]
    assert flags["nproc-per-node"] == "1", flags
    torchrun = {"RANK": node, "LOCAL_RANK": "0", "GROUP_RANK": node, "ROLE_RANK": node, "ROLE_NAME": "default",
                "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": nodes, "GROUP_WORLD_SIZE": nodes, "ROLE_WORLD_SIZE": nodes,
                "MASTER_ADDR": flags["master-addr"], "MASTER_PORT": flags["master-port"],
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
                "TORCHELASTIC_USE_AGENT_STORE": "False"}
    return line[at + 1], line[at + 2:], {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **torchrun}


def _two_nodes(tmp_path: Path, small: bool = False) -> tuple[list[list[str]], Path, dict]:
    """The guide's two torchrun lines together in `tmp_path`, as printed or (`small`) their workers forked warm:
    both nodes exit 0 and write into the one run dir the lines name (rank 1's record beside rank 0's). Returns the
    lines, that dir and its results."""
    lines = cluster_lines()
    assert len(lines) == 2 and all(line[0] == "torchrun" for line in lines)
    if small:
        nodes = [warm_cli.popen(module, args, env, tmp_path)
                 for module, args, env in map(_as_torchrun_starts_it, lines)]
    else:
        nodes = [subprocess.Popen(line, cwd=tmp_path, env=_env(), text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for line in lines]
    outs = [node.communicate(timeout=600) for node in nodes]
    for node, (_, err) in zip(nodes, outs, strict=True):
        assert node.returncode == 0, err[-3000:]
    two_nodes = tmp_path / "runs" / "two_nodes"
    results = json.loads((two_nodes / "results.json").read_text())
    assert results["status"] == "finished" and (two_nodes / "results.rank1.json").exists()  # both nodes wrote here
    assert results["global_step"] > 0 and json.loads((two_nodes / "results.rank1.json").read_text())["global_step"] \
        == results["global_step"]
    return lines, two_nodes, results


def test_the_workers_the_torchrun_lines_start_train_as_two_nodes_into_one_run_dir(tmp_path):
    _, _, results = _two_nodes(tmp_path, small=True)
    assert results["choices"]["size"] == "smoke" and "trainer.num_nodes=2" in results["command"]


# make test-slow: the guide's two torchrun lines as printed (smoke-sized already: four fresh processes, two launchers
# and two workers, about 20 s of both cores), compared with one node of two processes
@pytest.mark.slow
def test_two_nodes_by_torchrun_as_printed_end_as_one_node_with_two_processes(tmp_path):
    lines, two_nodes, results = _two_nodes(tmp_path)

    one_node = tmp_path / "one_node"
    args = [a for a in lines[0][lines[0].index("-m") + 2:] if not a.startswith(("trainer.num_nodes=",
                                                                                   "trainer.devices=", "hydra."))]
    proc = subprocess.run([sys.executable, "-m", "framework.train", *args, "trainer.devices=2",
                           f"hydra.run.dir={one_node}"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _weights(two_nodes), _weights(one_node)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    assert results["global_step"] == json.loads((one_node / "results.json").read_text())["global_step"]
