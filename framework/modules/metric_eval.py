"""A LightningModule that trains nothing and evaluates P/R/D/C (raw, and corrected if asked) on each validation batch.

It lets `python -m framework.train` run metric experiments like any recipe: each validation batch is one
configuration `{real, fake, label, scenario, d, param, seed}` (e.g. from `framework.data.hubness.HubnessSweep`),
the optional `model` maps inputs to features, and at the end of validation the rows from every rank are gathered,
averaged over seeds, logged as `{label}/{metric}_{correction}` and written as a table, JSON and plots into the run
dir (`out_dir`, default the trainer's root dir). Training steps only advance the step counter: a placeholder
parameter (always 0, lr 0) exists so that DDP can wrap the module and every step has a backward to sync.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from framework.metrics.functional import CORRECTIONS, check_correction, prdc
from framework.metrics.report import METRICS, SKEWNESS, SKEWNESS_CORRECTED, write_report


class MetricEval(L.LightningModule):
    """Evaluates `corrections` of P/R/D/C with neighbourhood size `k` on every validation configuration (default:
    the raw metrics only; add 'icdm' or 'gicdm_reconstructed' to compare corrections). With `metric` (a torchmetrics
    Metric such as `GICDM`; `metric=gicdm` on the command line) it evaluates that metric instead, with its settings.

    Args:
        model: frozen feature extractor applied to the inputs, or a factory of one; None: the data are features already.
        optimizer: ignored: nothing is trained (a placeholder parameter steps at lr 0).
        scheduler: ignored, as `optimizer`.
        k: neighbourhood size of P/R/D/C: each point's ball reaches its k-th nearest neighbour (≥ 1).
        corrections: hubness corrections to evaluate, from "none", "icdm", "gicdm_reconstructed".
        out_dir: folder for the report table, JSON and plots; None: the trainer's root dir (the run dir).
        report_name: file stem of the report (`{report_name}.json`, `.md`).
        metric: a torchmetrics Metric (e.g. `GICDM`) evaluated instead of the k × corrections grid; None: the grid.
    """

    def __init__(
        self,
        model: nn.Module | Callable[[], nn.Module] | None = None,
        optimizer: Any = None,
        scheduler: Any = None,
        k: int = 5,
        corrections: list[str] = ("none",),
        out_dir: str | None = None,
        report_name: str = "gicdm_eval",
        metric: Any = None,
    ):
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be an integer >= 1 (the neighbours each point's ball reaches)")
        if not corrections or any(c not in CORRECTIONS and c != "gicdm" for c in corrections):
            raise ValueError(f"corrections={list(corrections)} must be non-empty, from {', '.join(CORRECTIONS)}")
        for c in corrections:
            check_correction(c)  # 'gicdm' gets the error naming its replacement; the reconstruction warns once
        if model is not None and not isinstance(model, nn.Module):
            model = model()  # a registry partial (`model=NAME` on the command line)
        if model is not None:  # a frozen feature extractor: nothing in it is trained or synced
            model.eval().requires_grad_(False)
        self.model = model  # None when the data are features already
        self.k, self.corrections = k, list(corrections)
        self.out_dir, self.report_name = out_dir, report_name
        if metric is not None and not callable(getattr(metric, "compute", None)):
            raise TypeError(f"metric must be a torchmetrics Metric (e.g. `metric=gicdm`), got {metric!r}")
        # `metric=NAME`: evaluate that Metric, with its own settings, on each configuration instead of the k ×
        # corrections grid. Each batch is its own configuration, so the metric must not sync across ranks
        # (the rows are gathered at the end of validation instead).
        self.metric = metric
        if metric is not None:
            metric.distributed_available_fn = lambda: False
        self.automatic_optimization = False
        self.placeholder = nn.Parameter(torch.zeros(()))
        self.rows: list[dict[str, Any]] = []
        self.summary: dict[str, float] = {}


    def check_data(self, data: Any) -> None:
        """ValueError unless every evaluation set has more points than `k` (and than the metric's own k): a point's
        k-th neighbour must exist. Uses the data module's `smallest_set()` (no data loaded) when it has one."""
        smallest = data.smallest_set() if callable(getattr(data, "smallest_set", None)) else None
        for name, k in (("k", self.k), ("metric.k", getattr(self.metric, "k", None))):
            if isinstance(smallest, int) and isinstance(k, int) and k >= smallest:
                raise ValueError(f"{name}={k} must be smaller than the smallest evaluation set, {smallest} points"
                                 f" (its k-th neighbour must exist); use {name} <= {smallest - 1}")
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([self.placeholder], lr=0.0)  # nothing to train

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.manual_backward(self.placeholder * 0.0)  # DDP expects a backward after each forward
        self.optimizers().step()  # only advances global_step

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if self.model is None:
            return x
        with torch.no_grad():
            return self.model(x).flatten(1)

    def on_validation_epoch_start(self) -> None:
        self.rows = []

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        real, fake = self.features(batch["real"]), self.features(batch["fake"])
        meta = {k: (v.item() if torch.is_tensor(v) else v) for k, v in batch.items() if k not in ("real", "fake")}
        if self.metric is not None:
            start = time.perf_counter()
            self.metric.reset()
            self.metric.update(real, real=True)
            self.metric.update(fake, real=False)
            out = {k: (v.item() if torch.is_tensor(v) else v) for k, v in self.metric.compute().items()}
            info = {k: v for k, v in getattr(self.metric, "info", {}).items() if isinstance(v, (int, float, str))}
            name = getattr(self.metric, "correction", type(self.metric).__name__)
            self.rows.append({**meta, "correction": name, **info, **out, "seconds": time.perf_counter() - start})
            return
        for correction in self.corrections:
            start = time.perf_counter()
            out = prdc(real, fake, self.k, correction)
            keep = {k: v for k, v in out.items() if isinstance(v, (int, float, str, bool))}
            self.rows.append({**meta, **keep, "seconds": time.perf_counter() - start})

    def on_validation_epoch_end(self) -> None:
        rows = self.rows
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, rows)
            rows = [r for part in gathered for r in part]
        if not rows:
            return
        order = {c: i for i, c in enumerate(self.corrections)}
        rows.sort(key=lambda r: (r.get("index", 0), order[r["correction"]]))
        out = Path(self.out_dir or self.trainer.default_root_dir)
        if self.trainer.is_global_zero:
            agg = write_report(rows, out, self.report_name)["aggregate"]
        else:
            from framework.metrics.report import aggregate

            agg = aggregate(rows)
        self.summary = {}
        for a in agg:
            for key in METRICS:
                self.summary[f"{a['label']}/{key}_{a['correction']}"] = a[key]
            self.summary[f"{a['label']}/{SKEWNESS}"] = a[SKEWNESS]
            if SKEWNESS_CORRECTED in a:
                self.summary[f"{a['label']}/{SKEWNESS_CORRECTED}_{a['correction']}"] = a[SKEWNESS_CORRECTED]
        for key, value in self.summary.items():
            self.log(key, value, rank_zero_only=False, sync_dist=False)
