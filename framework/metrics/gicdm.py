"""`GICDM`: precision / recall / density / coverage, raw (the default) or hubness-corrected, as a torchmetrics Metric.

Features (or inputs pushed through an optional extractor, any `nn.Module`) accumulate in list states that
sync across processes with `dist_reduce_fx="cat"`, like torchmetrics' KID; `compute()` runs the exact chunked
computation of `framework.metrics.functional.prdc` on the gathered sets and returns tensors only, so
`self.log_dict(metric.compute())` works. The default `correction="none"` equals `prdc.compute_prdc`;
`"gicdm_reconstructed"` is our reconstruction of arXiv 2602.16449, opt-in because it over-corrects (docs/gicdm.md).

    metric = GICDM(k=5)
    metric.update(real_feats, real=True)
    metric.update(fake_feats, real=False)
    metric.compute()  # {'precision': tensor(.98), ..., 'hub_skew_real': ..., 'approx_graph': tensor(0.)}
    metric.info       # {'correction': 'none', 'n_real': ..., ...}: the non-numeric facts of the last compute()
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from framework.metrics.functional import NEIGHBOURS, check_correction, prdc

#: what compute() returns, always, as float32 tensors
KEYS = ("precision", "recall", "density", "coverage", "hub_skew_real", "hub_skew_real_corrected", "approx_graph")
_OPTIONS = ("alpha", "max_iter", "tol", "beta", "filter_scales", "filter_quantile", "candidates", "dense_max",
            "block_size")


class GICDM(Metric):
    """Exact P/R/D/C (prdc conventions) with the real set's k-occurrence skewness before and after the correction.

    `feature`: an `nn.Module` mapping inputs to (B, D) features (e.g. `timm.create_model(..., num_classes=0)` or
    `framework.hub.from_pretrained(...)`); None means inputs are features. `correction`: 'none' (raw, default),
    'icdm' (real factors only) or 'gicdm_reconstructed' (ours; warns once). `neighbours`: 'exact' (default) or
    'approx_graph' (ICDM on a candidate graph); `approx_graph` in the result is 1.0 when the approximation ran.
    `strict=False` uses Kynkäänniemi's `<=`. `reset_real_features=False` keeps the real features across `reset()`
    (evaluate many generators against one reference). Other keyword arguments of `prdc` (alpha, max_iter, tol,
    beta, filter_scales, filter_quantile, candidates, dense_max, block_size) go in `options`; the rest (e.g.
    `compute_on_cpu=True`) to torchmetrics' `Metric`.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    real_features: list[Tensor]
    fake_features: list[Tensor]

    def __init__(
        self,
        feature: nn.Module | None = None,
        k: int = 5,
        correction: str = "none",
        strict: bool = True,
        neighbours: str = "exact",
        reset_real_features: bool = True,
        options: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        check_correction(correction)
        if neighbours not in NEIGHBOURS:
            raise ValueError(f"neighbours={neighbours!r} is not one of {', '.join(map(repr, NEIGHBOURS))}")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be a positive integer (prdc uses 5, Kynkäänniemi et al. 3)")
        if feature is not None and not isinstance(feature, nn.Module):
            raise TypeError(f"feature must be an nn.Module mapping inputs to (B, D) features or None, got {feature!r}")
        bad = sorted(set(options or {}) - set(_OPTIONS))
        if bad:
            raise ValueError(f"options {bad} are not prdc options; valid: {', '.join(_OPTIONS)}")
        self.feature = feature
        self.k, self.correction, self.strict, self.neighbours = k, correction, strict, neighbours
        self.reset_real_features = reset_real_features
        self.options = dict(options or {})
        self.info: dict[str, Any] = {}
        self.add_state("real_features", [], dist_reduce_fx="cat")
        self.add_state("fake_features", [], dist_reduce_fx="cat")

    def update(self, x: Tensor, real: bool) -> None:  # type: ignore[override]
        """Add a batch of real (`real=True`) or generated inputs; the flag is explicit so roles cannot swap."""
        if self.feature is not None:
            was_training = self.feature.training
            self.feature.eval()
            with torch.no_grad():
                x = self.feature(x)
            self.feature.train(was_training)
        f = x.detach().flatten(1)
        f = f if f.dtype == torch.float64 else f.float()
        (self.real_features if real else self.fake_features).append(f)

    def forward(self, x: Tensor, real: bool) -> dict[str, Tensor]:  # type: ignore[override]
        """Score a batch of generated inputs against the kept reals and add it to the state (the FID/KID pattern).

        Needs `reset_real_features=False` and reals added by `update(x, real=True)`: torchmetrics computes the batch
        value after a `reset()`, so only reals kept across it can be in the batch's state. Its reduce step then
        concatenates the state before the batch with the batch's, and both hold the kept reals; they are stored once.
        """
        if real or self.reset_real_features or not len(self.real_features):
            raise RuntimeError(
                "GICDM's forward scores a batch of generated inputs against real features kept across reset(): use"
                " GICDM(reset_real_features=False), add the reals with update(x, real=True), then call metric(x,"
                f" real=False); got real={real}, reset_real_features={self.reset_real_features},"
                f" {len(self.real_features)} real batches (update() and compute() need neither)"
            )
        n_real = len(self.real_features)
        batch = super().forward(x, real)
        self.real_features = self.real_features[:n_real]  # keep the reals once: drop the batch state's second copy
        return batch

    def compute(self) -> dict[str, Tensor]:
        """The `KEYS` as float32 tensors (loggable as they are); strings and counts go to `self.info`."""
        n_real, n_fake = (len(s) if isinstance(s, list) else 1 for s in (self.real_features, self.fake_features))
        if not n_real or not n_fake:  # (after a DDP sync the list states are single tensors)
            raise RuntimeError(
                f"GICDM needs real and generated features; got {n_real} real and {n_fake} generated batches"
                " (call update(x, real=True) and update(x, real=False))"
            )
        real, fake = dim_zero_cat(self.real_features), dim_zero_cat(self.fake_features)
        out = prdc(real, fake, self.k, self.correction, strict=self.strict, neighbours=self.neighbours,
                   **self.options)
        out["approx_graph"] = float(out.get("neighbours") == "approx_graph")
        self.info = {key: v for key, v in out.items() if key not in KEYS}
        self.info.update(n_real=int(real.shape[0]), n_fake=int(fake.shape[0]))
        return {key: torch.tensor(out[key], dtype=torch.float32, device=real.device) for key in KEYS}

    def reset(self) -> None:
        """Clear the states; with `reset_real_features=False` the real features survive (KID/FID pattern)."""
        if self.reset_real_features:
            super().reset()
            return
        value = self._defaults.pop("real_features")
        super().reset()
        self._defaults["real_features"] = value

