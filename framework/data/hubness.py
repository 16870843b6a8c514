"""Feature-set pairs (real, generated) for evaluating distance-based generative metrics under hubness.

Each validation item is one configuration, generated deterministically from its seed when it is read:

* `gauss`: X, Y ~ N(0, I_d), the same distribution, for d in `dims` and `seeds` seeds: every ideal metric is
  ~1 (coverage 1 − 2^-k), so any drift with d is a hubness artefact.
* `digits`: scikit-learn's 8×8 digits (/16) split in half, real vs "generated": the same distribution, the
  generated half restricted to classes 0–4, or to 0–1 (mode dropping); each with and without `noise_dims`
  extra N(0, σ²) columns, which turn the low-hubness pixel space into a high-hubness one.
* `ood`: a fraction p of the generated N(0, I) points scaled by max(2, 10 + N(0, 1)) (Clipped-D&C protocol):
  ideal precision is (1 − p)·P(0), recall flat.

Validation is sharded by rank (each rank reads every world_size-th configuration); training batches are
placeholders, since evaluation trains nothing.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


def gaussian_pair(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, device=g.device), torch.randn(n, d, generator=g, device=g.device)


def shifted_pair(n: int, d: int, shift: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Real N(0, I_d), generated N(shift·e1, I_d): the separation ladder (shift in σ; 5σ is nearly disjoint)."""
    real, fake = gaussian_pair(n, d, seed)
    fake[:, 0] += shift
    return real, fake


def ood_pair(n: int, d: int, p: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Real N(0, I); generated N(0, I) with the first round(p·n) points scaled by max(2, 10 + N(0, 1))."""
    real, fake = gaussian_pair(n, d, seed)
    g = torch.Generator().manual_seed(seed + 1)
    bad = round(p * n)
    fake[:bad] *= (10 + torch.randn(bad, 1, generator=g, device=g.device)).clamp(min=2)
    return real, fake


def digits_pair(keep: int, noise_dims: int, sigma: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Digits split in half (real, generated); the generated half keeps classes < `keep`; optional noise columns."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16
    y = torch.tensor(data.target)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g, device=g.device)
    real_idx, fake_idx = order[: len(x) // 2], order[len(x) // 2 :]
    fake_idx = fake_idx[y[fake_idx] < keep]
    real, fake = x[real_idx], x[fake_idx]
    if noise_dims:
        real = torch.cat([real, sigma * torch.randn(len(real), noise_dims, generator=g, device=g.device)], 1)
        fake = torch.cat([fake, sigma * torch.randn(len(fake), noise_dims, generator=g, device=g.device)], 1)
    return real, fake


class SweepSet(Dataset):
    """Configurations, materialised as {real, fake, scenario, label, d, param, seed} when read."""

    def __init__(self, configs: list[dict[str, Any]]):
        self.configs = configs

    def __len__(self) -> int:
        return len(self.configs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        c = dict(self.configs[i])
        if c["scenario"] == "gauss":
            real, fake = gaussian_pair(c["n"], c["d"], c["seed"])
        elif c["scenario"] == "ood":
            real, fake = ood_pair(c["n"], c["d"], c["param"], c["seed"])
        else:
            real, fake = digits_pair(int(c["param"]), c["noise_dims"], c["sigma"], c["seed"])
            c["d"] = real.shape[1]
        return {**c, "real": real, "fake": fake}


class HubnessSweep(L.LightningDataModule):
    """The hubness experiments of docs/gicdm.md as validation data; see the module docstring.

    Args:
        n: points in each real and each generated Gaussian set (≥ 16).
        dims: dimensions d of the `gauss` configurations, one configuration per d and seed.
        seeds: seeds (repeats) per `gauss` dimension, averaged in the report.
        digits: add the `digits` configurations (real vs generated halves of scikit-learn's digits).
        noise_dims: extra N(0, σ²) columns of the noisy `digits` variants; 0: only the noise-free ones are distinct.
        sigma: std σ of those noise columns.
        digit_classes: classes the generated digits half keeps (e.g. 5 keeps 0-4), one configuration each, in 1..10.
        ood_dim: dimension of the `ood` configurations.
        ood_fractions: fractions p of generated points moved far out in the `ood` configurations, each in [0, 1).
        seed: offset of every configuration's seed (1000·seed + repeat); None: 0.
    """

    def __init__(
        self,
        n: int = 2000,
        dims: list[int] = (2, 16, 64, 256, 1024, 2048),
        seeds: int = 3,
        digits: bool = True,
        noise_dims: int = 1024,
        sigma: float = 0.2,
        digit_classes: list[int] = (10, 5, 2),
        ood_dim: int = 256,
        ood_fractions: list[float] = (0.0, 0.2, 0.4, 0.6, 0.8),
        seed: int | None = None,
    ):
        super().__init__()
        if n < 16 or seeds < 1:
            raise ValueError(f"n={n} must be >= 16 and seeds={seeds} >= 1")
        if not dims or min(dims) < 1:
            raise ValueError(f"dims={list(dims)} must be a non-empty list of positive dimensions")
        if any(not 0 <= p < 1 for p in ood_fractions):
            raise ValueError(f"ood_fractions={list(ood_fractions)} must lie in [0, 1)")
        if any(not 1 <= c <= 10 for c in digit_classes) or noise_dims < 0:
            raise ValueError(f"digit_classes={list(digit_classes)} must lie in 1..10 and noise_dims={noise_dims} >= 0")
        self.seed = seed
        self.n, self.dims, self.seeds = n, list(dims), seeds
        self.digits, self.noise_dims, self.sigma = digits, noise_dims, sigma
        self.digit_classes = list(digit_classes)
        self.ood_dim, self.ood_fractions = ood_dim, list(ood_fractions)

    def configs(self) -> list[dict[str, Any]]:
        base = 1000 * (self.seed or 0)
        out: list[dict[str, Any]] = []
        for d in self.dims:
            for s in range(self.seeds):
                out.append(dict(scenario="gauss", label=f"gauss_d{d}", n=self.n, d=d, param=0.0, seed=base + s))
        for p in self.ood_fractions:
            out.append(dict(scenario="ood", label=f"ood_p{p:g}", n=self.n, d=self.ood_dim, param=p, seed=base))
        if self.digits:
            for noise in (0, self.noise_dims):
                for keep in self.digit_classes:
                    out.append(dict(scenario="digits", label=f"digits{'_noise' if noise else ''}_keep{keep}", n=0,
                                    d=0, param=float(keep), seed=base, noise_dims=noise, sigma=self.sigma))
        for i, c in enumerate(out):
            c.setdefault("noise_dims", 0)
            c.setdefault("sigma", 0.0)
            c["index"] = i
        return out

    def smallest_set(self) -> int:
        """The fewest points any configuration's real or generated set has (digits: the generated half that keeps
        the fewest classes), computed without generating the sets."""
        sizes = [self.n] if self.dims or self.ood_fractions else []
        if self.digits:
            from sklearn.datasets import load_digits

            y = torch.tensor(load_digits().target)
            g = torch.Generator().manual_seed(1000 * (self.seed or 0))
            order = torch.randperm(len(y), generator=g, device=g.device)
            fake = y[order[len(y) // 2:]]
            sizes += [int((fake < keep).sum()) for keep in self.digit_classes] + [len(y) // 2]
        return min(sizes)

    def _shard(self) -> list[dict[str, Any]]:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        return self.configs()[rank::world]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.zeros(64, 1), batch_size=1)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(SweepSet(self._shard()), batch_size=None, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
