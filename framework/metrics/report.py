"""Tables and plots for metric sweeps: rows of P/R/D/C per (configuration, correction), averaged over seeds; and
the separation ladder (N(0, I) vs N(shift·e1, I)) with its over-correction guard."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

METRICS = ("precision", "recall", "density", "coverage")
#: the reals' k-occurrence skewness, raw and after the correction (a row under correction none has no corrected one);
#: the names `framework.metrics.functional` gives them
SKEWNESS, SKEWNESS_CORRECTED = "real_k_occurrence_skewness", "real_k_occurrence_skewness_corrected"


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds of every metric, per (label, correction), in first-seen order (the
    corrected skewness only for a correction that computed one)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["label"], row["correction"])].append(row)
    out = []
    for group in groups.values():
        agg = {k: group[0][k] for k in ("label", "scenario", "d", "param", "correction")}
        agg["seeds"] = len(group)
        for key in (*METRICS, SKEWNESS, SKEWNESS_CORRECTED, "seconds"):
            if key not in group[0]:
                continue
            values = [float(r[key]) for r in group]
            mean = sum(values) / len(values)
            agg[key] = mean
            agg[key + "_std"] = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        out.append(agg)
    return out


def markdown_table(agg: list[dict[str, Any]]) -> str:
    """One line per configuration: S_Nk before → after, then P/R/D/C for each correction."""
    corrections = list(dict.fromkeys(a["correction"] for a in agg))
    by_label: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for a in agg:
        by_label[a["label"]][a["correction"]] = a
    head = ["configuration", "d", "seeds", "S_Nk real (raw → corrected)"] + [f"{c}: P / R / D / C" for c in corrections]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, per in by_label.items():
        first = next(iter(per.values()))
        after = [f"{a[SKEWNESS_CORRECTED]:.2f}" for a in per.values() if SKEWNESS_CORRECTED in a]
        skew = f"{first[SKEWNESS]:.2f} → {after[0]}" if after else f"{first[SKEWNESS]:.2f}"
        cells = [label, str(first["d"]), str(first["seeds"]), skew]
        for c in corrections:
            a = per.get(c)
            cells.append(" / ".join(f"{a[m]:.3f}" for m in METRICS) if a else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_hubness(agg: list[dict[str, Any]], png: Path) -> None:
    """Metric vs dimension (Gaussians, identical distributions), one line per correction, plus S_Nk."""
    from matplotlib.figure import Figure

    gauss = [a for a in agg if a["scenario"] == "gauss"]
    corrections = list(dict.fromkeys(a["correction"] for a in gauss))
    fig = Figure(figsize=(15, 3.3))
    axes = fig.subplots(1, 5)
    for ax, key in zip(axes, (*METRICS, "skew"), strict=True):
        for c in corrections:
            pts = sorted((a["d"], a) for a in gauss if a["correction"] == c)
            ds = [d for d, _ in pts]
            if key == "skew":
                if c == "none":
                    ax.plot(ds, [a[SKEWNESS] for _, a in pts], marker="o", label="raw")
                else:
                    ax.plot(ds, [a[SKEWNESS_CORRECTED] for _, a in pts], marker="s", label=f"after {c}")
                continue
            ax.errorbar(ds, [a[key] for _, a in pts], yerr=[a[key + "_std"] for _, a in pts], marker="o",
                        capsize=2, label=c)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="dimension d", title="k-occurrence skewness S_Nk" if key == "skew" else key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("identical N(0, I) real and generated sets: ideal P = R = D = 1, C = 1 - 2^-k", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def plot_scenarios(agg: list[dict[str, Any]], png: Path) -> None:
    """OOD contamination (precision and recall vs fraction) and digits mode dropping (recall, coverage)."""
    from matplotlib.figure import Figure

    corrections = list(dict.fromkeys(a["correction"] for a in agg))
    fig = Figure(figsize=(13, 3.6))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    ood = [a for a in agg if a["scenario"] == "ood"]
    for c in corrections:
        pts = sorted((a["param"], a) for a in ood if a["correction"] == c)
        if pts:
            ax1.plot([p for p, _ in pts], [a["precision"] for _, a in pts], marker="o", label=c)
            ax2.plot([p for p, _ in pts], [a["recall"] for _, a in pts], marker="o", label=c)
    if ood:
        ax1.plot([0, 1], [1, 0], "k:", label="ideal (1 - p)")
    ax1.set(xlabel="OOD fraction p of generated points", title="precision under OOD contamination")
    ax2.set(xlabel="OOD fraction p", title="recall (ideal: flat)")
    digits = [a for a in agg if a["scenario"] == "digits"]
    labels = list(dict.fromkeys(a["label"] for a in digits))
    width = 0.8 / max(1, 2 * len(corrections))
    for ci, c in enumerate(corrections):
        for mi, key in enumerate(("recall", "coverage")):
            vals = [next((a[key] for a in digits if a["label"] == lab and a["correction"] == c), 0) for lab in labels]
            pos = [i + (2 * ci + mi) * width for i in range(len(labels))]
            ax3.bar(pos, vals, width, label=f"{key} {c}")
    ax3.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))],
                   [lab.replace("digits", "").strip("_") or "same" for lab in labels], fontsize=7, rotation=20)
    ax3.set(title="digits: generated classes < K (ideal R, C ≈ K/10)")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def write_report(rows: list[dict[str, Any]], out_dir: Path, name: str = "gicdm_eval") -> dict[str, Any]:
    """`{name}.json` (rows and aggregates), `{name}.md` (table) and the PNGs in `out_dir`; returns the aggregates."""
    out_dir.mkdir(parents=True, exist_ok=True)
    agg = aggregate(rows)
    (out_dir / f"{name}.json").write_text(json.dumps({"rows": rows, "aggregate": agg}, indent=2))
    (out_dir / f"{name}.md").write_text(markdown_table(agg) + "\n")
    if any(a["scenario"] == "gauss" for a in agg):
        plot_hubness(agg, out_dir / "gicdm_hubness.png")
    if any(a["scenario"] in ("ood", "digits") for a in agg):
        plot_scenarios(agg, out_dir / "gicdm_scenarios.png")
    return {"aggregate": agg}


#: the separation ladder: real N(0, I_d) vs generated N(shift·e1, I_d), N = M points, k = 5, seed 0
LADDER_DIMS, LADDER_SHIFTS, LADDER_N = (64, 512), (0.0, 0.5, 1.0, 2.0, 5.0), 1000
#: the over-correction guard: at shift 5σ (marginals overlap 2Φ(−2.5) = 1.2 %) a correction may raise precision
#: above raw by at most this much
GUARD_SHIFT, GUARD_MARGIN = 5.0, 0.05


def ladder(corrections: tuple[str, ...] = ("none", "icdm", "gicdm_reconstructed"), n: int = LADDER_N,
           dims: tuple[int, ...] = LADDER_DIMS, shifts: tuple[float, ...] = LADDER_SHIFTS) -> list[dict[str, Any]]:
    """One row per (d, shift, correction): P/R/D/C and, for the reconstruction, the fraction its filter left raw."""
    from framework.data.hubness import shifted_pair
    from framework.metrics.functional import prdc

    rows = []
    for d in dims:
        for shift in shifts:
            real, fake = shifted_pair(n, d, shift, 0)
            for c in corrections:
                out = prdc(real, fake, 5, c)
                rows.append({"n": n, "d": d, "shift": shift, "correction": c, **{m: out[m] for m in METRICS},
                             "filtered_fraction": out.get("filtered_fraction")})
    return rows


def ladder_markdown(rows: list[dict[str, Any]]) -> str:
    """The ladder as a table (P / R / D / C per correction) and the guard's verdict per correction."""
    corrections = list(dict.fromkeys(r["correction"] for r in rows))
    cell = {(r["d"], r["shift"], r["correction"]): r for r in rows}
    head = ["d", "shift (σ)"] + [f"{c}: P / R / D / C" for c in corrections] + ["filtered"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d, shift in dict.fromkeys((r["d"], r["shift"]) for r in rows):
        cells = [str(d), f"{shift:g}"]
        cells += [" / ".join(f"{cell[d, shift, c][m]:.3f}" for m in METRICS) for c in corrections]
        ff = [cell[d, shift, c]["filtered_fraction"] for c in corrections if cell[d, shift, c]["filtered_fraction"]
              is not None]
        lines.append("| " + " | ".join(cells + [f"{ff[0]:.3f}" if ff else "–"]) + " |")
    lines += ["", f"Guard (shift {GUARD_SHIFT:g}σ): corrected precision − raw precision ≤ {GUARD_MARGIN}", ""]
    for c in corrections[1:]:
        gaps = [(d, cell[d, GUARD_SHIFT, c]["precision"] - cell[d, GUARD_SHIFT, "none"]["precision"])
                for d in dict.fromkeys(r["d"] for r in rows) if (d, GUARD_SHIFT, c) in cell]
        verdict = "holds" if all(g <= GUARD_MARGIN for _, g in gaps) else "FAILS"
        lines.append(f"- {c}: " + ", ".join(f"d = {d}: {g:+.3f}" for d, g in gaps) + f" → {verdict}")
    return "\n".join(lines)
