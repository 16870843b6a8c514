"""StopOnNonFinite keeps the last good checkpoint; GracefulInterrupt turns Ctrl-C into an exactly resumable stop."""

from __future__ import annotations

import re
import signal
import threading

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

from framework.callbacks.safety import GracefulInterrupt, NonFiniteLossError, StopOnNonFinite, StopRequested
from framework.checkpointing import AtomicCheckpointIO, load_checkpoint_file, named_tensors
from framework.data.resumable import train_loader


class Regression(L.LightningModule):
    """A linear model whose loss turns NaN at `nan_at`, is scaled by `scale_at[1]` at step `scale_at[0]`, and which
    sends itself SIGINT at `sigint_at` (global steps)."""

    def __init__(self, nan_at: int = -1, sigint_at: int = -1, scale_at: tuple[int, float] = (-1, 1.0),
                 optimizer: str = "sgd", lr: float = 0.05):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.nan_at, self.sigint_at, self.scale_at = nan_at, sigint_at, scale_at
        self.optimizer, self.lr = optimizer, lr
        self.requested_at: list[bool] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.global_step == self.sigint_at:
            # aimed at this (the main) thread: delivered and handled before pthread_kill returns, whatever the load
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            self.requested_at.append(any(getattr(cb, "requested", False) for cb in self.trainer.callbacks))
        if self.global_step == self.scale_at[0]:
            loss = loss * self.scale_at[1]
        return loss * float("nan") if self.global_step == self.nan_at else loss

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):  # 8 steps per epoch, shuffled per epoch, resumable mid-epoch
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return train_loader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, seed=0, trainer=self.trainer)


def _trainer(tmp_path, callbacks, max_steps=12, every=2) -> L.Trainer:
    ckpt = ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=every, save_last=True, save_top_k=-1,
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

    with pytest.raises(NonFiniteLossError, match=r"loss is inf at step 1 .*no checkpoint from before the loss "
                                                 r"diverged had been written"):
        _trainer(tmp_path, [StopOnNonFinite()]).fit(Inf())
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def _finite_everywhere(folder) -> dict[str, int]:
    """{file name: global step} of every checkpoint in `folder`, after checking every tensor in each is finite."""
    steps = {}
    for path in sorted(folder.glob("*.ckpt")):
        ckpt = load_checkpoint_file(path)
        bad = [n for n, t in named_tensors({"w": ckpt["state_dict"], "o": ckpt["optimizer_states"]})
               if not torch.isfinite(t).all()]
        assert bad == [], f"{path.name}: {bad}"
        steps[path.name] = ckpt["global_step"]
    return steps


def test_an_update_that_overflows_the_optimizer_state_stops_before_its_checkpoint_is_written(tmp_path):
    """The loss at step 6 is finite (1e30·mse) but Adam's second moment (0.001·g²) overflows to inf in that step's
    update: no checkpoint may hold it, and the message names a checkpoint from before the divergence that does
    resume and train finite with a lower lr."""
    torch.manual_seed(0)
    module = Regression(scale_at=(6, 1e30), optimizer="adam", lr=0.01)
    with pytest.raises(NonFiniteLossError) as err:
        _trainer(tmp_path, [StopOnNonFinite(resume_hint="python -m framework.train x=1")], every=1).fit(module)
    message = str(err.value)
    assert re.search(r"training loss is [0-9.e+]+ at step 7, but that step's optimizer update left NaN/inf in 2 of "
                     r"\d+ weight and optimizer-state tensors \(e\.g\. optimizer 0 exp_avg_sq of net\.", message)
    assert module.optimizers().state[module.net.weight]["exp_avg_sq"].isinf().any()  # it did overflow in memory
    steps = _finite_everywhere(tmp_path / "checkpoints")
    assert steps["last.ckpt"] == max(steps.values()) == 6  # the step-7 update was never written
    good = tmp_path / "checkpoints" / "step000005.ckpt"  # step 6's weights gave the diverged loss: not that one
    assert "the weights of steps 6, 7 had diverged" in message
    assert f"resume with a lower learning rate: python -m framework.train x=1 ckpt_path={good})" in message

    resumed = Regression(optimizer="adam", lr=0.001)
    _trainer(tmp_path / "resumed", [StopOnNonFinite()]).fit(resumed, ckpt_path=str(good))
    assert all(torch.isfinite(p).all() for p in resumed.parameters())
    assert _finite_everywhere(tmp_path / "resumed" / "checkpoints")["last.ckpt"] == 12


def test_ctrl_c_finishes_the_step_saves_and_resumes_exactly(tmp_path, capsys):
    torch.manual_seed(0)
    full = Regression()
    _trainer(tmp_path / "full", []).fit(full)

    torch.manual_seed(0)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN when started in the background
    guard = GracefulInterrupt(resume_hint="python -m framework.train recipe=x")
    stopped = _trainer(tmp_path / "cut", [guard])
    cut = Regression(sigint_at=5)
    with pytest.raises(StopRequested):  # the fit ends at once, with no extra validation or log row
        stopped.fit(cut)
    assert cut.requested_at == [True]  # the handler ran inside step 5, not at some later, load-dependent moment
    assert stopped.global_step == 6  # step 5 (0-based) finished, then the stop
    assert guard.results() == {"interrupted": 1.0}
    saved = load_checkpoint_file(guard.saved_path)
    reference = load_checkpoint_file(tmp_path / "full" / "checkpoints" / "step000006.ckpt")
    assert saved["global_step"] == 6  # the interrupted step's update is in the checkpoint
    assert all(torch.equal(saved["state_dict"][k], v) for k, v in reference["state_dict"].items())
    err = capsys.readouterr().err
    assert f"resume with: python -m framework.train recipe=x ckpt_path={guard.saved_path}" in err
    assert signal.getsignal(signal.SIGINT) is before  # the handler that was there before is restored

    torch.manual_seed(1)  # the resumed run must not depend on fresh initialisation
    resumed = Regression()
    _trainer(tmp_path / "resumed", []).fit(resumed, ckpt_path=guard.saved_path)
    for a, b in zip(full.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_nan_loss_read_at_a_later_check_names_its_own_step_and_no_later_checkpoint_is_written(tmp_path):
    """The guard reads the losses every 7 steps here: the NaN of step 6 is found at step 7's check, named as step 6,
    and the checkpoint of step 8 (they come every 4 steps) is never written."""
    torch.manual_seed(0)
    module = Regression(nan_at=5)
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 6 \(batch 5 of epoch 0\); training "
                                                 r"stopped at step 7 .*the last good checkpoint is .*last\.ckpt"):
        _trainer(tmp_path, [StopOnNonFinite(every_n_steps=7)], every=4).fit(module)
    assert _finite_everywhere(tmp_path / "checkpoints") == {"last.ckpt": 4, "step000004.ckpt": 4}
    assert not torch.isfinite(module.net.weight).all()


class _Reads(StopOnNonFinite):
    """Records (global step, losses read) at each check that reads, and the steps whose state it reads."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.losses, self.states = [], []

    def check(self, trainer, pl_module):
        if self._seen:
            self.losses.append((trainer.global_step, len(self._seen)))
        super().check(trainer, pl_module)

    def _state(self, trainer, pl_module):
        self.states.append(trainer.global_step)
        return super()._state(trainer, pl_module)


@pytest.mark.parametrize("every", [1, 4])
def test_the_guard_reads_on_the_host_only_every_n_steps_and_before_each_checkpoint(tmp_path, every):
    """Between its checks the guard keeps each step's loss on its device and reads nothing; each loss is read once,
    at the first check after it: every `every_n_steps` steps, before each save (steps 5 and 10), and at the end."""
    guard = _Reads(every_n_steps=every)
    _trainer(tmp_path, [guard], max_steps=12, every=5).fit(Regression())
    expected = [(s, 1) for s in range(1, 13)] if every == 1 else [(4, 4), (5, 1), (8, 3), (10, 2), (12, 2)]
    assert guard.losses == expected
    assert guard.states == [s for s, _ in expected]
    assert sum(n for _, n in guard.losses) == 12


def test_an_overflowed_optimizer_state_found_at_a_later_check_says_since_when_it_could_have_happened(tmp_path):
    """Adam's second moment overflows in step 7's update while the loss stays finite; read every 4 steps, the guard
    finds it at step 8 and says the update came after step 4, its last check."""
    torch.manual_seed(0)
    module = Regression(scale_at=(6, 1e30), optimizer="adam", lr=0.01)
    with pytest.raises(NonFiniteLossError) as err:
        _trainer(tmp_path, [StopOnNonFinite(every_n_steps=4)], every=100).fit(module)
    assert re.search(r"^training loss is [0-9.e+]+ at step 8, but an optimizer update after step 4 \(the last check\) "
                     r"left NaN/inf in 2 of \d+ weight and optimizer-state tensors \(e\.g\. optimizer 0 exp_avg_sq of "
                     r"net\.", str(err.value)), str(err.value)


class _SyncMode(L.Callback):
    """Sets CUDA's sync debug mode at each batch end: around the guard's, "error" makes any host sync raise."""

    def __init__(self, mode: str):
        self.mode = mode

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        torch.cuda.set_sync_debug_mode(self.mode)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a host sync is a GPU notion")
@pytest.mark.parametrize("every", [1, 50])
def test_between_its_checks_the_guard_makes_no_host_sync_on_cuda(tmp_path, every):
    """20 steps on a GPU with the guard's batch-end hook run in CUDA's sync-error mode: reading every step raises at
    the first sync; at every 50 steps nothing in those 20 steps syncs (the end-of-training check is outside)."""
    torch.manual_seed(0)
    trainer = L.Trainer(max_steps=20, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[_SyncMode("error"), StopOnNonFinite(every_n_steps=every), _SyncMode("default")])
    try:
        if every == 1:
            with pytest.raises(RuntimeError, match="synchroniz"):
                trainer.fit(Regression())
        else:
            trainer.fit(Regression())
            assert trainer.global_step == 20
    finally:
        torch.cuda.set_sync_debug_mode("default")
