"""Every registered name composes into a config and builds; the library never imports the catalog or Hydra."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize
from hydra.errors import InstantiationException
from hydra_zen import instantiate
from omegaconf import OmegaConf

from framework.registry import GROUPS, RECIPES

ENTRIES = [(g, n) for g, reg in GROUPS.items() if reg is not RECIPES for n in reg.names(aliases=True)]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hydra():
    with initialize(version_base="1.3", config_path=None):
        yield


def _choice(group: str, name: str) -> str:
    return f"{group}=[{name}]" if group == "callbacks" else f"{group}={name}"


@pytest.mark.parametrize(("group", "name"), ENTRIES, ids=[f"{g}={n}" for g, n in ENTRIES])
def test_every_registered_name_composes_and_instantiates(hydra, group, name, tmp_path):
    cfg = compose(config_name="train", overrides=[_choice(group, name)])
    node = cfg[group][name] if group == "callbacks" else cfg[group]
    assert node is not None and "_target_" in node
    plain = OmegaConf.to_container(node, resolve=False)
    node = {k: (str(tmp_path) if isinstance(v, str) and "hydra:" in v else v) for k, v in plain.items()}
    if group == "data" and "source" in node and node["source"] is None:  # the user's own data: named by the user
        with pytest.raises(InstantiationException, match="data.source= is required"):
            instantiate(node)
        return
    if (group, name) == ("peft", "qlora") and not torch.cuda.is_available():  # CUDA only, refused by name elsewhere
        with pytest.raises(InstantiationException, match="peft=qlora .* CUDA GPU"):
            instantiate(node)
        return
    assert instantiate(node) is not None


@pytest.mark.parametrize("name", RECIPES.names())
def test_every_recipe_composes_at_every_size(hydra, name):
    for size in ("cpu", "smoke", "gpu"):
        cfg = compose(config_name="train", overrides=[f"recipe={name}", f"size={size}"])
        assert cfg.data is not None and cfg.module is not None
        # a GPU where there is one (auto); size=gpu insists on one, in bf16 mixed precision (every recipe trains in it)
        assert cfg.trainer.accelerator == ("gpu" if size == "gpu" else "auto")
        # recipe=sft: `auto`, bf16 where the GPU has it and fp32 elsewhere (framework.devices.auto_precision)
        assert cfg.trainer.precision == ("bf16-mixed" if size == "gpu" else "auto" if name == "sft" else None)


#: The library's public component packages and modules: importing any of them must not import Hydra or the catalog.
COMPONENTS = ["framework.optim", "framework.losses", "framework.metrics", "framework.callbacks", "framework.samplers",
              "framework.probes", "framework.models", "framework.modules", "framework.data", "framework.checkpointing",
              "framework.hub", "framework.rundir"]
BRIDGES: set[str] = set()  # modules allowed to import the catalog: none (load_catalog finds it by entry point)
IMPORT_EACH = """
import importlib, json, pkgutil, sys
FORBIDDEN = ("hydra", "hydra_zen", "framework.catalog", "framework.recipes")
roots, skip = sys.argv[1].split(","), set(sys.argv[2].split(","))
imported, found = [], {}
for root in roots:
    pkg = importlib.import_module(root)
    names = [i.name for i in pkgutil.walk_packages(getattr(pkg, "__path__", []), root + ".")]
    for name in [root, *names]:
        if name in skip or "__main__" in name:
            continue
        importlib.import_module(name)
        imported.append(name)
        found.update({m: name for m in FORBIDDEN if m in sys.modules and m not in found})
print(json.dumps({"imported": imported, "forbidden": found}))
"""


def test_importing_any_component_imports_neither_hydra_nor_the_catalog():
    """Every module of the library's component packages, imported in one fresh process: no Hydra, no catalog."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH, ",".join(COMPONENTS), ",".join(BRIDGES)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert {"framework.callbacks.hub_push", "framework.hub.push", "framework.optim.olion"} <= set(result["imported"])
    assert result["forbidden"] == {}  # forbidden module → the first component after whose import it was there
