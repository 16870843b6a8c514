"""The real CLI, as a user runs it: recipes, typos, --cfg job, --help, sweeps, DDP and exact resume."""

import contextlib
import json
import re

import pytest
import torch
from helpers import assert_resume_is_exact, run_cli

from framework.cli import check_choices
from framework.registry import UnknownNameError

# a few steps of a tiny model: proves the wiring, not the learning
TINY = [
    "threads=1",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.enable_progress_bar=false",
    "data.max_bytes=60000",
]
TINY_MODEL = ["model.dim=32", "model.depth=1", "model.heads=2", "data.seq_len=32", "data.batch_size=8"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["recipe=char_llm"], "Unknown recipe 'char_llm'. Did you mean 'char_lm'"),
        (["recipe=char_lm", "optimizer=adamww"], "Unknown optimizer 'adamww'. Did you mean 'adamw'?"),
        (["-m", "optimizer=adamw,sgdd"], "Unknown optimizer 'sgdd'. Did you mean 'sgd'?"),
        (["callbacks=[checkpoint,lr_monitr]"], "Unknown callback 'lr_monitr'. Did you mean 'lr_monitor'?"),
    ],
)
def test_unknown_choices_are_caught_before_hydra_with_did_you_mean(args, expected):
    with pytest.raises(UnknownNameError, match=re.escape(expected)):
        check_choices(args)


def test_unknown_choice_exits_2_with_one_error_line_and_no_traceback(cli):
    proc = cli("recipe=char_lm", "optimizer=adamww", timeout=120)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Unknown optimizer 'adamww'. Did you mean 'adamw'? Valid optimizer names: ")
    assert "Traceback" not in proc.stderr


def test_known_choices_and_plain_values_pass_the_check():
    check_choices(["recipe=char_lm", "optimizer=sgd", "optimizer.lr=0.1", "+callbacks=lr_monitor", "seed=3"])


def test_cfg_job_prints_the_composed_config_with_command_line_choice_winning(cli):
    proc = cli("optimizer=sgd", "recipe=char_lm", "optimizer.lr=0.05", "--cfg", "job", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "_target_: torch.optim.sgd.SGD" in proc.stdout
    assert "lr: 0.05" in proc.stdout
    assert "seq_len: 128" in proc.stdout  # the recipe's value


def test_help_lists_groups_and_their_choices_and_every_group_has_a_case_below():
    """One `--help` (it takes Hydra about 15 s to list the groups), read by both checks."""
    proc = run_cli("--help", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    help_text = proc.stdout
    for line in ("optimizer: adamw", "recipe: char_lm"):
        assert any(row.startswith(line) for row in help_text.splitlines()), help_text
    section = help_text.split("== Configuration groups ==")[1].split("== Config ==")[0]
    listed = {line.split(":")[0] for line in section.splitlines() if re.match(r"^\w+: ", line)}
    assert listed == set(VARIANTS), "add a (base, variant) case to VARIANTS for every group --help lists"


def test_multirun_sweeps_each_choice(cli, tmp_path):
    proc = cli(
        "-m",
        "recipe=char_lm",
        "optimizer=adamw,sgd",
        *TINY,
        *TINY_MODEL,
        "trainer.max_steps=2",
        "validate_before_fit=false",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = sorted(
        json.loads((tmp_path / str(i) / "results.json").read_text())["choices"]["optimizer"] for i in range(2)
    )
    assert got == ["adamw", "sgd"]


@pytest.mark.ddp
@pytest.mark.slow  # make test: the README's DDP line (test_readme_commands), and DDP runs of the guard, streamed text
def test_two_process_ddp_run_finishes_and_ranks_agree_on_the_final_loss(cli, tmp_path):  # and the Data Agent
    proc = cli(
        "recipe=char_lm",
        *TINY,
        *TINY_MODEL,
        "trainer.strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",  # 2 CPU processes (gloo), on a GPU machine too
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = json.loads((tmp_path / "results.json").read_text())["metrics"]
    rank1 = json.loads((tmp_path / "results.rank1.json").read_text())["metrics"]
    assert rank0["val/loss"] == rank1["val/loss"]
    # DDP averages gradients, so both ranks hold the same weights: the checkpoint is one model
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(cli, tmp_path):
    # a 1.8 kB corpus: ~6 batches per epoch, so the run crosses epoch boundaries and step 7 is mid-epoch
    common = ["recipe=char_lm", *TINY_MODEL, "threads=1", "trainer.enable_progress_bar=false",
              "data.max_bytes=1800", "trainer.max_steps=12", "trainer.val_check_interval=null",
              "trainer.check_val_every_n_epoch=1", "trainer.limit_val_batches=1", "scheduler.warmup_steps=3"]
    assert_resume_is_exact(cli, common, tmp_path, resume_step=7)


def test_progress_bar_on_request_is_rich_and_the_summary_says_where_things_are(cli, tmp_path):
    proc = cli("recipe=char_lm", *TINY, *TINY_MODEL, "trainer.enable_progress_bar=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "━" in proc.stdout  # rich's bar (rich is a dev dependency; without it Lightning's tqdm bar is used)
    assert f"results          {tmp_path}/results.json" in proc.stdout
    assert f"last checkpoint  {tmp_path}/checkpoints/last.ckpt" in proc.stdout


# -- every group `--help` lists changes what the run builds ---------------------------------------------------
# group -> (base overrides, the same plus one non-default choice of that group); a group without a case fails
VARIANTS = {
    "data": (["recipe=data_agent_digits"], ["recipe=data_agent_digits", "data=synth_classes"]),
    "model": (["recipe=data_agent_digits"], ["recipe=data_agent_digits", "model=convnet"]),
    "module": (["recipe=rlkv_probe"], ["recipe=rlkv_probe", "module=duo_attention"]),
    "optimizer": (["recipe=char_lm"], ["recipe=char_lm", "optimizer=sgd"]),
    "scheduler": (["recipe=char_lm"], ["recipe=char_lm", "scheduler=constant"]),
    "callbacks": (["recipe=char_lm"], ["recipe=char_lm", "+callbacks=lr_monitor"]),
    "loss": (["recipe=mdlm_baseline"], ["recipe=mdlm_baseline", "loss=mask_agnostic"]),
    "metric": (["recipe=gicdm_eval"], ["recipe=gicdm_eval", "metric=gicdm"]),
    "sampler": (["recipe=data_agent_digits"], ["recipe=data_agent_digits", "sampler=random"]),
    "peft": (["recipe=char_lm"], ["recipe=char_lm", "peft=lora"]),
    # a recipe's lr for an optimizer (`recipe(lrs=)`), chosen by ${recipe}__${optimizer}__${peft}; here by hand
    "lr": (["recipe=char_lm"], ["recipe=char_lm", "lr=sft__adamw__None"]),
    "recipe": (["recipe=char_lm"], ["recipe=olion_char_lm"]),
    "size": (["recipe=char_lm"], ["recipe=char_lm", "size=smoke"]),
}


@contextlib.contextmanager
def fitted_recipe(overrides: list[str]):
    """What `main()` does before composing (`fit_to_choices`), undone afterwards for the rest of this process."""
    from framework.recipe import fit_to_choices, unfit

    left_out = fit_to_choices(overrides)
    try:
        yield left_out
    finally:
        if left_out:
            unfit(next(a.split("=", 1)[1] for a in overrides if a.startswith("recipe=")))


class _Built(Exception):
    """Raised by `_Recorder` where the run would start: carries what `train()` handed to the Trainer."""


class _Recorder:
    """Stands in for the Trainer: keeps its callbacks, stops `train()` at its first validate or fit."""

    def __init__(self, **kwargs):
        self.callbacks = kwargs.get("callbacks") or []

    def validate(self, lm, datamodule=None, **kwargs):
        raise _Built(lm, datamodule, self.callbacks)

    fit = validate


def _built_by_train(overrides: list[str], run_dir) -> dict:
    """Compose `overrides` as the CLI does, run the real `train()` up to where training would start and describe
    what it built: data, the module's parts (metric, loss), parameters, optimizer, schedule, callbacks."""
    import functools
    import inspect

    from hydra.core.hydra_config import HydraConfig
    from hydra_zen import instantiate
    from omegaconf import DictConfig, OmegaConf

    from framework.compose import compose_job
    from framework.pipeline import train

    with fitted_recipe(overrides):
        cfg = compose_job([*overrides, f"hydra.run.dir={run_dir}"])
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    parts = {k: instantiate(v) if isinstance(v := job[k], DictConfig) else v
             for k in inspect.signature(train).parameters if k in job and k != "trainer"}
    try:
        with pytest.raises(_Built) as built:
            train(**parts, trainer=functools.partial(_Recorder))
    finally:
        HydraConfig.instance().cfg = None
    lm, data, callbacks = built.value.args
    opt = lm.configure_optimizers()
    optimizer, scheduler = (opt["optimizer"], opt["lr_scheduler"]["scheduler"]) if isinstance(opt, dict) \
        else (opt, None)
    return {
        "data": (type(data).__name__, sorted((k, repr(v)) for k, v in vars(data).items() if k[0] != "_"
                                             and isinstance(v, (int, float, str)))),
        "parts": sorted(type(m).__name__ for m in lm.modules()),
        "parameters": sorted((n, tuple(p.shape)) for n, p in lm.named_parameters()),
        "optimizer": (type(optimizer).__name__, repr(optimizer.defaults)),
        "scheduler": [f.__qualname__ for f in getattr(scheduler, "lr_lambdas", [])],
        "callbacks": sorted((type(c).__name__, type(getattr(c, "policy", None)).__name__) for c in callbacks),
    }


@pytest.mark.parametrize("group", sorted(VARIANTS))
def test_a_choice_in_every_group_changes_what_the_run_builds(group, tmp_path):
    base, variant = VARIANTS[group]
    a, b = _built_by_train(base, tmp_path / "a"), _built_by_train(variant, tmp_path / "b")
    assert a != b, f"{variant[-1]} composes but the run it builds is the same as without it"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_metric_reaches_the_module_that_evaluates_it(tmp_path):
    built = _built_by_train(["recipe=gicdm_eval", "metric=gicdm"], tmp_path)
    assert "GICDM" in built["parts"]


def test_the_chosen_metric_is_computed_with_its_settings_and_logged(cli, tmp_path):
    from framework.data.hubness import gaussian_pair
    from framework.metrics.functional import prdc

    proc = cli("recipe=gicdm_eval", "metric=gicdm", "metric.k=3", "threads=1", "trainer.max_steps=2",
               "trainer.enable_progress_bar=false", "data.n=120", "data.dims=[2]", "data.seeds=1", "data.digits=false",
               "data.ood_fractions=[0.0]", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = json.loads((tmp_path / "results.json").read_text())["metrics"]
    expected = prdc(*gaussian_pair(120, 2, 0), 3, "none")  # the metric's k=3, not the module's k=5
    for key in ("precision", "recall", "density", "coverage"):
        assert logged[f"gauss_d2/{key}_none"] == pytest.approx(expected[key], abs=1e-6), key
    assert expected != prdc(*gaussian_pair(120, 2, 0), 5, "none")  # so k=3 is what was evaluated


def test_a_metric_for_a_module_that_takes_none_is_refused_naming_the_modules_that_do(tmp_path):
    from framework.preflight import PreflightError, preflight

    with pytest.raises(PreflightError, match=re.escape("metric=gicdm: module 'causal_lm' takes no metric, so it "
                                                       "would be ignored; modules that evaluate one: metric_eval")):
        preflight(["recipe=char_lm", "metric=gicdm", f"hydra.run.dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


def test_a_loss_for_a_module_that_takes_none_exits_2_naming_the_modules_that_do(cli, tmp_path):
    proc = cli("loss=mask_agnostic", "module=causal_lm", f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: loss=mask_agnostic: module 'causal_lm' takes no loss term, so it would be ignored; modules that add "
        "one: mdlm")
    assert "extra_loss" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_the_console_has_no_third_party_notices_and_train_log_holds_the_runs_lines(cli, tmp_path):
    proc = cli("recipe=char_lm", *TINY, *TINY_MODEL, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert "litlogger" not in console and "LeafSpec" not in console
    assert "GPU available" in proc.stderr  # Lightning's own notices still show
    log = (tmp_path / "train.log").read_text()
    summary = [line for line in proc.stdout.splitlines() if line.strip()][-7:]
    assert summary[0].startswith("== char_lm finished: 4 steps")
    assert all(line in log for line in summary)
    assert "`Trainer.fit` stopped: `max_steps=4` reached." in log
    assert "litlogger" not in log


# -- framework.ls takes a kind or its Hydra group name ----------------------------------------------------------
@pytest.mark.parametrize("name", ["callbacks", "callback"])
def test_ls_accepts_the_group_name_as_well_as_the_kind(name, capsys):
    from framework.ls import main as ls_main
    from framework.registry import CALLBACKS

    assert ls_main([name]) == 0
    assert capsys.readouterr().out.strip() == f"callback: {' '.join(CALLBACKS.names())}"


@pytest.mark.parametrize("name", ["samplers", "models", "recipes"])
def test_ls_accepts_a_kind_in_the_plural(name, capsys):
    from framework.ls import main as ls_main
    from framework.registry import KINDS

    assert ls_main([name]) == 0
    registry = KINDS[name[:-1]]
    assert capsys.readouterr().out.strip() == f"{registry.kind}: {' '.join(registry.names())}"


def test_ls_refuses_an_unknown_kind_with_the_valid_kind_and_group_names(capsys):
    from framework.ls import main as ls_main

    assert ls_main(["calbacks"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Unknown kind 'calbacks'. Did you mean 'callbacks'")
    assert "Valid kind names: callback, callbacks, data, " in err


def test_a_swapped_group_keeps_the_recipe_values_it_takes_and_leaves_out_the_others(tmp_path):
    from framework.compose import compose_job

    args = ["recipe=char_lm", "scheduler=constant", "optimizer=sgd"]
    with fitted_recipe(args) as left_out:
        cfg = compose_job(args)
    assert left_out == ["scheduler=constant takes no warmup_steps: recipe char_lm's scheduler.warmup_steps=40 is "
                        "left out"]
    assert "warmup_steps" not in cfg.scheduler and cfg.optimizer.lr == 3e-3  # char_lm's lr carries over to sgd
    assert compose_job(["recipe=char_lm"]).scheduler.warmup_steps == 40  # only for that command
