"""The configuration reference (docs/reference/config.md) and `python -m framework.ls KIND NAME`: the reference is
current with the code, names every key of the composed configs, and every key of our own components means something;
the docstring reader reads Google-style, torch's and Lightning's `Args:` sections."""

from __future__ import annotations

import subprocess
import sys

import lightning as L
import pytest
import torch
from helpers import REPO, run_cli
from hydra import compose, initialize
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import OmegaConf

from framework.config_docs import GUIDES, guide, meanings, parse_args
from framework.config_markdown import reference, run_options
from framework.config_reference import HIDDEN, find_kind, registered, render
from framework.ls import main as ls_main
from framework.registry import CALLBACKS, GROUPS, KINDS, RECIPES, STRATEGIES

REFERENCE = REPO / "docs" / "reference" / "config.md"
REGENERATE = "python -m framework.ls --markdown docs/reference/config.md"


@pytest.fixture(scope="module")
def text() -> str:
    return reference()


def test_the_reference_is_current(text):
    assert REFERENCE.is_file(), f"docs/reference/config.md is missing: run `{REGENERATE}`"
    assert REFERENCE.read_text() == text, f"docs/reference/config.md is out of date: run `{REGENERATE}`"


def _leaves(node: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out += _leaves(value, f"{prefix}{key}.")
        elif key not in HIDDEN:
            out.append((f"{prefix}{key}", value))
    return out


@pytest.mark.parametrize("recipe", ["char_lm", "sft"])
def test_every_key_of_a_composed_recipe_is_in_the_reference(text, recipe):
    with initialize(version_base="1.3", config_path=None):
        cfg = compose("train", overrides=[f"recipe={recipe}"], return_hydra_config=True)
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    keys = _leaves({k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k != "hydra"})
    assert len(keys) > 100
    missing = []
    for dotted, value in keys:
        group, _, rest = dotted.partition(".")
        if group in GROUPS and not rest:  # a group left empty (`loss: null`): its section lists the options
            found = value is None and f"## `{group}`" in text
        elif group == "callbacks":
            name = rest.split(".", 1)[0]
            found = f"| `{dotted}` |" in render(registered("callback", name), markdown=True)
        elif group in GROUPS:
            block = render(registered(GROUPS[group].kind, choices[group]), markdown=True)
            found = block in text and f"| `{dotted}` |" in block
        else:  # the run's own keys, trainer.*, hub.*, guard.*
            found = f"`{dotted}`" in text
        if not found:
            missing.append(dotted)
    assert not missing, f"keys of recipe={recipe}'s composed config not in the reference: {missing}"


def _own_keys_without_meaning() -> list[str]:
    """`group=name: key` for each key of a framework.* component (and the run's own, hub, guard) with no meaning."""
    lacking = []
    for registry in KINDS.values():
        if registry in (RECIPES, STRATEGIES):
            continue
        for name in registry.names():
            option = registered(registry.kind, name)
            if dict(option.facts)["target"].startswith("framework."):
                lacking += [f"{option.heading}: {k}" for k, _, meaning in option.keys if not meaning]
    for option in run_options():  # the run's own keys, hub.*, guard.* (trainer.*: Lightning's)
        if option.name != "trainer":
            lacking += [f"{option.prefix}{k}" for k, _, meaning in option.keys if not meaning]
    return lacking


def test_every_key_of_our_own_components_has_a_meaning():
    lacking = _own_keys_without_meaning()
    assert not lacking, f"{len(lacking)} keys of our own components have no `Args:` entry: {lacking}"


def test_every_guide_named_exists_and_names_the_option():
    for kind, rules in GUIDES.items():
        assert kind in KINDS, kind
        for _, page in rules:
            assert (REPO / "docs" / page).is_file(), f"docs/{page} (the guide of some {kind}s) does not exist"
    for kind, registry in KINDS.items():
        for name in registry.names():
            page = guide(kind, name)
            if page:
                said = (REPO / "docs" / page).read_text()
                target = registry.get(name)
                # or a recipe this one is built on, or one that chooses this name
                recipes = [r for r in RECIPES.names() if f"/recipe/{r}" in str(getattr(target, "defaults", ""))
                           or f"/{registry.group}': '{name}'" in str(RECIPES.get(r).get("defaults", ""))]
                words = [name, getattr(target, "__name__", name), *recipes]
                assert any(w in said for w in words), f"docs/{page}, the guide of {kind} {name}, names none of {words}"


GOOGLE = '''Summary line.

Args:
    lr: step size, e.g. 1e-3. Larger diverges.
    betas: (β1, β2): β1 the interpolation weight, β2 the momentum's EMA decay.
    long_one (int, optional): a sentence that goes on
        over the next line. And a second sentence.
    **kwargs: passed on.

Returns:
    nothing: not an argument.
'''


def test_the_docstring_reader_reads_google_torch_and_lightning_args():
    said = parse_args(GOOGLE)
    assert said == {"lr": "step size, e.g. 1e-3.", "betas": "(β1, β2): β1 the interpolation weight, β2 the "
                    "momentum's EMA decay.", "long_one": "a sentence that goes on over the next line.",
                    "kwargs": "passed on."}
    adamw = meanings(torch.optim.AdamW)
    assert adamw["lr"] == "learning rate"  # "(default: 1e-3)" is dropped: the reference prints the config's
    assert adamw["betas"] == "coefficients used for computing running averages of gradient and its square."
    assert meanings(ModelCheckpoint)["save_top_k"].startswith("if `save_top_k == k`, the best k models")
    trainer = meanings(L.Trainer)
    assert trainer["max_steps"] == "Stop training after this number of steps."
    assert set(trainer) >= {p for p in __import__("inspect").signature(L.Trainer).parameters if p != "self"}


def test_ls_prints_a_name_s_keys_and_refuses_an_unknown_one(capsys):
    assert ls_main(["data", "images"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("data images: Your own images") and "target:   framework.data.images.ImageData" in out
    assert "image_column = image" in out and "guide:    docs/images.md" in out
    assert ls_main(["data", "im*"]) == 0 and capsys.readouterr().out.strip() == "data: images"  # a wildcard lists
    assert ls_main(["recipe", "sft"]) == 0
    out = capsys.readouterr().out
    assert "choices:  data=chat model=hf_causal_lm module=causal_lm optimizer=adamw" in out
    assert "model.name_or_path = HuggingFaceTB/SmolLM2-135M-Instruct" in out and "adamw+lora 0.0002" in out
    assert ls_main(["optimizer", "olon"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Unknown optimizer 'olon'. Did you mean 'olion'") and len(err.splitlines()) == 1
    assert find_kind("callbacks") is CALLBACKS


# make test-slow, like every CLI's fresh process but framework.train's (tests/test_errors.py): about 9 s, nearly all
# of it the catalog's import; make test runs the same main() in process above and in tests/test_readme_commands.py
@pytest.mark.slow
def test_ls_optimizer_olion_in_a_fresh_process():
    result = run_cli("optimizer", "olion", module="framework.ls", timeout=300)
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.strip().startswith("ns_steps = 5"))
    assert line.split("ns_steps = 5", 1)[1].strip() == "Newton-Schulz iterations per update."
    assert "supplied by the framework: params" in result.stdout and "guide:    docs/olion.md" in result.stdout
    # (`optimizer olon` exits 2 with the close matches: in this process above; a fresh one in test_errors.py's kind)


def test_importing_framework_ls_loads_no_hf_or_timm():
    code = ("import sys, framework.ls; heavy = [m for m in ('transformers', 'datasets', 'timm', 'lightning') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr
