"""RunRecord: the files a finished or interrupted run leaves in its run dir, written by the rank that should."""

import json
from types import SimpleNamespace

import torch
from torch import nn

from framework.callbacks.run_record import RunRecord, numbers, summary


def _trainer(rank: int = 0, world: int = 1) -> SimpleNamespace:
    ckpt = SimpleNamespace(last_model_path="/x/checkpoints/last.ckpt", best_model_path="")
    return SimpleNamespace(global_step=7, is_global_zero=rank == 0, global_rank=rank, world_size=world,
                           checkpoint_callback=ckpt, callback_metrics={"train/loss": torch.tensor(1.5)})


def _record(tmp_path) -> RunRecord:
    choices = {"recipe": "char_lm", "model": "mlp", "hydra/launcher": "basic"}
    return RunRecord(tmp_path, "python -m framework.train recipe=char_lm", "python -m framework.train recipe=char_lm",
                     choices)


def test_rank_zero_writes_results_and_model_config_and_prints_the_summary(tmp_path, capsys):
    model = nn.Linear(2, 2)
    model.init_config = {"hidden": 8}
    lm = SimpleNamespace(model=model, mask_id=5)
    results = _record(tmp_path).finish(_trainer(), lm, {"val/loss_init": 2.0}, {"val/loss": 1.0})
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == results
    assert results["choices"] == {"recipe": "char_lm", "model": "mlp"}  # Hydra's own choices left out
    assert results["global_step"] == 7 and results["last_checkpoint"] == "/x/checkpoints/last.ckpt"
    assert json.loads((tmp_path / "model_config.json").read_text()) == {"name": "mlp", "config": {"hidden": 8},
                                                                         "mask_id": 5}
    assert "val/loss                     1.0000   (untrained: 2.0000)" in capsys.readouterr().out


def test_other_ranks_write_only_their_own_results(tmp_path):
    lm = SimpleNamespace(model=nn.Linear(2, 2))
    _record(tmp_path).finish(_trainer(rank=1, world=2), lm, {}, {"val/loss": 1.0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.rank1.json"]


def test_an_interrupted_run_records_the_checkpoint_and_the_command_that_resumes_it(tmp_path):
    _record(tmp_path).interrupted(_trainer(), "/x/checkpoints/last.ckpt")
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["interrupted"] is True and record["metrics"] == {"train/loss": 1.5}
    assert record["resume"] == "python -m framework.train recipe=char_lm ckpt_path=/x/checkpoints/last.ckpt"


def test_numbers_are_plain_floats_with_non_finite_values_as_nan():
    out = numbers({"a": torch.tensor(2.0), "b": float("inf")}, prefix="test/")
    assert out["test/a"] == 2.0 and out["test/b"] != out["test/b"]


def test_the_summary_names_the_users_data_text_or_images():
    base = {"recipe": None, "global_step": 2, "seconds": 1.0, "metrics": {"val/acc": 0.5},
            "initial_metrics": {"val/acc_init": 0.1}, "run_dir": "r", "last_checkpoint": "r/last.ckpt"}
    text = summary({**base, "data": {"dataset": "my_corpus/", "tokens": 12345, "packing_efficiency": 0.99876}})
    assert "  data             my_corpus/: 12,345 tokens, packing efficiency 0.9988" in text.splitlines()
    images = {"dataset": "my_images/", "train_images": 1350, "val_images": 150, "classes": 10,
              "input_size": [3, 64, 64], "skipped": 2}
    lines = summary({**base, "data": images}).splitlines()
    assert "  data             my_images/: 1,350 training and 150 validation images, 10 classes at 64x64, 2 skipped" \
        in lines
    assert not any(line.startswith("  data") for line in summary({**base, "data": {}}).splitlines())
