"""A project shaped like lightning-hydra-template (tests/template_project: its own LitModule, DataModule with a
plain TensorDataset and tuple batches, Hydra `_target_` configs) takes the framework's OLion, DataSelection
(random, InfoBatch, Data Agent), NaN guard and HubPush by Hydra overrides plus 2 changed lines of its own module."""

import ast
import difflib
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from test_hub import hub_env

from framework.callbacks.selection import DataSelection
from framework.samplers import InfoBatchPolicy, RandomPolicy

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "tests" / "template_project"
POLICIES = ["framework.samplers.RandomPolicy", "framework.samplers.InfoBatchPolicy",
            "framework.samplers.DataAgentPolicy"]
FRAMEWORK = [  # every framework part, added by overrides only (the sweep runs one job per policy)
    "model.optimizer._target_=framework.optim.OLion", "model.optimizer.lr=0.003",
    "+callbacks.nan_guard._target_=framework.callbacks.safety.StopOnNonFinite",
    "+callbacks.selection._target_=framework.callbacks.selection.DataSelection",
    "+callbacks.selection.head=net.model.6",  # the Data Agent's logits and features: the net's last layer
    f"+callbacks.selection.policy._target_={','.join(POLICIES)}",
    # HubPush: the LitModule gets its net already built, so the push names the net and states its values
    "+callbacks.hub._target_=framework.callbacks.hub_push.HubPush", "+callbacks.hub.repo_id=local-user/template-net",
    "+callbacks.hub.info.model_attr=net",
    "+callbacks.hub.info.model_config={input_size:64,lin1_size:32,lin2_size:32,output_size:10}",
]


def train(*overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(PROJECT / "train.py"), *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def own_code(path: Path) -> list[str]:
    """The file's lines after its module docstring."""
    tree = ast.parse(path.read_text())
    return path.read_text().splitlines()[tree.body[0].end_lineno:]


def test_the_selection_ready_module_differs_from_the_plain_one_in_at_most_5_lines():
    diff = difflib.unified_diff(own_code(PROJECT / "plain_module.py"), own_code(PROJECT / "module.py"), n=0)
    changed = [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    removed = sum(line.startswith("-") for line in changed)
    assert 0 < max(removed, len(changed) - removed) <= 5, changed


@pytest.mark.slow  # a fresh process (~6 s); make test runs the same project with the framework's parts below
def test_the_plain_project_runs_as_it_was(tmp_path):
    plain = train("model._target_=plain_module.LitModule", f"hydra.run.dir={tmp_path / 'plain'}")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "selection/cost" not in json.loads((tmp_path / "plain" / "metrics.json").read_text())


@pytest.mark.slow  # a fresh process (13 s); make test runs the template project's module with the framework's sampler
def test_the_framework_parts_added_by_overrides_run(tmp_path, hub):  # in process (below)
    runs = train("-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *FRAMEWORK, env=hub_env(hub.url, tmp_path / "cache"))
    assert runs.returncode == 0, runs.stderr[-3000:]  # a multirun exits 0 only if every job did
    for job, policy in enumerate(POLICIES):
        metrics = json.loads((tmp_path / "sweep" / str(job) / "metrics.json").read_text())
        assert metrics["selection/cost"] < 1.0, (policy, metrics)  # pruned: fewer sample passes than full data
        assert metrics["selection/epoch_fraction"] == 1.0  # and annealed to full data in the last epoch
        assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    state = torch.load(tmp_path / "sweep" / "2" / "checkpoints" / "last.ckpt", weights_only=False)["callbacks"]
    table = state["DataSelection"]["table"]
    assert (table["scores"] != table["initial_score"]).float().mean() > 0.5  # the agent scored the samples
    assert "selection/action_mean" in json.loads((tmp_path / "sweep" / "2" / "metrics.json").read_text())
    pushed_net_rebuilds_from_its_card(tmp_path / "sweep" / "2" / "checkpoints" / "last.ckpt")


def pushed_net_rebuilds_from_its_card(last_ckpt: Path) -> None:
    """The last job's HubPush: config.json holds the net's values, and the card's huggingface_hub + safetensors
    snippet, run as printed with the project's class in scope, rebuilds the net the job trained."""
    from huggingface_hub import hf_hub_download

    from framework.hub import load_config

    config = load_config("local-user/template-net")
    assert (config["format"], config["name"]) == ("plain", "SimpleDenseNet")
    assert config["config"] == {"input_size": 64, "lin1_size": 32, "lin2_size": 32, "output_size": 10}
    readme = Path(hf_hub_download("local-user/template-net", "README.md")).read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    sys.path.insert(0, str(PROJECT))
    try:
        from net import SimpleDenseNet
    finally:
        sys.path.remove(str(PROJECT))
    scope = {"SimpleDenseNet": SimpleDenseNet}
    exec(snippet, scope)  # noqa: S102 - as a huggingface_hub + safetensors user runs it
    trained = {k.removeprefix("net."): v for k, v in torch.load(last_ckpt, weights_only=False)["state_dict"].items()
               if k.startswith("net.")}
    rebuilt = scope["model"].state_dict()
    assert rebuilt.keys() == trained.keys() and all(torch.equal(rebuilt[k], trained[k]) for k in trained)


def project(module: str = "module"):
    sys.path.insert(0, str(PROJECT))
    try:
        from datamodule import DigitsDataModule
        from net import SimpleDenseNet
        mod = __import__(module)
    finally:
        sys.path.remove(str(PROJECT))
    torch.manual_seed(0)
    model = mod.LitModule(SimpleDenseNet(), optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
    return model, DigitsDataModule(train_size=128, val_size=32)


def fit(tmp_path, model, data, selection, epochs):
    L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False, limit_val_batches=0,
              enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path,
              callbacks=[selection]).fit(model, datamodule=data)


def test_a_one_epoch_run_warns_before_training_that_nothing_will_be_pruned(tmp_path):
    selection = DataSelection(RandomPolicy())
    with pytest.warns(UserWarning, match=r"⌊0\.875·1⌋ = 0.*max_epochs .*>= 2"):
        fit(tmp_path, *project(), selection, epochs=1)
    assert selection.cost() == 1.0


def test_a_step_without_per_sample_losses_fails_at_once_saying_what_to_return(tmp_path):
    model, data = project("plain_module")  # training_step returns the mean loss only
    with pytest.raises(TypeError, match="InfoBatchPolicy needs the per-sample 'losses'.*per_sample_loss"):
        fit(tmp_path, model, data, DataSelection(InfoBatchPolicy()), epochs=4)
    assert model.trainer.global_step == 0  # before any optimizer step


def test_tuple_batches_train_on_the_samples_the_sampler_yielded_with_their_weights(tmp_path):
    model, data = project()
    selection = DataSelection(RandomPolicy(ratio=0.5), seed=3)
    seen = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            x = batch[0].flatten(1)
            index = selection._index
            assert torch.equal(x, data.data_train.tensors[0][index].flatten(1))  # the rows it says it gave
            assert torch.all(selection._weight == 2.0) == (trainer.current_epoch < 3)
            seen.append((trainer.current_epoch, index.tolist()))

    L.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_progress_bar=False, limit_val_batches=0,
              enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path,
              callbacks=[selection, Record()]).fit(model, datamodule=data)
    per_epoch = {e: sum(len(i) for f, i in seen if f == e) for e in range(4)}
    assert per_epoch == {0: 64, 1: 64, 2: 64, 3: 128}
    assert "training_step" not in vars(model)  # the module's own method again after the fit
