"""The selection recipes through the real CLI: a Hydra sweep over samplers reports each one's actual cost."""

import json

import pytest
import torch
from helpers import assert_resume_is_exact
from test_fault_injection import KILL, _assert_same, _finish, _start, _state

from framework.recipe import SMOKE


def test_sampler_sweep_runs_each_policy_and_reports_the_cost_it_spent(cli, tmp_path):
    proc = cli("-m", "recipe=selection_compare", "sampler=full,data_agent", *SMOKE["selection_compare"],
               "validate_before_fit=false", "test=false", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads((tmp_path / str(i) / "results.json").read_text()) for i in range(2)]
    by_sampler = {r["choices"]["sampler"]: r for r in runs}
    assert set(by_sampler) == {"full", "data_agent"}
    assert all(r["global_step"] == 4 for r in runs)
    # four steps into the first epoch: full data has spent full cost, the agent's half-data epoch half of it
    assert by_sampler["full"]["metrics"]["selection/cost"] == 1.0
    assert by_sampler["data_agent"]["metrics"]["selection/cost"] == 0.5
    assert 0 < by_sampler["data_agent"]["metrics"]["selection/action_mean"] < 1


@pytest.mark.slow
def test_cli_run_resumed_mid_epoch_ends_bitwise_equal_including_the_agent(cli, tmp_path):
    # digits at batch 128: pruned epochs of 5 batches, then a full one of 10; step 7 is inside epoch 1
    args = ["recipe=data_agent_digits", "threads=1", "trainer.enable_progress_bar=false", "model.hidden=32",
            "data.batch_size=128", "trainer.max_epochs=3", "validate_before_fit=false", "test=false"]
    full = assert_resume_is_exact(cli, args, tmp_path, resume_step=7)
    states = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]["DataSelection"]
              for d in (full, tmp_path / "resumed")]
    a, b = (s["policy"]["agent"] for s in states)
    assert all(torch.equal(a[net][k], b[net][k]) for net in ("actor", "critic") for k in a[net])
    assert torch.equal(states[0]["table"]["scores"], states[1]["table"]["scores"])


@pytest.mark.parametrize(("sampler", "kill"), [pytest.param("data_agent", 7, marks=pytest.mark.slow),
                                               pytest.param("data_agent_staleness", 7, marks=pytest.mark.slow),
                                               ("data_agent_amortised", 3)])
def test_a_sigkilled_agent_run_resumes_bitwise_equal_through_a_selection_made_after_training(tmp_path, sampler, kill):
    # digits at batch 128: pruned epochs 0 and 1 of 5 batches (epoch 1's selection comes from the agent's scores,
    # and for the variant from its staleness bonus), then a full epoch of 10; killed at step 7, inside epoch 1 (the
    # amortised agent at step 3, inside epoch 0, whose end scores and learns: its checkpoint holds that epoch so far)
    args = ["recipe=data_agent_digits", f"sampler={sampler}", "threads=1", "trainer.enable_progress_bar=false",
            "model.hidden=32", "data.batch_size=128", "trainer.max_epochs=3", "trainer.max_steps=-1",
            "validate_before_fit=false", "test=false", "callbacks.checkpoint.every_n_train_steps=1"]
    full, cut, resumed = tmp_path / "full", tmp_path / "cut", tmp_path / "resumed"
    ref, killed = _start([*args, f"hydra.run.dir={full}"]), _start([*args, *KILL, f"+callbacks.kill.step={kill}",
                                                                     f"hydra.run.dir={cut}"])
    (code, err), (kcode, kerr) = _finish(ref), _finish(killed)
    assert code == 0, err[-3000:]
    assert kcode == -9, f"the killed run was not killed by SIGKILL (exit {kcode}):\n{kerr[-3000:]}"
    if sampler == "data_agent_amortised":  # 24 bytes per sample trained so far, features of the update's 256 only
        policy = _state(cut / "checkpoints" / "last.ckpt")["callbacks"]["DataSelection"]["policy"]
        assert sum(t.nbytes for r in policy["records"] for t in r.values()) == kill * 128 * 24
        assert policy["subsample"]["features"].shape == (256, 32)  # 256 of the 384 samples' 32-d (model.hidden)
    code, err = _finish(_start([*args, f"ckpt_path={cut / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={resumed}"]))
    assert code == 0, err[-3000:]
    a, b = _state(full / "checkpoints" / "last.ckpt"), _state(resumed / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 20
    _assert_same(a, b)  # weights, optimizer and callback states: the agent, its RNG, the table, the selection
