"""Data-selection policies side by side: test accuracy (mean ± sd over seeds), cost actually spent (sample passes
relative to full data), wall time and the selection callback's own time, on sklearn digits and on a harder
synthetic 10-class problem with 20% label noise; plus the Data Agent's overhead next to a ResNet-18 step.

    python tools/bench/selection.py [--quick] [--seeds 3] [--out DIR]

Every policy runs through the same `DataSelection` callback and Lightning loop (full data included), with the
same model, optimizer (SGD-Nesterov, cosine schedule of the planned length) and seeds.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from framework.samplers import (  # noqa: E402
    DataAgentPolicy,
    EpsGreedyPolicy,
    FullPolicy,
    InfoBatchPolicy,
    RandomPolicy,
    UCBPolicy,
)

POLICIES = {
    "full": FullPolicy,
    "random": functools.partial(RandomPolicy, ratio=0.5),
    "infobatch": functools.partial(InfoBatchPolicy, prune_ratio=0.5),
    "eps_greedy": functools.partial(EpsGreedyPolicy, ratio=0.5, eps=0.1),
    "ucb": functools.partial(UCBPolicy, ratio=0.5, c=1.0),
    "data_agent": functools.partial(DataAgentPolicy, ratio=0.5),
    "data_agent_frozen": functools.partial(DataAgentPolicy, ratio=0.5, learn=False),  # ablation: no PPO updates
    "data_agent_ranked": functools.partial(DataAgentPolicy, ratio=0.5, variant="ranked"),  # experimental variant
}
QUICK_POLICIES = ("full", "random", "infobatch", "data_agent")
WORKLOADS = {  # data factory kwargs, epochs, lr
    "digits": (dict(kind="digits", batch_size=64), 30, 0.05),
    "synth_noisy": (dict(kind="synth", n_samples=6_000, label_noise=0.2, batch_size=128), 20, 0.05),
}


def make_data(kind: str, seed: int, **kw):
    from framework.data.digits import DigitsData, SyntheticClasses

    return DigitsData(seed=seed, **kw) if kind == "digits" else SyntheticClasses(seed=seed, **kw)


def run(workload: str, policy: str, seed: int, epochs: int | None = None) -> dict:
    """One training run; returns test accuracy, cost, wall time and the callback's own time."""
    import lightning as L

    from framework.callbacks.selection import DataSelection
    from framework.models.convnet import MLP
    from framework.modules.classifier import Classifier
    from framework.optim.schedulers import warmup_cosine

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no per-run banners in the report
    warnings.filterwarnings("ignore")
    data_kw, default_epochs, lr = WORKLOADS[workload]
    L.seed_everything(seed, verbose=False)
    data = make_data(seed=seed, **data_kw)
    module = Classifier(
        functools.partial(MLP, hidden=256, depth=2), num_classes=data.num_classes, input_shape=data.input_shape,
        optimizer=lambda ps: torch.optim.SGD([p for _, p in ps], lr=lr, momentum=0.9, nesterov=True,
                                             weight_decay=5e-4),
        scheduler=functools.partial(warmup_cosine, warmup_steps=20, min_lr_ratio=0.0),
    )
    selection = DataSelection(POLICIES[policy](), seed=seed)
    shares: list[float] = []
    overlaps: list[float] = []
    previous: list[set] = []

    class Diagnostics(L.Callback):
        """Per pruned epoch after the first: the share of mislabelled samples in the selection, and the
        fraction of the selection that was also selected the epoch before (uniform random: ρ)."""

        def on_train_epoch_start(self, trainer, pl_module):
            if not selection.sampler.pruning:
                return
            chosen = selection.sampler.selection.unique()
            noisy = getattr(data, "noisy", None)
            if noisy is not None and noisy.any() and trainer.current_epoch > 0:
                shares.append(float(noisy[chosen].float().mean()))
            now = set(chosen.tolist())
            if previous and trainer.current_epoch > 1:
                overlaps.append(len(now & previous[-1]) / len(now))
            previous[:] = [now]

    trainer = L.Trainer(max_epochs=epochs or default_epochs, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[selection, Diagnostics()],
                        default_root_dir=os.environ.get("TMPDIR", "/tmp"))
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start
    acc = trainer.test(module, datamodule=data, verbose=False)[0]["val/acc"]
    picked_noisy = statistics.mean(shares) if shares else float("nan")
    overlap = statistics.mean(overlaps) if overlaps else float("nan")
    return {"workload": workload, "policy": policy, "seed": seed, "acc": 100 * acc, "cost": selection.cost(),
            "seconds": seconds, "overhead_s": selection.overhead_s, "steps": trainer.global_step,
            "noisy_share": picked_noisy, "overlap": overlap}


def _run(args: tuple) -> dict:
    return run(*args)


def agent_overhead(batch: int = 64, steps: int = 10) -> dict[str, float]:
    """Seconds per step of a timm ResNet-18 (32×32, 10 classes) SGD step vs the Data Agent's work for the same
    batch (act on the 512-d features, reward, PPO update every 10 steps amortised), one thread."""
    import timm

    from framework.samplers import ScoreTable

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    times, feats = [], []
    for _ in range(steps + 1):
        t = time.perf_counter()
        f = model.forward_head(model.forward_features(x), pre_logits=True)
        logits = model.get_classifier()(f)
        torch.nn.functional.cross_entropy(logits, y).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
        feats.append((f.detach(), logits.detach()))
    policy, table = DataAgentPolicy(seed=0), ScoreTable(10_000)
    agent_times = []
    for i, (f, logits) in enumerate(feats * 2):
        t = time.perf_counter()
        policy.observe({"index": torch.arange(batch) + batch * (i % 100), "features": f, "logits": logits,
                        "targets": y}, table, 0)
        agent_times.append(time.perf_counter() - t)
    step, agent = statistics.median(times[1:]), sum(agent_times[-20:]) / 20  # 20 steps incl. 2 PPO updates
    return {"resnet18_step_s": step, "agent_step_s": agent, "ratio": agent / step}


def summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["policy"]), []).append(r)
    out = []
    for (workload, policy), rs in groups.items():
        accs = [r["acc"] for r in rs]
        out.append({
            "workload": workload, "policy": policy, "n": len(rs), "acc": statistics.mean(accs),
            "sd": statistics.stdev(accs) if len(accs) > 1 else 0.0, "cost": statistics.mean(r["cost"] for r in rs),
            "seconds": statistics.mean(r["seconds"] for r in rs),
            "overhead": statistics.mean(r["overhead_s"] / r["seconds"] for r in rs),
            "noisy": statistics.mean(r["noisy_share"] for r in rs),
            "overlap": statistics.mean(r["overlap"] for r in rs),
        })
    return out


def markdown(summary: list[dict], overhead: dict[str, float] | None) -> str:
    lines = ["| workload | policy | test acc % (mean ± sd) | Δ vs full | cost | wall s | time ratio vs full "
             "| callback share of fit | repeat share of selection | mislabelled share of selection |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    full = {s["workload"]: s for s in summary if s["policy"] == "full"}
    for s in summary:
        ref = full.get(s["workload"])
        delta = f"{s['acc'] - ref['acc']:+.2f}" if ref else "–"
        ratio = f"{s['seconds'] / ref['seconds']:.2f}" if ref else "–"
        noisy = "–" if s["noisy"] != s["noisy"] else f"{s['noisy']:.3f}"
        overlap = "–" if s["overlap"] != s["overlap"] else f"{s['overlap']:.2f}"
        lines.append(f"| {s['workload']} | {s['policy']} | {s['acc']:.2f} ± {s['sd']:.2f} (n={s['n']}) | {delta} "
                     f"| {s['cost']:.3f} | {s['seconds']:.1f} | {ratio} | {100 * s['overhead']:.1f}% | {overlap} "
                     f"| {noisy} |")
    if overhead:
        lines += ["", f"Data Agent work per step next to a timm ResNet-18 SGD step (32×32, batch 64, 1 thread): "
                      f"{1e3 * overhead['agent_step_s']:.1f} ms vs {1e3 * overhead['resnet18_step_s']:.1f} ms "
                      f"= **{100 * overhead['ratio']:.1f}%** of the step."]
    return "\n".join(lines)


def plot(summary: list[dict], png: Path) -> None:
    from matplotlib.figure import Figure

    workloads = sorted({s["workload"] for s in summary})
    fig = Figure(figsize=(5.5 * len(workloads), 4.2))
    for ax, workload in zip(fig.subplots(1, len(workloads), squeeze=False)[0], workloads, strict=True):
        rows = [s for s in summary if s["workload"] == workload]
        for i, s in enumerate(rows):  # a small horizontal offset keeps equal-cost policies apart
            ax.errorbar(s["cost"] + 0.006 * (i - len(rows) / 2), s["acc"], yerr=s["sd"], fmt="o", capsize=3,
                        label=s["policy"])
        ax.set(title=workload, xlabel="cost (sample passes / full data)", ylabel="test accuracy %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(quick: bool = False, seeds: int = 3, out: Path | None = None, workers: int = 2) -> str:
    policies = QUICK_POLICIES if quick else tuple(POLICIES)
    workloads = ("digits",) if quick else tuple(WORKLOADS)
    n_seeds = 1 if quick else seeds
    epochs = 8 if quick else None
    jobs = [(w, p, s, epochs) for w in workloads for s in range(n_seeds) for p in policies]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(_run, jobs))
    summary = summarise(rows)
    overhead = None if quick else agent_overhead()
    table = markdown(summary, overhead)
    out = out or REPO / "docs" / "img"
    if not quick:
        png = out / "selection_compare.png"
        plot(summary, png)
        table += f"\n\nPlot: {png}"
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="digits only, 8 epochs, 1 seed, 4 policies")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="where the PNG goes (default docs/img)")
    args = parser.parse_args()
    started = time.time()
    print(main(args.quick, args.seeds, args.out, args.workers))
    print(f"\n({time.time() - started:.0f} s)")
