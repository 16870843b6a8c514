"""The project's own DataModule: sklearn digits (bundled, no download) as plain `TensorDataset`s, tuple batches."""

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


class DigitsDataModule(L.LightningDataModule):
    def __init__(self, train_size: int = 512, val_size: int = 128, batch_size: int = 64, num_workers: int = 0):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train = self.data_val = None

    def setup(self, stage: str | None = None) -> None:
        if self.data_train is not None:
            return
        x, y = load_digits(return_X_y=True)
        g = torch.Generator().manual_seed(42)
        order = torch.randperm(len(y), generator=g)
        x, y = torch.tensor(x, dtype=torch.float32)[order] / 16.0, torch.tensor(y)[order]
        n, m = self.hparams.train_size, self.hparams.val_size
        self.data_train = TensorDataset(x[:n], y[:n])
        self.data_val = TensorDataset(x[n : n + m], y[n : n + m])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data_train, batch_size=self.hparams.batch_size, shuffle=True,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.data_val, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)
