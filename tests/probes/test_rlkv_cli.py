"""The probe through the real CLI: `recipe=rlkv_probe` on a pretraining run (`init_from=`), the allocation in the
run dir, and (slow) the toy recovery: the probe finds the heads that matter."""

from __future__ import annotations

import json

import pytest
import torch

from framework.data.pointer_chase import EOS, PAD, chase_rows, prompt_length
from framework.hub import load_weights_into
from framework.models.transformer import TransformerLM
from framework.probes.allocation import HeadAllocation
from framework.probes.base import accuracy_at
from framework.recipe import SMOKE

SMALL_TASK = ["data.n_pairs=4", "data.n_symbols=8", "module.prompt_length=11"]


# make test-slow (two CLI runs, ~20 s): make test keeps a probe's model weights untouched on an HF model by name
# (tests/hf/test_rlkv_hf.py), loads run checkpoints with init_from (tests/modules/test_mdlm_module.py,
# tests/test_rundir.py) and trains rlkv_probe (tests/test_fault_injection.py)
@pytest.mark.slow
def test_probe_loads_a_pretraining_run_with_init_from_and_leaves_its_weights_alone(cli, tmp_path):
    base = tmp_path / "base"
    proc = cli("recipe=pointer_chase_lm", *SMOKE["pointer_chase_lm"], f"hydra.run.dir={base}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = tmp_path / "probe"
    proc = cli("recipe=rlkv_probe", *SMOKE["rlkv_probe"], f"init_from={base}", f"hydra.run.dir={probe}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((probe / "results.json").read_text())
    assert results["global_step"] == 4 and "val/acc_s0.5" in results["metrics"]
    alloc = HeadAllocation.load(probe)
    assert alloc.method == "rlkv" and alloc.shape == (2, 2) and alloc.window == (1, 4)
    base_state = torch.load(base / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    probe_state = torch.load(probe / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(v, probe_state[k]) for k, v in base_state.items() if k.startswith("model."))
    assert "gates" in probe_state


@pytest.mark.slow
def test_toy_recovery_rlkv_keeps_the_full_cache_accuracy_at_half_sparsity_where_random_heads_fail(cli, tmp_path):
    """The toy recovery on a small chase (4 pairs of 8 symbols): pretrain, probe, compare with random heads."""
    base = tmp_path / "base"
    proc = cli("recipe=pointer_chase_lm", "threads=1", "trainer.max_steps=1500", *SMALL_TASK,
               "trainer.limit_val_batches=1", f"hydra.run.dir={base}", timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = tmp_path / "probe"
    proc = cli("recipe=rlkv_probe", "threads=1", "trainer.max_steps=150", *SMALL_TASK, f"init_from={base}",
               "trainer.limit_val_batches=1", f"hydra.run.dir={probe}", timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = json.loads((base / "model_config.json").read_text())
    model = load_weights_into(TransformerLM(**spec["config"]), base).eval()
    rows = chase_rows(500, torch.Generator().manual_seed(7), n_pairs=4, n_symbols=8)
    p = prompt_length(4)
    prompt, answer = rows[:, :p], rows[:, p:]
    full = accuracy_at(model, prompt, answer, None, (1, 4), EOS, PAD).mean()
    rlkv = accuracy_at(model, prompt, answer, HeadAllocation.load(probe).full_heads(0.5), (1, 4), EOS, PAD).mean()
    shape = (len(model.blocks), model.blocks[0].attn.kv_heads)
    random = torch.stack([
        accuracy_at(model, prompt, answer, HeadAllocation.from_gates(torch.rand(shape), 1, 4).full_heads(0.5),
                    (1, 4), EOS, PAD).mean() for _ in range(5)]).mean()
    assert full > 0.9
    assert rlkv >= full - 0.01
    assert random < full - 0.1
