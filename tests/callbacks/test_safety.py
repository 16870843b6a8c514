"""StopOnNonFinite keeps the last good checkpoint; GracefulInterrupt turns Ctrl-C into an exactly resumable stop."""

from __future__ import annotations

import os
import signal

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

from framework.callbacks.safety import GracefulInterrupt, NonFiniteLossError, StopOnNonFinite
from framework.checkpointing import AtomicCheckpointIO, load_checkpoint_file
from framework.data.resumable import train_loader


class Regression(L.LightningModule):
    """A linear model whose loss turns NaN at `nan_at` and which sends itself SIGINT at `sigint_at` (global steps)."""

    def __init__(self, nan_at: int = -1, sigint_at: int = -1):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.nan_at, self.sigint_at = nan_at, sigint_at

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.global_step == self.sigint_at:
            os.kill(os.getpid(), signal.SIGINT)
        return loss * float("nan") if self.global_step == self.nan_at else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):  # 8 steps per epoch, shuffled per epoch, resumable mid-epoch
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return train_loader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, seed=0, trainer=self.trainer)


def _trainer(tmp_path, callbacks, max_steps=12) -> L.Trainer:
    ckpt = ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=2, save_last=True, save_top_k=-1,
                           filename="step{step:06d}", auto_insert_metric_name=False)
    return L.Trainer(max_steps=max_steps, callbacks=[*callbacks, ckpt], plugins=[AtomicCheckpointIO()], logger=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                     default_root_dir=tmp_path)


def test_nan_loss_stops_at_that_step_and_keeps_the_last_good_checkpoint(tmp_path):
    torch.manual_seed(0)
    module = Regression(nan_at=5)
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 6 .*the last good checkpoint is "
                                                 r".*last\.ckpt"):
        _trainer(tmp_path, [StopOnNonFinite()]).fit(module)
    last = load_checkpoint_file(tmp_path / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())
    assert not torch.isfinite(module.net.weight).all()  # the weights in memory did go bad


def test_inf_loss_before_any_checkpoint_says_none_was_written(tmp_path):
    class Inf(Regression):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) * float("inf")

    with pytest.raises(NonFiniteLossError, match=r"loss is inf at step 1 .*no checkpoint had been written yet"):
        _trainer(tmp_path, [StopOnNonFinite()]).fit(Inf())
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_ctrl_c_finishes_the_step_saves_and_resumes_exactly(tmp_path, capsys):
    torch.manual_seed(0)
    full = Regression()
    _trainer(tmp_path / "full", []).fit(full)

    torch.manual_seed(0)
    guard = GracefulInterrupt(resume_hint="python -m framework.train recipe=x")
    stopped = _trainer(tmp_path / "cut", [guard])
    stopped.fit(Regression(sigint_at=5))
    assert stopped.global_step == 6  # step 5 (0-based) finished, then the stop
    assert guard.results() == {"interrupted": 1.0}
    err = capsys.readouterr().err
    assert f"resume with: python -m framework.train recipe=x ckpt_path={guard.saved_path}" in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored

    torch.manual_seed(1)  # the resumed run must not depend on fresh initialisation
    resumed = Regression()
    _trainer(tmp_path / "resumed", []).fit(resumed, ckpt_path=guard.saved_path)
    for a, b in zip(full.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
