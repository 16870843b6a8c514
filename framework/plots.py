"""Plots written next to a run's results: training curves from Lightning's CSV log (headless: Agg canvas, no pyplot)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

__all__ = ["plot_training_curves", "read_metrics_csv"]


def read_metrics_csv(metrics_csv: str | Path) -> dict[str, list[tuple[int, float]]]:
    """`{column: [(step, value), ...]}` for every `train/*` and `val/*` column of a CSVLogger `metrics.csv`."""
    with open(metrics_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    curves: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        step = row.get("step")
        if not step:
            continue
        for column, value in row.items():
            if column and column.startswith(("train/", "val/")) and value not in (None, ""):
                number = float(value)
                if math.isfinite(number):
                    curves.setdefault(column, []).append((int(float(step)), number))
    return curves


def plot_training_curves(metrics_csv: str | Path, out_png: str | Path) -> Path:
    """Plot every train/* and val/* column against the step; one panel per metric (`train/loss` with `val/loss`).

    Raises ValueError when the CSV holds no train/* or val/* values, so a caller can skip the plot knowingly.
    """
    curves = read_metrics_csv(metrics_csv)
    if not curves:
        raise ValueError(f"{metrics_csv} has no train/* or val/* values to plot")
    from matplotlib.figure import Figure  # no pyplot: no global backend state, works headless (Agg canvas)

    panels: dict[str, list[str]] = {}
    for column in sorted(curves):
        panels.setdefault(column.split("/", 1)[1], []).append(column)
    fig = Figure(figsize=(4.5 * len(panels), 3.5))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (metric, columns) in zip(axes[0], sorted(panels.items()), strict=True):
        for column in columns:
            steps, values = zip(*sorted(curves[column]), strict=True)
            ax.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=column)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
