"""A sampler for dynamic data selection that is correct under Lightning and DDP.

The epoch's selection is a deterministic function of (seed, epoch, score table): computed once per epoch
(on `set_epoch`), cached, shuffled, padded with leading duplicates to a multiple of the world size, and
strided so every rank gets a disjoint shard of equal length (equal batch counts: no collective can hang).
`state_dict` holds the cached selection, so a run resumed mid-epoch replays the same remaining batches even
though the score table has moved on since the selection was made.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from framework.samplers.policies import FullPolicy, SelectionPolicy, pruned_epochs
from framework.samplers.table import ScoreTable


class SelectionSampler(Sampler[int]):
    """Yields this rank's share of the samples `policy` selects for the current epoch.

    `num_epochs` fixes the annealing point ⌊δE⌋ after which every sample trains with weight 1.
    `weights` (a length-N tensor) is the loss weight of each sample in the current epoch.
    """

    def __init__(
        self,
        table: ScoreTable,
        policy: SelectionPolicy | None = None,
        num_epochs: int = 1,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
        if num_epochs < 1:
            raise ValueError(f"num_epochs={num_epochs} must be >= 1 (it fixes the annealing epoch)")
        if table.n < world_size:
            raise ValueError(f"{table.n} samples cannot be shared by {world_size} ranks")
        self.table, self.policy = table, policy or FullPolicy()
        self.num_epochs, self.seed, self.rank, self.world_size = int(num_epochs), int(seed), rank, world_size
        self.shuffle = shuffle
        self.epoch = -1
        self.selection = torch.empty(0, dtype=torch.long)  # the padded, shuffled global order of this epoch
        self.weights = torch.ones(table.n)
        self.pruning = False
        self._skip = 0

    # -- the epoch's selection ---------------------------------------------------------------------------
    def generator(self, epoch: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select for `epoch` (once: repeated calls for the same epoch keep the cached selection)."""
        if epoch == self.epoch:
            return
        n = self.table.n
        g = self.generator(epoch)
        self.pruning = self.policy.prunes(epoch, self.num_epochs)
        if self.pruning:
            index, w = self.policy.select(self.table, epoch, g)
            index, w = index.long(), w.float()
        else:
            index, w = torch.arange(n), torch.ones(n)
        if self.shuffle:
            perm = torch.randperm(index.numel(), generator=g, device=g.device)
            index, w = index[perm], w[perm]
        self.weights = torch.ones(n)
        self.weights[index] = w
        pad = -index.numel() % self.world_size
        self.selection = torch.cat([index, index[:pad]]) if pad else index
        self.epoch, self._skip = epoch, 0

    def skip_samples(self, count: int) -> None:
        """Start the next iteration `count` samples into this rank's shard (mid-epoch resume); applies once."""
        self._skip = max(0, min(int(count), len(self)))

    # -- Sampler -----------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        if self.epoch < 0:
            self.set_epoch(0)
        shard = self.selection[self.rank :: self.world_size]
        start, self._skip = self._skip, 0
        return iter(shard[start:].tolist())

    def __len__(self) -> int:
        if self.epoch < 0:
            self.set_epoch(0)
        return self.selection.numel() // self.world_size

    @property
    def kept(self) -> int:
        """Distinct samples selected this epoch (before padding)."""
        return int(torch.unique(self.selection).numel())

    def batch_indices(self, batch: int, batch_size: int) -> Tensor:
        """The samples of this rank's `batch`-th batch of the epoch, in the order `__iter__` yields them."""
        return self.selection[self.rank :: self.world_size][batch * batch_size : (batch + 1) * batch_size]

    def batch_weights(self, index: Tensor) -> Tensor:
        """Loss weights of the samples `index` in the current epoch."""
        return self.weights[index.long().cpu()]

    # -- state ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "epoch": self.epoch, "num_epochs": self.num_epochs, "pruning": self.pruning,
            "selection": self.selection.clone(), "weights": self.weights.clone(), "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint was written with selection seed {state['seed']}, this run uses "
                             f"{self.seed}; resume with the same seed")
        if int(state["world_size"]) != self.world_size:
            raise ValueError(f"checkpoint was written by {state['world_size']} rank(s), this run has "
                             f"{self.world_size}; the cached selection is sharded for the former")
        self.epoch, self.num_epochs = int(state["epoch"]), int(state["num_epochs"])
        self.pruning = bool(state["pruning"])
        self.selection, self.weights = state["selection"].clone(), state["weights"].clone()


def epoch_sizes(policy: SelectionPolicy, n: int, num_epochs: int) -> list[int]:
    """Samples each epoch trains on (an upper bound for policies with a random kept count)."""
    return [policy.planned_count(n) if policy.prunes(e, num_epochs) else n for e in range(num_epochs)]


def planned_batches(
    policy: SelectionPolicy, n: int, num_epochs: int, batch_size: int, world_size: int = 1
) -> list[int]:
    """Per-rank batches in each epoch: Σ_e ⌈⌈n_e / R⌉ / B⌉ is what an LR schedule must be told."""
    return [math.ceil(math.ceil(k / world_size) / batch_size) for k in epoch_sizes(policy, n, num_epochs)]


def nominal_cost(policy: SelectionPolicy, num_epochs: int, n: int = 1_000_000) -> float:
    """Sample passes relative to full data over `num_epochs`: (⌊δE⌋·ρ + E − ⌊δE⌋)/E for a fixed ratio."""
    return sum(epoch_sizes(policy, n, num_epochs)) / (n * num_epochs)


def epochs_for_steps(
    policy: SelectionPolicy, n: int, max_steps: int, batch_size: int, world_size: int = 1, limit: int = 100_000
) -> int:
    """The smallest E whose planned schedule reaches `max_steps` (for step-limited runs without max_epochs)."""
    for epochs in range(1, limit + 1):
        if sum(planned_batches(policy, n, epochs, batch_size, world_size)) >= max_steps:
            return epochs
    raise ValueError(f"max_steps={max_steps} needs more than {limit} epochs of {n} samples; set max_epochs")


# DataLoader settings a selection loader takes from the user's: every one but those that decide which samples a batch
# holds (the selection sampler does: shuffled, and no sample of the selection dropped)
_REPLACED = ("self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
KEPT_SETTINGS = tuple(p for p in inspect.signature(DataLoader.__init__).parameters if p not in _REPLACED)


def selection_loader(base: DataLoader, sampler: Sampler, batch_size: int) -> DataLoader:
    """A DataLoader over `base`'s dataset drawing batches of `batch_size` from `sampler`, with every other setting of
    `base` kept (workers and their persistence, prefetch, generator, multiprocessing context, pinning, collate, ...).
    One loader serves a whole fit: the sampler's selection changes between epochs, the loader does not."""
    kept = {name: getattr(base, name) for name in KEPT_SETTINGS if hasattr(base, name)}
    return DataLoader(base.dataset, batch_size=batch_size, sampler=sampler, drop_last=False, **kept)


class IndexedDataset(Dataset):
    """Wraps a dataset so items are dicts carrying their index: `(x, y)` → {"x", "y", "index"}; a dict item
    gains an "index" key. The selection callback needs the index to score and weight each sample."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.dataset[i]
        if isinstance(item, dict):
            return {**item, "index": i}
        x, y = item
        return {"x": x, "y": y, "index": i}


__all__ = [
    "IndexedDataset", "SelectionSampler", "epoch_sizes", "epochs_for_steps", "nominal_cost", "planned_batches",
    "pruned_epochs", "selection_loader",
]
