"""Growth of a module that keeps an EMA copy of its model (`module.ema_decay>0`, on by default at `mdlm_text size=gpu`):
the EMA is grown with the model (the same operation), a run resumed after growth ends on the same weights, and the
copies growth cannot reach are refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_resume_is_exact

from framework.cli import check_command_line
from framework.errors import PreflightError
from framework.grow.ops import grow
from framework.registry import MODELS

DECAY, AT = 0.9, 2
ARGS = ["recipe=mdlm_text", "size=smoke", "model=moe_transformer", f"module.ema_decay={DECAY}",
        "callbacks=[checkpoint,orthogonal_growth]", f"callbacks.orthogonal_growth.at_step={AT}",
        "callbacks.orthogonal_growth.depth_factor=2", "callbacks.orthogonal_growth.width_factor=2",
        "callbacks.orthogonal_growth.noise_alpha=0", "validate_before_fit=false",
        "callbacks.checkpoint.save_top_k=-1"]  # every step's checkpoint (the test reads the one before growth)


def state(path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")


def part(weights: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}


def test_growth_grows_the_ema_as_it_grows_the_model_and_a_run_resumed_after_growth_ends_on_the_same_weights(
        cli, tmp_path):
    full = assert_resume_is_exact(cli, ARGS, tmp_path, resume_step=AT + 1)  # resumed from the first grown checkpoint
    before, after = (state(full / "checkpoints" / f"step{s:06d}.ckpt") for s in (AT, AT + 1))
    # the EMA that step AT+1 updated: ema = decay·grown + (1 − decay)·weights, solved for what growth made of it
    weights, ema = part(after["state_dict"], "model."), part(after["state_dict"], "ema.")
    assert weights.keys() == ema.keys() and all(ema[k].shape == weights[k].shape for k in weights)
    model = MODELS.get("moe_transformer")(**before["orthogonal_growth"]["config"])  # the size before growth
    model.load_state_dict(part(before["state_dict"], "ema."))
    grow(model, depth_factor=2, width_factor=2, noise_alpha=0.0)  # the EMA before growth, grown as the model was
    expected = dict(model.named_parameters())
    assert len(expected) == len([k for k in ema if k in expected]) > 0
    for name, value in expected.items():
        grown = (ema[name] - (1 - DECAY) * weights[name]) / DECAY
        torch.testing.assert_close(grown, value.detach(), rtol=1e-5, atol=1e-6, msg=name)
    assert after["orthogonal_growth"]["copy_attrs"] == ["ema"]
    layers = [{k.split(".")[2] for k in w if k.startswith("ema.blocks.")} for w in (before["state_dict"],
                                                                                 after["state_dict"])]
    assert len(layers[1]) == 2 * len(layers[0])  # depth ×2 (and the experts ×2, in `expected`'s shapes)


@pytest.mark.parametrize(("extra", "refusal"), [
    (["callbacks.orthogonal_growth.copy_attrs=[]"],
     "MDLMModule.ema is a copy of the model that growth would leave at its old size; name it in copy_attrs"
     " (callbacks.orthogonal_growth.copy_attrs=[ema])"),
    (["trainer.callbacks=[{_target_:lightning.pytorch.callbacks.EMAWeightAveraging}]"],
     "OrthogonalGrowth cannot grow the averaged copy of the module that EMAWeightAveraging keeps"),
], ids=["the-ema-left-out-of-copy_attrs", "lightnings-weight-averaging-callback"])
def test_a_copy_of_the_model_that_growth_would_not_grow_is_refused_before_anything_is_written(extra, refusal,
                                                                                             tmp_path):
    with pytest.raises(PreflightError, match="callbacks.orthogonal_growth: ") as err:
        check_command_line([*ARGS, *extra, f"hydra.run.dir={tmp_path / 'run'}"])
    assert refusal in str(err.value) and not any(tmp_path.iterdir())
