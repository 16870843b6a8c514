"""DataSelection leaves the user's objects as they were (issue 34): the module's and the data module's methods are
their own during and after a fit, also after a fit that raised; the loader it serves keeps every setting of the
user's DataLoader (workers, their persistence, prefetch, generator, multiprocessing context, ...)."""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from framework.callbacks.selection import DataSelection
from framework.samplers import DataAgentPolicy, SelectionSampler
from framework.samplers.selection import KEPT_SETTINGS

torch.set_num_threads(1)


class Net(L.LightningModule):
    """A module that returns only the loss and the per-sample losses: the Data Agent reads logits and features from
    the head `net.2` (a forward hook during the step)."""

    def __init__(self, fail_at: int | None = None, loader: dict | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        self.fail_at, self.loader = fail_at, loader or {}
        self.pids: dict[int, set[int]] = {}

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at:
            raise RuntimeError("the user's step failed")
        x, y = batch[0], batch[1]
        if len(batch) > 2:  # the worker that collated this batch
            self.pids.setdefault(self.current_epoch, set()).update(batch[2].tolist())
        losses = torch.nn.functional.cross_entropy(self.net(x), y, reduction="none")
        return {"loss": losses.mean(), "per_sample_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g))
        return DataLoader(data, batch_size=16, **self.loader)


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return Net().train_dataloader()


class Watch(L.Callback):
    """Checks, while the fit runs, that nothing of the module or data module was replaced or hooked."""

    def __init__(self):
        self.checked = 0
        self.loaders: list[DataLoader] = []

    def _check(self, trainer, module):
        untouched(module, trainer.datamodule)
        assert all(not m._forward_hooks for m in module.modules())  # the head's hook lives inside the step only
        self.checked += 1

    def on_train_epoch_start(self, trainer, module):
        self.loaders.append(trainer.train_dataloader)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._check(trainer, module)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._check(trainer, module)


def untouched(module, datamodule=None) -> None:
    for obj in (module, datamodule):
        if obj is not None:
            assert not {"training_step", "train_dataloader", "forward"} & set(vars(obj)), sorted(vars(obj))
            assert obj.train_dataloader.__func__ is type(obj).train_dataloader
    assert module.training_step.__func__ is Net.training_step


def fit(module, datamodule=None, watch=None, epochs=2):
    selection = DataSelection(DataAgentPolicy(ratio=0.5, delta=0.5, update_every=2), seed=0, head="net.2")
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                        callbacks=[selection, *([watch] if watch else [])])
    return trainer, selection, trainer.fit_loop._data_source


@pytest.mark.parametrize("with_datamodule", [False, True], ids=["module", "datamodule"])
def test_the_users_module_and_data_module_keep_their_own_methods_during_and_after_the_fit(with_datamodule):
    module, data, watch = Net(), Data() if with_datamodule else None, Watch()
    trainer, selection, _ = fit(module, watch=watch)
    trainer.fit(module, datamodule=data)
    assert watch.checked == 2 * (3 + 6)  # every step of a pruned epoch (48 samples) and a full one
    assert bool((selection.table.last_seen == 1).all())  # the agent scored through the head's hook
    untouched(module, data)
    assert all(not m._forward_hooks for m in module.modules())
    assert "training_step" not in vars(trainer.strategy)
    assert type(trainer.fit_loop._data_source).__name__ == "_DataLoaderSource"


def test_a_fit_that_raises_puts_back_the_trainers_data_source_and_step():
    module = Net(fail_at=4)
    trainer, _, source = fit(module)
    with pytest.raises(RuntimeError, match="the user's step failed"):
        trainer.fit(module)
    untouched(module)
    assert all(not m._forward_hooks for m in module.modules())  # the failing step's hook came off with it
    assert trainer.fit_loop._data_source is source and "training_step" not in vars(trainer.strategy)


def _init_worker(worker_id: int) -> None:
    torch.set_num_threads(1)


def _collate_with_pid(rows):
    x, y = torch.utils.data.default_collate(rows)
    return x, y, torch.full((len(rows),), os.getpid())


def test_the_loader_keeps_every_setting_of_the_users_dataloader():
    generator = torch.Generator().manual_seed(7)
    settings = dict(num_workers=1, persistent_workers=True, prefetch_factor=3, generator=generator,
                    multiprocessing_context="fork", timeout=60, worker_init_fn=_init_worker,
                    collate_fn=_collate_with_pid, in_order=False)
    module, watch = Net(loader=settings), Watch()
    user = module.train_dataloader()
    trainer, _, _ = fit(module, watch=watch, epochs=3)
    trainer.fit(module)
    assert len({id(loader) for loader in watch.loaders}) == 1  # one loader for the fit; its sampler selects
    loader = watch.loaders[0]
    assert isinstance(loader.sampler, SelectionSampler) and loader.batch_size == 16 and loader.drop_last is False
    for name in KEPT_SETTINGS:
        mine, theirs = getattr(loader, name), getattr(user, name)
        assert mine is theirs or mine == theirs, name
    assert loader.generator is generator and loader.multiprocessing_context is user.multiprocessing_context
    assert {"num_workers", "persistent_workers", "prefetch_factor", "generator", "multiprocessing_context",
            "timeout", "worker_init_fn", "collate_fn", "pin_memory", "pin_memory_device", "in_order"} <= set(
        KEPT_SETTINGS)
    # every epoch's batches were collated by the user's function in the user's one worker, which persisted: the same
    # process through the pruned epochs and the full one (a loader rebuilt per epoch starts a new worker each time)
    assert sorted(module.pids) == [0, 1, 2]
    workers = set().union(*module.pids.values())
    assert len(workers) == 1 and os.getpid() not in workers
