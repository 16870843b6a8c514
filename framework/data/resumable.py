"""Deterministic, shardable, resumable sampling for map-style datasets under Lightning.

The order of an epoch depends only on (seed, epoch); each rank takes a disjoint, equal-length shard; a run
resumed from a mid-epoch checkpoint skips exactly the batches it already trained on, so it ends with the
same weights as an uninterrupted run. Lightning's own distributed sampler is not used
(`use_distributed_sampler=False`): the sampler shards itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class EpochSampler(Sampler[int]):
    """Shuffles by (seed, epoch), shards by rank, and can start an epoch part-way (`skip_batches`)."""

    def __init__(
        self, n: int, *, batch_size: int, seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1
    ):
        check_batches(n, batch_size, world_size)
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._skip = 0
        # equal shard lengths on every rank, whole batches only (drop_last semantics)
        self.per_rank = (n // world_size) // batch_size * batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_batches(self, batches: int) -> None:
        """Start the next iteration after `batches` batches (mid-epoch resume); applies once."""
        self._skip = max(0, min(batches, self.per_rank // self.batch_size))

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=g, device=g.device)
        else:
            order = torch.arange(self.n)
        shard = order[self.rank : self.per_rank * self.world_size : self.world_size]
        start, self._skip = self._skip * self.batch_size, 0
        return _blockwise(shard[start:])

    def __len__(self) -> int:
        return self.per_rank

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch}


def _blockwise(order: torch.Tensor, block: int = 1 << 13) -> Iterator[int]:
    """The indices of `order` as Python ints, a block at a time: an epoch of millions of rows never becomes one
    Python list (8 bytes a row in the tensor, not about 36 in a list)."""
    for lo in range(0, len(order), block):
        yield from order[lo:lo + block].tolist()


class ResumableLoader(DataLoader):
    """A DataLoader that Lightning treats as resumable; the skip itself is set by `resume_skip()`."""

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and getattr(self.sampler, "seed", None) not in (None, state.get("seed")):
            raise ValueError(
                f"checkpoint was written with data seed {state.get('seed')}, this run uses {self.sampler.seed}; "
                "resume with the same seed"
            )


def train_loader(dataset: Dataset, batch_size: int, seed: int, trainer: Any = None, **kw: Any) -> ResumableLoader:
    """Build the training loader for `trainer` (rank, world size, and how far a resumed run already got)."""
    rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
    sampler = EpochSampler(len(dataset), batch_size=batch_size, seed=seed, rank=rank, world_size=world)
    if trainer is not None and trainer.global_step > 0:
        # the epoch now, not at the next set_epoch: a loader with workers draws its first indices as soon as it is
        # iterated, which a resumed fit does before it sets the sampler's epoch
        sampler.set_epoch(trainer.current_epoch)
        batches_per_epoch = len(sampler) // batch_size
        done = trainer.global_step * trainer.accumulate_grad_batches - trainer.current_epoch * batches_per_epoch
        if 0 < done < batches_per_epoch:
            sampler.skip_batches(done)
    return ResumableLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, **kw)


def check_batches(n: int, batch_size: int, world_size: int = 1) -> None:
    """A training set of `n` samples gives every rank at least one whole batch; ValueError naming the sizes."""
    if n < world_size * batch_size:
        raise ValueError(f"dataset of {n} samples is too short for {world_size} rank(s) × batch_size {batch_size}")


def check_split_sizes(**sizes: int) -> None:
    """Refuse empty splits and batches by name: `check_split_sizes(n_train=0, ...)` → "n_train=0 must be >= 1"."""
    bad = [f"{key}={value!r}" for key, value in sizes.items() if not isinstance(value, int) or value < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)} must be >= 1 (a split or batch cannot be empty)")


class SplitData(L.LightningDataModule):
    """A DataModule with `train_set` / `val_set`: resumable, self-sharding training loader; the validation
    split doubles as the test split. Subclasses set `batch_size`, `seed`, `num_workers` and build the sets."""

    train_set: Dataset | None = None
    val_set: Dataset | None = None
    batch_size: int
    seed: int
    num_workers: int = 0

    def train_dataloader(self) -> DataLoader:
        return train_loader(self.train_set, self.batch_size, self.seed, self.trainer, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
