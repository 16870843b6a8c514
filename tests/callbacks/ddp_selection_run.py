"""Run by test_data_agent_ddp.py: a 2-process (gloo) Lightning fit with DataSelection; each rank saves what it
saw. `python ddp_selection_run.py OUT_DIR SAMPLER [DEVICES]` (a registered sampler name; Lightning's DDP launcher
re-runs this file for rank 1). DEVICES (default 2) ranks of 32 / DEVICES samples per step: the same global batches
on one rank and on two."""

import sys
from pathlib import Path

import lightning as L
import torch

from framework.callbacks.selection import DataSelection
from framework.data.digits import ArrayDataset
from framework.data.resumable import SplitData
from framework.models.convnet import MLP
from framework.modules.classifier import Classifier
from framework.registry import SAMPLERS, load_catalog

torch.set_num_threads(1)


class Data(SplitData):
    num_classes, input_shape, batch_size, seed = 3, [6], 16, 0

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (170,), generator=g)
        x = torch.randn(170, 6, generator=g) + y[:, None].float()
        self.train_set, self.val_set = ArrayDataset(x, y), ArrayDataset(x[:16], y[:16])


class Record(L.Callback):
    def __init__(self, selection):
        self.selection, self.seen, self.tables, self.selections = selection, {}, [], {}

    def on_train_epoch_start(self, trainer, pl_module):
        self.selections[trainer.current_epoch] = self.selection.sampler.selection.clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.setdefault(trainer.current_epoch, []).extend(batch["index"].tolist())
        self.tables.append(self.selection.table.scores.clone())


def main(out: Path, policy_name: str, devices: int = 2) -> None:
    load_catalog()
    agent = {"update_every": 2} if policy_name in ("data_agent", "data_agent_staleness") else {}
    policy = SAMPLERS.build(policy_name, delta=0.67, **agent)  # the registered defaults (ρ = 0.5), shorter runs
    selection = DataSelection(policy, seed=0)
    record = Record(selection)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=devices, strategy="ddp", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=out,
                        use_distributed_sampler=True,  # the callback must switch it off
                        callbacks=[selection, record])
    torch.manual_seed(0)
    module = Classifier(MLP(input_shape=[6], num_classes=3, hidden=8), num_classes=3)
    data = Data()
    data.batch_size = 32 // devices
    trainer.fit(module, datamodule=data)
    agent = getattr(policy, "agent", None)
    torch.save({"seen": record.seen, "tables": record.tables, "selections": record.selections,
                "agent": None if agent is None else [p.detach().clone() for p in agent.actor.parameters()],
                "model": {k: v.clone() for k, v in module.state_dict().items()}, "cost": selection.cost()},
               out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2)
