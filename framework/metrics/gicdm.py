"""`GICDM`: precision / recall / density / coverage, raw (the default) or hubness-corrected, as a torchmetrics Metric.

Features (or inputs pushed through an optional extractor, any `nn.Module`) accumulate in list states that
sync across processes with `dist_reduce_fx="cat"`, like torchmetrics' KID; `compute()` runs the exact chunked
computation of `framework.metrics.functional.prdc` on the gathered sets and returns tensors only, so
`self.log_dict(metric.compute())` works. The default `correction="none"` equals `prdc.compute_prdc`;
`"gicdm_reconstructed"` is our reconstruction of arXiv 2602.16449, opt-in because it over-corrects (docs/gicdm.md).

    metric = GICDM(k=5)
    metric.update(real_feats, real=True)
    metric.update(fake_feats, real=False)
    metric.compute()  # {'precision': tensor(.98), ..., 'real_k_occurrence_skewness': ..., 'approx_graph': tensor(0.)}
    metric(fake_feats, real=False)  # torchmetrics' forward: update(...) plus the batch's value (see GICDM.forward)
    metric.info       # {'correction': 'none', 'n_real': ..., ...}: the non-numeric facts of the last compute()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat, rank_zero_warn
from torchmetrics.utilities.distributed import gather_all_tensors

from framework.metrics.functional import NEIGHBOURS, SKEWNESS, SKEWNESS_CORRECTED, check_correction, prdc

#: what compute() returns, as float32 tensors: P/R/D/C (corrected when a correction is set), the reals' k-occurrence
#: skewness raw and after the correction (the second only under a correction: see `result_keys`), approx_graph
KEYS = ("precision", "recall", "density", "coverage", SKEWNESS, SKEWNESS_CORRECTED, "approx_graph")
_OPTIONS = ("alpha", "max_iter", "tol", "beta", "filter_scales", "filter_quantile", "candidates", "dense_max",
            "block_size")


def result_keys(correction: str) -> tuple[str, ...]:
    """The keys `GICDM(correction=...).compute()` returns: `KEYS`, less the corrected skewness under 'none'."""
    return KEYS if correction != "none" else tuple(key for key in KEYS if key != SKEWNESS_CORRECTED)


def _rows(state: list[Tensor] | Tensor) -> int:
    """Feature vectors in a state: a list of (B, D) batches, or one tensor after a DDP sync."""
    return sum(int(t.shape[0]) for t in state) if isinstance(state, list) else int(state.shape[0])


def _fingerprint(x: Tensor) -> Tensor:
    """(rows, columns, sum, row-weighted sum) in float64: equal for bitwise-equal sets, order included."""
    x = x.flatten(1).double() if x.numel() else x.new_zeros((0, 0), dtype=torch.float64)
    rows = x.sum(1)
    weights = torch.arange(1, rows.numel() + 1, dtype=torch.float64, device=x.device)
    return torch.stack([x.new_tensor(float(x.shape[0])), x.new_tensor(float(x.shape[1])), rows.sum(),
                        (rows * weights).sum()])


class GICDM(Metric):
    """Exact P/R/D/C (prdc conventions) with the real set's k-occurrence skewness before and after the correction.

    `approx_graph` in the result is 1.0 when the approximate neighbours ran. Other keyword arguments (e.g.
    `compute_on_cpu=True`) go to torchmetrics' `Metric`.

    Args:
        feature: module mapping inputs to (B, D) features (e.g. a timm model, num_classes=0); None: inputs are features.
        k: neighbourhood size: each point's ball reaches its k-th nearest neighbour (prdc uses 5).
        correction: hubness correction: "none" (raw), "icdm" (real factors only) or "gicdm_reconstructed" (ours).
        strict: count a point inside a ball only when strictly closer than its radius; False uses Kynkäänniemi's `<=`.
        neighbours: "exact" neighbours, or "approx_graph" (ICDM on a candidate graph).
        reset_real_features: clear the real features on `reset()`; False keeps one reference for many generators.
        options: further `prdc` options (alpha, max_iter, tol, beta, filter_scales, filter_quantile, candidates, ...).
        real_replicated: every process holds the same real set, so under DDP it is counted once, not gathered.
            A rank holding other reals is then an error; by default reals, like fakes, are per-rank shards.
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
        real_replicated: bool = False,
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
        self.real_replicated = bool(real_replicated)
        self.options = dict(options or {})
        self.info: dict[str, Any] = {}
        self._in_forward = self._warned_one_sided = self._warned_duplicates = False
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

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """torchmetrics' contract for any `update` signature: `metric(*args)` is `update(*args)` plus the batch's value.

        The batch value is `compute()` on the batch's state after a `reset()`: the batch plus, with
        `reset_real_features=False`, the kept reals (the FID/KID pattern: `metric(fake, real=False)` scores the batch
        against them). If that state lacks reals or generated features (e.g. `metric(fake, real=False)` without kept
        reals), every key of the batch value is NaN, warned once per metric, instead of an error: torchmetrics has
        reset the accumulated state by then, so raising would lose it; the batch is still added and the final
        `compute()` sees everything. torchmetrics' reduce path (`full_state_update=False`, no `dist_sync_on_step`)
        concatenates the state before the batch with the batch's, both holding the kept reals; the second copy is
        dropped, so the kept reals count once and any reals the batch added stay.
        """
        kept = 0 if self.reset_real_features else len(self.real_features)
        reduce_path = not (self.full_state_update or self.full_state_update is None or self.dist_sync_on_step)
        self._in_forward = True
        try:
            batch = super().forward(*args, **kwargs)
        finally:
            self._in_forward = False
        if kept and reduce_path:  # [kept reals (global copy), kept reals (batch state's), reals the batch added]
            self.real_features = self.real_features[:kept] + self.real_features[2 * kept:]
        return batch

    def compute(self) -> dict[str, Tensor]:
        """`result_keys(correction)` as float32 tensors (loggable as they are); strings and counts go to `self.info`.
        """
        n_real, n_fake = _rows(self.real_features), _rows(self.fake_features)
        if (not n_real or not n_fake) and self._in_forward:  # a one-sided batch: NaN, the global state survives
            if not self._warned_one_sided:
                self._warned_one_sided = True
                rank_zero_warn(
                    f"GICDM's forward got a batch state with {n_real} real and {n_fake} generated features; its"
                    " batch value is NaN (the batch is still accumulated; compute() at the end scores everything)."
                    " Keep the reals with reset_real_features=False to score each generated batch against them.",
                    stacklevel=3,  # points at this line, not at torchmetrics' helper
                )
            self.info = {"n_real": n_real, "n_fake": n_fake}
            return {key: torch.tensor(float("nan"), dtype=torch.float32, device=self.device)
                    for key in result_keys(self.correction)}
        if not n_real or not n_fake:
            raise RuntimeError(
                f"GICDM needs real and generated features; got {n_real} real and {n_fake} generated feature vectors"
                " (call update(x, real=True) and update(x, real=False))"
            )
        real, fake = dim_zero_cat(self.real_features), dim_zero_cat(self.fake_features)
        out = prdc(real, fake, self.k, self.correction, strict=self.strict, neighbours=self.neighbours,
                   **self.options)
        out["approx_graph"] = float(out.get("neighbours") == "approx_graph")
        self.info = {key: v for key, v in out.items() if key not in KEYS}
        self.info.update(n_real=int(real.shape[0]), n_fake=int(fake.shape[0]))
        return {key: torch.tensor(out[key], dtype=torch.float32, device=real.device)
                for key in result_keys(self.correction)}

    def _sync_dist(self, dist_sync_fn: Callable = gather_all_tensors, process_group: Any | None = None) -> None:
        """torchmetrics' sync, except that replicated reals stay this rank's copy (checked equal on every rank)."""
        if not self.real_replicated:
            local = _rows(self.real_features)
            super()._sync_dist(dist_sync_fn, process_group)
            self._warn_if_duplicated(local)
            return
        group = process_group or self.process_group
        reals = dim_zero_cat(self.real_features) if self.real_features else torch.empty(0, device=self.device)
        mine = _fingerprint(reals)
        prints = dist_sync_fn(mine, group=group)
        bad = [rank for rank, other in enumerate(prints) if not torch.equal(other, prints[0])]
        if bad:
            raise ValueError(
                f"GICDM(real_replicated=True) needs the same real features on every rank; rank(s) {bad} hold other "
                f"reals than rank 0 (rows, columns, checksums per rank: {[p.tolist() for p in prints]}). Shard the "
                "reals without real_replicated to have them concatenated instead")
        fx = self._reductions.pop("real_features")
        try:
            super()._sync_dist(dist_sync_fn, process_group)
        finally:
            self._reductions["real_features"] = fx

    def _warn_if_duplicated(self, local: int) -> None:
        """After a sync that concatenated the reals: warn once if they are copies of one set, one per rank."""
        world = torch.distributed.get_world_size(self.process_group) if torch.distributed.is_initialized() else 1
        total = _rows(self.real_features)
        if self._warned_duplicates or world < 2 or not local or total != world * local:
            return
        copies = dim_zero_cat(self.real_features).reshape(world, local, -1)
        if all(torch.equal(copies[0], copy) for copy in copies[1:]):
            self._warned_duplicates = True
            rank_zero_warn(
                f"GICDM: every one of the {world} ranks holds the same {local} real features, so the synced real set "
                f"holds each one {world} times and every k-NN radius shrinks; pass real_replicated=True to count a "
                "reference set that every rank loads once", stacklevel=2)

    def reset(self) -> None:
        """Clear the states; with `reset_real_features=False` the real features survive (KID/FID pattern)."""
        if self.reset_real_features:
            super().reset()
            return
        value = self._defaults.pop("real_features")
        super().reset()
        self._defaults["real_features"] = value

