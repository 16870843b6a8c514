"""conf/, the YAML side: Hydra settings, the `size` group and per-recipe presets, YAML recipes on the search path;
and recipes as data (no recipe imports another, inheritance by Hydra defaults)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO, run_cli
from hydra import compose, initialize
from omegaconf import OmegaConf

from framework.recipe import CONF_DIR, RECIPES, fit_to_choices, smoke_overrides, unfit


def readme_yaml_recipe() -> str:
    """The YAML recipe docs/guides/running.md shows (the test trains exactly that)."""
    section = (REPO / "docs" / "guides" / "running.md").read_text()
    (block,) = re.findall(r"^```yaml\n(.*?)^```", section, flags=re.M | re.S)
    return block


@pytest.fixture(scope="module")
def hydra():
    with initialize(version_base="1.3", config_path=None):
        yield


def _job(*overrides: str) -> dict:
    return OmegaConf.to_container(compose("train", overrides=list(overrides)), resolve=False)


def _yaml_recipe_folder(tmp_path) -> str:
    """The guide's YAML recipe as conf/recipe/my_sgd_lm.yaml in `tmp_path`; returns the `hydra.searchpath=` for it."""
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "my_sgd_lm.yaml").write_text(readme_yaml_recipe())
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


# make test-slow: framework.ls in a fresh process (about 9 s, nearly all the catalog's import); the train CLI below
# reads the same folder in make test
@pytest.mark.slow
def test_a_yaml_recipe_in_a_folder_is_listed(tmp_path):
    listed = run_cli("recipe", "my_*", "-v", _yaml_recipe_folder(tmp_path), module="framework.ls", timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "my_sgd_lm" in listed.stdout and "char_lm trained with SGD" in listed.stdout


def test_a_yaml_recipe_in_a_folder_composes_and_trains(tmp_path):
    search = _yaml_recipe_folder(tmp_path)
    run_dir = tmp_path / "run"
    proc = run_cli("recipe=my_sgd_lm", "size=smoke", search, f"hydra.run.dir={run_dir}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 4 and results["choices"]["optimizer"] == "sgd"
    job = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    assert job.optimizer.lr == 0.05  # its own value
    assert job.scheduler.warmup_steps == 40 and job.data.max_bytes == 60000  # char_lm's value, char_lm's smoke size


@pytest.mark.slow  # two fresh processes (9 s each); make test runs a YAML recipe from a folder through the CLI (above)
def test_a_yaml_recipe_that_does_not_parse_is_named_with_its_line_in_one_error_line(tmp_path):
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    bad = tmp_path / "conf" / "recipe" / "broken.yaml"
    bad.write_text("# @package _global_\n# broken\noptimizer:\n  lr: [0.1\n")
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    for proc in (run_cli("recipe", search, module="framework.ls", timeout=120),
                 run_cli("recipe=broken", search, f"hydra.run.dir={tmp_path / 'run'}", timeout=120)):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert re.fullmatch(rf"error: {re.escape(str(bad))}:\d+: not valid YAML \(.*", lines[0]), lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", RECIPES.names())
def test_size_smoke_is_what_framework_smoke_adds_and_the_validation_schedule(hydra, name):
    smoke = _job(f"recipe={name}", "size=smoke")
    shorthand = _job(f"recipe={name}", *smoke_overrides([f"recipe={name}"]))
    assert smoke["trainer"]["max_steps"] == 4 and smoke["threads"] == 1
    shorthand["trainer"]["val_check_interval"] = smoke["trainer"]["val_check_interval"]  # FRAMEWORK_SMOKE keeps it
    assert smoke == shorthand
    assert smoke != _job(f"recipe={name}")


def test_size_gpu_gives_the_documented_gpu_runs(hydra):
    text = _job("recipe=mdlm_text", "size=gpu")
    assert text["trainer"]["accelerator"] == "gpu" and text["trainer"]["max_steps"] == 50000
    assert text["trainer"]["precision"] == "bf16-mixed"
    assert (text["model"]["dim"], text["model"]["depth"], text["module"]["ema_decay"]) == (512, 8, 0.9999)
    assert text["model"]["causal"] is False  # the recipe's own values stay where the preset says nothing
    kv = _job("recipe=mdlm_kv_recall", "size=gpu", "trainer.max_steps=30000")
    assert (kv["model"]["dim"], kv["data"]["n_train"], kv["trainer"]["max_steps"]) == (256, 200000, 30000)
    assert _job("recipe=char_lm", "size=cpu") == _job("recipe=char_lm")


def test_the_app_settings_come_from_conf_hydra(hydra):
    settings = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hydra" / "config.yaml"))
    cfg = compose("train", overrides=["recipe=char_lm"], return_hydra_config=True)
    hydra = OmegaConf.to_container(cfg.hydra, resolve=False)
    assert hydra["run"] == settings["run"] and hydra["sweep"] == settings["sweep"] and hydra["job"]["name"] == "train"
    assert hydra["help"]["app_name"] == "python -m framework.train"
    assert hydra["runtime"]["choices"]["hydra/job_logging"] == "framework"
    assert hydra["job_logging"]["handlers"]["file"]["filename"] == "${hydra.runtime.output_dir}/${hydra.job.name}.log"


def test_no_recipe_imports_another_or_splats_a_dict():
    for path in sorted(p for p in (REPO / "recipes").glob("*.py") if p.name != "__init__.py"):  # it lists them
        tree = ast.parse(path.read_text())
        imports = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert all(m == "framework.recipe" for m in imports), (path.name, imports)
        splats = [n for n in ast.walk(tree) if isinstance(n, ast.Starred)
                  or isinstance(n, ast.keyword) and n.arg is None or isinstance(n, ast.Dict) and None in n.keys]
        assert not splats, f"{path.name}: inherit with base=, not by splatting another recipe's values"


def test_olion_char_lm_is_char_lm_with_olion(hydra):
    assert set(RECIPES.get("olion_char_lm")) == {"defaults"}  # no values of its own: char_lm's
    char, olion = _job("recipe=char_lm"), _job("recipe=olion_char_lm")
    assert olion["optimizer"]["_target_"].endswith("OLion") and olion["optimizer"]["lr"] == 3e-3
    assert {k: v for k, v in olion.items() if k != "optimizer"} == {k: v for k, v in char.items() if k != "optimizer"}


def test_rlkv_probe_states_the_sizes_of_the_model_it_probes(hydra):
    base, probe = _job("recipe=pointer_chase_lm"), _job("recipe=rlkv_probe")
    assert probe["model"] == base["model"]
    assert {k: probe["data"][k] for k in ("n_pairs", "n_symbols")} == {k: base["data"][k] for k in ("n_pairs",
                                                                                                    "n_symbols")}
    assert base["module"]["prompt_length"] == 2 * base["data"]["n_pairs"] + 3
    smoke_base, smoke_probe = _job("recipe=pointer_chase_lm", "size=smoke"), _job("recipe=rlkv_probe", "size=smoke")
    assert smoke_probe["model"] == smoke_base["model"] and smoke_probe["module"]["pretrain_steps"] == 4


@pytest.mark.parametrize("module", ["duo_attention", "random"])
def test_framework_smoke_keeps_the_smoke_values_a_swapped_choice_takes(hydra, module):
    """`recipe=rlkv_probe module=duo_attention` at FRAMEWORK_SMOKE=1 is its size=smoke run: the probes share the
    pretraining values (not 2,500 steps of it); a swapped model that has no `dim` gets none of the model's values."""
    argv = ["recipe=rlkv_probe", f"module={module}"]
    shorthand = _job(*argv, *smoke_overrides(argv))
    smoke = _job(*argv, "size=smoke")
    shorthand["trainer"]["val_check_interval"] = smoke["trainer"]["val_check_interval"]  # FRAMEWORK_SMOKE keeps it
    assert shorthand == smoke and shorthand["module"]["pretrain_steps"] == 4
    hf = smoke_overrides(["recipe=rlkv_probe", "model=hf_causal_lm", "model.name_or_path=me/llama"])
    assert "module.pretrain_steps=4" in hf and not [a for a in hf if a.startswith("model.")]


def test_a_swapped_group_leaves_out_values_an_inherited_recipe_got_from_its_base(hydra):
    notes = fit_to_choices(["recipe=olion_char_lm", "scheduler=constant"])
    try:
        assert notes == ["scheduler=constant takes no warmup_steps: recipe olion_char_lm's scheduler.warmup_steps=40"
                         " is left out"]
        job = _job("recipe=olion_char_lm", "scheduler=constant")
        assert "warmup_steps" not in job["scheduler"] and job["optimizer"]["_target_"].endswith("OLion")
    finally:
        unfit("olion_char_lm")


def test_a_swapped_group_leaves_out_the_size_presets_values_it_does_not_take(hydra):
    """`recipe=char_lm model=hf_causal_lm size=smoke`: the smoke preset's model.dim/depth/heads were sized for the
    recipe's own model; they are left out with a note (Hydra refused `dim` for hf_causal_lm before), and the data's
    smoke values stay."""
    argv = ["recipe=char_lm", "model=hf_causal_lm", "size=smoke"]
    notes = fit_to_choices(argv)
    try:
        assert notes[-1] == ("model=hf_causal_lm takes no dim, depth, heads: size=smoke's model.dim=32, "
                             "model.depth=1, model.heads=2 are left out")
        job = _job(*argv)
        assert not {"dim", "depth", "heads"} & set(job["model"]) and job["model"]["_target_"].endswith("HFCausalLM")
        assert job["data"]["seq_len"] == 32 and job["trainer"]["max_steps"] == 4
    finally:
        unfit("char_lm")
    assert _job("recipe=char_lm", "size=smoke")["model"]["dim"] == 32  # put back for the rest of the process


@pytest.mark.slow  # a fresh process (~7 s); make test composes and trains a YAML recipe from a searchpath folder above
def test_a_yaml_recipe_in_the_apps_own_conf_folder_composes_by_name(tmp_path):
    """conf/recipe/NAME.yaml: the app's folder goes through Hydra's ConfigStore (`load_conf(store=True)`)."""
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "my_sgd_lm.yaml").write_text(readme_yaml_recipe())
    script = textwrap.dedent(f"""
        from hydra import compose, initialize
        from framework.recipe import RECIPES, load_conf
        from framework.app import register_app
        register_app()
        assert load_conf({str(tmp_path)!r}) == ["my_sgd_lm"]
        with initialize(version_base="1.3", config_path=None):
            cfg = compose("train", overrides=["recipe=my_sgd_lm", "size=smoke"])
        print(RECIPES.entry("my_sgd_lm").description, cfg.optimizer.lr, cfg.data.max_bytes, cfg.model.dim)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["char_lm", "trained", "with", "SGD", "0.05", "60000", "32"]


def test_a_misspelt_size_gets_the_did_you_mean_and_exit_2_like_any_group():
    from framework.cli import check_choices
    from framework.registry import UnknownNameError

    with pytest.raises(UnknownNameError, match=r"Unknown size 'smok'\. Did you mean 'smoke'\?.*cpu, gpu, smoke"):
        check_choices(["recipe=char_lm", "size=smok"])
    with pytest.raises(UnknownNameError, match="'tiny'"):
        check_choices(["-m", "recipe=char_lm", "size=smoke,tiny"])
    check_choices(["recipe=char_lm", "size=gpu"])  # every shipped size passes
