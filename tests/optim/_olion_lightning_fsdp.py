"""Run by tests/optim/test_olion_fsdp.py: OLion under Lightning's ModelParallelStrategy (FSDP2) on 2 CPU processes.

Lightning's launcher starts the second process by running this file again. Rank 0 writes the largest difference
between the sharded run's final weights and one unsharded process on the same global batches to argv[1].
"""

from __future__ import annotations

import json
import sys

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from framework.optim import OLion

STEPS, BATCH = 3, 8  # per-rank batch; the global batch is 2 x BATCH


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 33), nn.Tanh(), nn.Linear(33, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def make_opt(named, distributed: str = "round_robin") -> OLion:
    return OLion(named, lr=1e-2, ns_dtype=torch.float32, distributed=distributed)


class Sharded(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # every step's global batch

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for module in self.net:
            if isinstance(module, nn.Linear):
                fully_shard(module, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, _):
        x, y = batch
        self.seen.append((self.all_gather(x).flatten(0, 1), self.all_gather(y).flatten(0, 1)))
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> OLion:
        return make_opt(self.net.named_parameters())


def data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(2 * BATCH * STEPS, 8, generator=g),
                                          torch.randn(2 * BATCH * STEPS, 4, generator=g))


def main(out: str) -> None:
    torch.set_num_threads(1)
    trainer = L.Trainer(accelerator="cpu", devices=2, max_steps=STEPS, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1))
    module = Sharded()
    trainer.fit(module, torch.utils.data.DataLoader(data(), batch_size=BATCH))
    sharded = {n: p.full_tensor().detach() for n, p in module.net.named_parameters()}
    if trainer.global_rank != 0:
        return
    net = make_net()
    opt = make_opt(net.named_parameters(), "redundant")  # a local model while torch.distributed is up
    for x, y in module.seen:  # equal halves: the mean over the global batch is the mean of the ranks' means
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()
    diffs = {n: (sharded[n] - p.detach()).abs().max().item() for n, p in net.named_parameters()}
    kinds = sorted({type(p).__name__ for p in module.net.parameters()})
    with open(out, "w") as fh:
        json.dump({"max_abs_diff": diffs, "param_types": kinds}, fh)


if __name__ == "__main__":
    main(sys.argv[1])
