"""The NaN/inf guard from the command line: `guard.every_n_steps` sets how often it reads the loss on the host (and
it reads before every checkpoint save, so none holds NaN/inf), `guard=null` turns it off, and under DDP a NaN on one
rank stops every rank, naming the first step."""

from __future__ import annotations

import re

import pytest
import torch
from test_fault_injection import _finish, _start

from framework.checkpointing import checkpoint_non_finite
from framework.recipe import SMOKE

#: char_lm at lr 1e6: its loss turns NaN within the first 4 steps; checkpoints every 4 steps, no validation
DIVERGING = ["recipe=char_lm", *SMOKE["char_lm"], "trainer.max_steps=12", "optimizer.lr=1e6",
             "trainer.val_check_interval=null", "trainer.limit_val_batches=0", "validate_before_fit=false",
             "callbacks.checkpoint.every_n_train_steps=4"]


def _error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_guard_settings_reach_the_run_a_late_read_names_the_nan_step_and_guard_null_turns_it_off(tmp_path):
    late, off = tmp_path / "late", tmp_path / "off"
    procs = [_start([*DIVERGING, "guard.every_n_steps=8", f"hydra.run.dir={late}"]),
             _start([*DIVERGING, "guard=null", f"hydra.run.dir={off}"])]
    (code, err), (off_code, off_err) = [_finish(p) for p in procs]

    assert code == 1, err[-3000:]
    line = _error(err)
    found = re.match(r"error: training loss is nan at step (\d+) \(batch \d+ of epoch 0\); training stopped at step 4 "
                     r"\(the guard reads the loss every 8 steps and before each validation and checkpoint\)", line)
    assert found and int(found.group(1)) < 4, line  # found by the check before step 4's save, not at step 8
    assert "start again with a lower learning rate" in line
    assert not list((late / "checkpoints").glob("*.ckpt"))  # step 4's weights were never saved

    assert off_code == 1, off_err[-3000:]  # no guard: the run trains on with NaN weights until a save refuses them
    assert re.match(r"error: refusing to write checkpoint \S+/step000004\.ckpt: \d+ of its \d+ weight and "
                    r"optimizer-state tensors hold NaN/inf", _error(off_err)), off_err[-3000:]
    assert not list((off / "checkpoints").glob("*.ckpt"))


@pytest.mark.slow  # 12 s of two processes; make test stops one process on a NaN through the CLI (above)
@pytest.mark.ddp
def test_a_nan_on_one_ddp_rank_stops_both_ranks_naming_the_first_step(tmp_path):
    """Rank 1's weights turn NaN as step 4 begins (its loss of step 5 is NaN; rank 0's is NaN from step 6, through
    the averaged gradients): both ranks stop at the check before step 6's save, rank 0 names step 5, and every
    checkpoint on disk is finite."""
    poison = ["+callbacks.poison._target_=support.faults.PoisonAtStep", "+callbacks.poison.step=4",
              "+callbacks.poison.rank=1"]
    proc = _start(["recipe=char_lm", *SMOKE["char_lm"], "trainer.strategy=ddp", "trainer.devices=2",
                   "trainer.accelerator=cpu", "trainer.max_steps=8", "trainer.val_check_interval=null",
                   "trainer.limit_val_batches=0", "validate_before_fit=false",
                   "callbacks.checkpoint.every_n_train_steps=2", *poison, f"hydra.run.dir={tmp_path}"])
    code, err = _finish(proc, timeout=300)
    assert code == 1, err[-3000:]
    line = _error(err)
    assert line.startswith("error: training loss or weights became NaN/inf on another rank at step 5; training "
                           "stopped at step 6 "), line
    assert f"the last good checkpoint is {tmp_path}/checkpoints/last.ckpt" in line
    steps = {}
    for path in (tmp_path / "checkpoints").glob("*.ckpt"):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        assert checkpoint_non_finite(ckpt)[0] == [], path.name
        steps[path.name] = ckpt["global_step"]
    assert steps == {"last.ckpt": 4, "step000002.ckpt": 2, "step000004.ckpt": 4}
