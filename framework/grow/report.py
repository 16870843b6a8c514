"""The per-layer norm profile plot (the paper's Fig. 2 metric) before and after growth (headless Agg canvas)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def plot_norm_profiles(profiles: Mapping[str, Sequence[float]], out_png: str | Path,
                       title: str = "per-layer weight norm ‖W‖_F/√numel") -> Path:
    """One line per labelled profile, x = layer index scaled to [0, 1] (so 4 and 8 layers share an axis)."""
    if not profiles:
        raise ValueError("no norm profiles to plot")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    for label, values in profiles.items():
        n = len(values)
        xs = [(i + 0.5) / n for i in range(n)]
        ax.plot(xs, list(values), marker="o", markersize=4, label=f"{label} ({n} layers)")
    ax.set_xlabel("relative depth (layer + ½) / layers")
    ax.set_ylabel("mean ‖W‖_F / √numel")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
