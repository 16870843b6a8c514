"""Small classification workloads from scikit-learn (installed, nothing downloaded): 8×8 digits, and a harder
synthetic 10-class problem with symmetric label noise on the training split (data selection's noisy setup).

Items are dicts {"x", "y", "index"}; the index lets a data-selection callback score and weight each sample.
Training labels can be corrupted (`label_noise`): validation and test labels stay clean. `noisy` marks the
corrupted training samples, for checking what a selection policy picks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from framework.data.resumable import SplitData, check_batches
from framework.rng import draw_device


class ArrayDataset(Dataset):
    """Inputs `x` (N, ...) and labels `y` (N,) as tensors; item i is {"x": x[i], "y": y[i], "index": i}."""

    def __init__(self, x: Tensor, y: Tensor):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{x.shape[0]} inputs but {y.shape[0]} labels")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i], "index": i}


def corrupt_labels(y: Tensor, fraction: float, num_classes: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Symmetric label noise: ⌊fraction·N⌋ labels, chosen at random, moved to a different random class.
    Returns (labels, mask of corrupted samples)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"label_noise={fraction} must lie in [0, 1)")
    y = y.clone()
    chosen = torch.randperm(y.numel(), generator=generator, device=draw_device(generator))[: int(fraction * y.numel())]
    shift = torch.randint(1, num_classes, (chosen.numel(),), generator=generator, device=draw_device(generator))
    y[chosen] = (y[chosen] + shift) % num_classes
    mask = torch.zeros(y.numel(), dtype=torch.bool)
    mask[chosen] = True
    return y, mask


class _ArrayData(SplitData):
    """Train / validation / test splits of one labelled array; subclasses implement `arrays()`."""

    num_classes = 10
    input_shape: list[int]
    n_total: int | None = None  # samples before the split, when known without loading them

    def __init__(self, batch_size: int, seed: int, label_noise: float, val_fraction: float, test_fraction: float,
                 num_workers: int = 0):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if not 0.0 <= label_noise < 1.0:
            raise ValueError(f"label_noise={label_noise} must lie in [0, 1)")
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in (0, 1) "
                             "with a sum below 1")
        self.batch_size, self.seed, self.label_noise = batch_size, seed, label_noise
        self.val_fraction, self.test_fraction, self.num_workers = val_fraction, test_fraction, num_workers
        self.test_set: Dataset | None = None
        if self.n_total is not None:  # known before loading: refuse a batch larger than the training split now
            check_batches(self.n_total - int(test_fraction * self.n_total) - int(val_fraction * self.n_total),
                          batch_size)
        self.noisy: Tensor | None = None

    def arrays(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        x, y = self.arrays()
        g = torch.Generator().manual_seed(int(self.seed))
        order = torch.randperm(y.numel(), generator=g, device=g.device)
        n_test, n_val = int(self.test_fraction * y.numel()), int(self.val_fraction * y.numel())
        test, val, train = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
        x_train, x_val, x_test = self.normalise(x[train], x[val], x[test])
        y_train, self.noisy = corrupt_labels(y[train], self.label_noise, self.num_classes, g)
        self.train_set = ArrayDataset(x_train, y_train)
        self.val_set, self.test_set = ArrayDataset(x_val, y[val]), ArrayDataset(x_test, y[test])

    def normalise(self, train: Tensor, val: Tensor, test: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Standardise with the training split's mean and std (one scalar pair: pixels keep their layout)."""
        mean, std = train.mean(), train.std().clamp_min(1e-6)
        return (train - mean) / std, (val - mean) / std, (test - mean) / std

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers)


class DigitsData(_ArrayData):
    """scikit-learn's 1797 8×8 digits as (1, 8, 8) images; optional Gaussian pixel noise (σ in units of the
    0..16 intensity range) on every split, and symmetric label noise on the training split.

    Args:
        batch_size: samples per batch (the same for every split).
        seed: seed of the split, the label noise and the training order.
        label_noise: fraction of training labels moved to another random class, in [0, 1); val/test stay clean.
        pixel_noise: std of Gaussian noise on every split's pixels, as a fraction of the 0..16 intensity range; 0: none.
        val_fraction: fraction of the samples held out for validation, in (0, 1).
        test_fraction: fraction of the samples held out for testing, in (0, 1); with `val_fraction` below 1.
        num_workers: DataLoader worker processes; 0 loads in the main process.
    """

    input_shape = [1, 8, 8]
    n_total = 1797  # scikit-learn's digits

    def __init__(self, batch_size: int = 64, seed: int = 0, label_noise: float = 0.0, pixel_noise: float = 0.0,
                 val_fraction: float = 0.1, test_fraction: float = 0.2, num_workers: int = 0):
        super().__init__(batch_size, seed, label_noise, val_fraction, test_fraction, num_workers)
        if pixel_noise < 0:
            raise ValueError(f"pixel_noise={pixel_noise} must be >= 0")
        self.pixel_noise = pixel_noise

    def arrays(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import load_digits

        data = load_digits()
        x = torch.tensor(data.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
        if self.pixel_noise:
            g = torch.Generator().manual_seed(int(self.seed) + 1)
            x = x + self.pixel_noise * torch.randn(x.shape, generator=g, device=g.device)
        return x, torch.tensor(data.target, dtype=torch.long)


class SyntheticClasses(_ArrayData):
    """`sklearn.datasets.make_classification`: 10 classes of 2 Gaussian clusters each in 64 dimensions
    (16 informative, 8 redundant), class_sep 1.2; 20% symmetric label noise on the training split by default.

    Args:
        n_samples: samples generated before the split.
        n_features: input dimensions (at most 8 of them redundant combinations of the informative ones).
        n_informative: informative dimensions, ≤ n_features, with 2^n_informative ≥ 20 clusters.
        class_sep: distance between the class clusters (scikit-learn's `class_sep`); larger is easier.
        label_noise: fraction of training labels moved to another random class, in [0, 1); val/test stay clean.
        batch_size: samples per batch (the same for every split).
        seed: seed of the generated data, the split, the label noise and the training order.
        val_fraction: fraction of the samples held out for validation, in (0, 1).
        test_fraction: fraction of the samples held out for testing, in (0, 1); with `val_fraction` below 1.
        num_workers: DataLoader worker processes; 0 loads in the main process.
    """

    def __init__(self, n_samples: int = 10_000, n_features: int = 64, n_informative: int = 16,
                 class_sep: float = 1.2, label_noise: float = 0.2, batch_size: int = 128, seed: int = 0,
                 val_fraction: float = 0.1, test_fraction: float = 0.2, num_workers: int = 0):
        if n_samples < 1:
            raise ValueError(f"n_samples={n_samples} must be >= 1")
        self.n_total = n_samples
        super().__init__(batch_size, seed, label_noise, val_fraction, test_fraction, num_workers)
        if n_informative > n_features or 2 ** n_informative < 2 * self.num_classes:
            raise ValueError(f"n_informative={n_informative} must be <= n_features={n_features} and give "
                             f"2^n_informative >= {2 * self.num_classes} clusters")
        self.n_samples, self.n_features, self.n_informative = n_samples, n_features, n_informative
        self.class_sep = class_sep
        self.input_shape = [n_features]

    def arrays(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import make_classification

        x, y = make_classification(
            n_samples=self.n_samples, n_features=self.n_features, n_informative=self.n_informative,
            n_redundant=min(8, self.n_features - self.n_informative), n_classes=self.num_classes,
            n_clusters_per_class=2, class_sep=self.class_sep, flip_y=0.0, random_state=int(self.seed),
        )
        return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)

    def normalise(self, train: Tensor, val: Tensor, test: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        mean, std = train.mean(0), train.std(0).clamp_min(1e-6)  # per feature: the columns differ in scale
        return (train - mean) / std, (val - mean) / std, (test - mean) / std
