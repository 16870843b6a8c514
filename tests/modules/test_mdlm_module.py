"""The MDLM LightningModule and its recipe: exact resume, DDP, the extra-loss switch, init_from."""

import json

import lightning as L
import pytest
import torch
from helpers import assert_resume_is_exact

from framework.data.needle import NeedleData
from framework.hub import load_weights_into
from framework.losses.mask_agnostic import MaskAgnosticLoss
from framework.models.transformer import TransformerLM
from framework.modules.mdlm import MDLMModule

NEEDLE = [
    "recipe=mdlm_mask_agnostic", "threads=1", "trainer.enable_progress_bar=false", "data.n_train=160",
    "data.n_val=32", "data.batch_size=16", "model.dim=32", "model.depth=1", "model.heads=2",
    "module.extra_loss_after=5", "callbacks.mask_sweep.n_per_slot=4", "trainer.limit_val_batches=1",
    "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=1", "scheduler.warmup_steps=3",
]


def test_mdlm_run_resumed_mid_epoch_ends_with_the_same_weights(cli, tmp_path):
    # 160 rows / 16 = 10 batches per epoch: step 7 is mid-epoch and after the extra loss started (step 5)
    full = assert_resume_is_exact(cli, [*NEEDLE, "trainer.max_steps=14"], tmp_path, resume_step=7)
    sweep = json.loads((full / "mask_sweep.json").read_text())
    assert sweep["m"] == [0, 2, 4, 8, 16, 32, 48, 64] and len(sweep["acc_by_slot"]["64"]) == 8


@pytest.mark.ddp
@pytest.mark.slow  # make test runs two-process DDP through char_lm, the agents, the streamed text and FSDP2
def test_mdlm_recipe_runs_under_two_process_ddp(cli, tmp_path):
    proc = cli(*NEEDLE, "trainer.max_steps=6", "trainer.strategy=ddp", "trainer.devices=2",
               "trainer.accelerator=cpu",
               f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = json.loads((tmp_path / "results.json").read_text())["metrics"]
    r1 = json.loads((tmp_path / "results.rank1.json").read_text())["metrics"]
    assert r0["val/nelbo"] == r1["val/nelbo"]
    assert "train/extra_loss" in r0  # the mask-agnostic term ran (from step 5)


class _Recorder(L.Callback):
    def __init__(self):
        self.extra = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.extra.append("train/extra_loss" in trainer.callback_metrics)


def _module(extra_after=3):
    data = NeedleData(n_train=64, n_val=16, batch_size=8, seed=0)
    model = TransformerLM(vocab_size=data.vocab_size, dim=32, depth=1, heads=2, causal=False)
    loss = MaskAgnosticLoss(mask_id=data.mask_id, pad_id=data.pad_id, k1=2, k_max=8)
    module = MDLMModule(model, vocab_size=data.vocab_size, mask_id=data.mask_id, extra_loss=loss,
                        extra_loss_after=extra_after)
    return data, module


def test_extra_loss_switches_on_at_its_step():
    torch.manual_seed(0)
    data, module = _module(extra_after=3)
    rec = _Recorder()
    trainer = L.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=0, callbacks=[rec], use_distributed_sampler=False)
    trainer.fit(module, datamodule=data)
    assert rec.extra == [False, False, False, True, True]


def test_without_a_mask_id_the_vocabulary_grows_by_one_for_mask():
    module = MDLMModule(lambda vocab_size: TransformerLM(vocab_size, dim=16, depth=1, heads=2, causal=False),
                        vocab_size=256)
    assert module.mask_id == 256 and module.model.embed.num_embeddings == 257


def test_ema_tracks_the_weights_and_is_what_evaluation_uses():
    model = TransformerLM(vocab_size=10, dim=16, depth=1, heads=2, causal=False)
    module = MDLMModule(model, vocab_size=10, mask_id=9, ema_decay=0.5)
    assert module.eval_model is module.ema
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(1.0)
    before = [e.clone() for e in module.ema.parameters()]
    module.update_ema()
    for e, b, p in zip(module.ema.parameters(), before, module.model.parameters(), strict=True):
        assert torch.allclose(e, 0.5 * b + 0.5 * p)


def test_init_from_loads_a_run_checkpoint_and_refuses_another_architecture(tmp_path):
    data, module = _module()
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir()
    torch.save({"state_dict": {f"model.{k}": v for k, v in module.model.state_dict().items()}}, ckpt)
    fresh = TransformerLM(vocab_size=data.vocab_size, dim=32, depth=1, heads=2, causal=False)
    load_weights_into(fresh, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), module.model.state_dict().values(),
                                                strict=True))
    other = TransformerLM(vocab_size=data.vocab_size, dim=48, depth=1, heads=2, causal=False)
    with pytest.raises(ValueError, match="does not fit model"):
        load_weights_into(other, ckpt)
    with pytest.raises(FileNotFoundError, match="no checkpoints/last.ckpt"):
        load_weights_into(other, tmp_path / "checkpoints")


def test_unknown_reduction_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="reduction='mean' is invalid; valid: tokens"):
        MDLMModule(TransformerLM(vocab_size=10, dim=16, depth=1, heads=2, causal=False), vocab_size=10, mask_id=9,
                   reduction="mean")
