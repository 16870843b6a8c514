"""Data-selection policies side by side: test accuracy (mean ± sd over seeds), cost actually spent (sample passes
relative to full data), wall time, the selection callback's share of the fit, how much of each selection repeats
the previous epoch's and how much of it is mislabelled; on sklearn digits (MLP), a synthetic 10-class problem with
20% label noise (MLP), and digits upsampled to 16×16 through timm's `test_resnet` with 20% and 40% label noise.
On the noisy synthetic set it also runs issue 18's ablation (each candidate change alone on the faithful agent), on
the MLP workloads issue 28's (the steps from the per-step agent to `data_agent_amortised`, each on top of the one
before), and a longer noisy workload (40% label noise, 40 epochs) where full data has time to memorise the noise.
Plus the Data Agent's per-step work next to a timm ResNet-18 step, and the amortised variant's.

    python tools/bench/selection.py [--quick] [--seeds 5] [--policies ...] [--workloads ...] [--out DIR]

Every policy runs through the same `DataSelection` callback and Lightning loop (full data included), with the
same model, optimizer (SGD-Nesterov, cosine schedule of the planned length; on the CNN workloads the gradient norm
clipped at 5) and seeds.
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
    AmortisedAgentPolicy,
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
    # the registered variant: the faithful agent plus the one change that unfroze its selection (issue 18)
    "data_agent_staleness": functools.partial(DataAgentPolicy, ratio=0.5, staleness=0.5),
    # issue 18's other candidate changes, each alone on top of the faithful agent (the ablation)
    "data_agent_centred": functools.partial(DataAgentPolicy, ratio=0.5, centred=True),
    "data_agent_gumbel": functools.partial(DataAgentPolicy, ratio=0.5, temperature=1.0),
    # issue 28's variant: the agent acts once per epoch and learns every few epochs (framework/samplers/amortised.py),
    # and the changes that led to it, each on top of the one before (the cost ablation, run on the MLP workloads)
    "data_agent_amortised": functools.partial(AmortisedAgentPolicy, ratio=0.5),
    "amortised_schedule": functools.partial(AmortisedAgentPolicy, ratio=0.5, update_size=None, hidden=128,
                                            k_epochs=4, fused=False, learn_every=1),
    "amortised_subsample": functools.partial(AmortisedAgentPolicy, ratio=0.5, update_size=256, hidden=128,
                                             k_epochs=4, fused=False, learn_every=1),
    "amortised_narrow": functools.partial(AmortisedAgentPolicy, ratio=0.5, update_size=256, hidden=32,
                                          k_epochs=4, fused=False, learn_every=1),
    "amortised_lean_update": functools.partial(AmortisedAgentPolicy, ratio=0.5, learn_every=1, update_size=128),
    "amortised_every4": functools.partial(AmortisedAgentPolicy, ratio=0.5, learn_every=4, update_size=128),
}
DEFAULT_POLICIES = ("full", "random", "infobatch", "data_agent", "data_agent_staleness", "data_agent_amortised")
ABLATION = ("data_agent_centred", "data_agent_gumbel")  # run on the noisy workload only
AMORTISED_ABLATION = ("amortised_schedule", "amortised_subsample", "amortised_narrow", "amortised_lean_update",
                      "amortised_every4")
QUICK_POLICIES = DEFAULT_POLICIES
WORKLOADS = {  # data factory kwargs, epochs, lr, model, gradient-norm clip (None: none)
    "digits": (dict(kind="digits", batch_size=64), 30, 0.05, "mlp", None),
    "synth_noisy": (dict(kind="synth", n_samples=6_000, label_noise=0.2, batch_size=128), 20, 0.05, "mlp", None),
    # the harder workload: digits upsampled to 16×16 through timm's smallest ResNet, 20% / 40% label noise. lr 0.02:
    # at 0.05 full data trained stably but every pruned arm, random included, diverged on some seeds (sd 22-39
    # points): their 1/ρ = 2 sample weights double the gradient, an effective lr of 0.1 (docs/data_agent.md). At
    # 0.02 a pruned arm still diverged on 1 or 2 seeds in 10 (random, frozen and learned agents alike: 31-74%),
    # so every policy, full data included, clips the gradient norm at 5, which only a spike reaches (at 1.0 every
    # arm trained slower: full 93.98 vs 96.10 over 10 seeds; a side check, not committed)
    "digits_cnn_noise20": (dict(kind="upsampled", size=16, label_noise=0.2, batch_size=64), 15, 0.02, "test_resnet",
                           5.0),
    "digits_cnn_noise40": (dict(kind="upsampled", size=16, label_noise=0.4, batch_size=64), 15, 0.02, "test_resnet",
                           5.0),
    # the longer budget where selection should matter: 40 epochs, time for full data to memorise the 40% noise
    "digits_cnn_noise40_long": (dict(kind="upsampled", size=16, label_noise=0.4, batch_size=64), 40, 0.02,
                                "test_resnet", 5.0),
}


def make_data(kind: str, seed: int, **kw):
    from framework.data.digits import DigitsData, SyntheticClasses
    from framework.data.digits_upsampled import UpsampledDigits

    return {"digits": DigitsData, "synth": SyntheticClasses, "upsampled": UpsampledDigits}[kind](seed=seed, **kw)


def make_model(name: str):
    """A model factory taking (num_classes, input_shape): the benchmark's MLP, or a timm model built from scratch."""
    if name == "mlp":
        from framework.models.convnet import MLP

        return functools.partial(MLP, hidden=256, depth=2)

    def timm_model(num_classes: int, input_shape: list[int]):
        import timm
        from timm.layers import GroupNorm1

        # GroupNorm: a pruned epoch (InfoBatch's above all) can end on a batch of one, which BatchNorm refuses
        return timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=input_shape[0],
                                 norm_layer=GroupNorm1)

    return timm_model


def run(workload: str, policy: str, seed: int, epochs: int | None = None) -> dict:
    """One training run; returns test accuracy, cost, wall time and the callback's own time."""
    import lightning as L

    from framework.callbacks.selection import DataSelection
    from framework.modules.classifier import Classifier
    from framework.optim.schedulers import warmup_cosine

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no per-run banners in the report
    warnings.filterwarnings("ignore")
    data_kw, default_epochs, lr, model, clip = WORKLOADS[workload]
    L.seed_everything(seed, verbose=False)
    data = make_data(seed=seed, **data_kw)
    module = Classifier(
        make_model(model), num_classes=data.num_classes, input_shape=data.input_shape,
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
                        gradient_clip_val=clip,
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
            "agent_s": getattr(selection.policy, "agent_s", 0.0),
            "noisy_share": picked_noisy, "overlap": overlap}


def _run(args: tuple) -> dict:
    return run(*args)


def _sgd_steps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> tuple[list[float], list]:
    """Time `steps` SGD steps of a timm-style classifier (`forward_features`, `forward_head`, `get_classifier`) on
    one batch, one thread; returns each step's seconds and its (penultimate features, logits), as the agent sees."""
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times, feats = [], []
    for _ in range(steps):
        t = time.perf_counter()
        f = model.forward_head(model.forward_features(x), pre_logits=True)
        logits = model.get_classifier()(f)
        torch.nn.functional.cross_entropy(logits, y).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
        feats.append((f.detach(), logits.detach()))
    return times, feats


def _observe_seconds(feats: list, y: torch.Tensor, last: int, learn: bool = True) -> float:
    """Mean seconds of the Data Agent's `observe` (act, reward, and with `learn` its PPO update every 10 steps) over
    the last `last` of the steps `feats`."""
    from framework.samplers import ScoreTable

    batch = y.shape[0]
    policy, table = DataAgentPolicy(seed=0, learn=learn), ScoreTable(batch * len(feats))
    took = []
    for i, (f, logits) in enumerate(feats):
        t = time.perf_counter()
        policy.observe({"index": torch.arange(batch) + batch * i, "features": f, "logits": logits, "targets": y},
                       table, 0)
        took.append(time.perf_counter() - t)
    return sum(took[-last:]) / last


def _amortised_seconds(feats: list, y: torch.Tensor, steps_per_epoch: int, epochs: int = 8) -> float:
    """Mean seconds per step of `data_agent_amortised` (each step reduced to a few numbers per sample, actions drawn
    once per epoch, one PPO update every `learn_every` = 8 epochs) over `epochs` epochs of `steps_per_epoch` steps
    cycling `feats`."""
    from framework.samplers import ScoreTable

    batch = y.shape[0]
    policy, table = AmortisedAgentPolicy(seed=0), ScoreTable(batch * steps_per_epoch)
    start = time.perf_counter()
    for epoch in range(epochs):
        for i in range(steps_per_epoch):
            f, logits = feats[i % len(feats)]
            policy.observe({"index": torch.arange(batch) + batch * i, "features": f, "logits": logits, "targets": y},
                           table, epoch)
        policy.end_epoch(epoch, 100)
    return (time.perf_counter() - start) / (epochs * steps_per_epoch)


def agent_overhead(batch: int = 64, steps: int = 10) -> dict[str, float]:
    """Seconds per step of a timm ResNet-18 (32×32, 10 classes) SGD step vs the Data Agent's work for the same
    batch (act on the 512-d features, reward, PPO update every 10 steps amortised), one thread."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    times, feats = _sgd_steps(model, x, y, steps + 1)
    step, agent = statistics.median(times[1:]), _observe_seconds(feats * 2, y, 20)  # 20 steps incl. 2 PPO updates
    amortised = _amortised_seconds(feats, y, steps_per_epoch=100)  # a short epoch (6400 samples) costs the most
    return {"resnet18_step_s": step, "agent_step_s": agent, "ratio": agent / step, "amortised_step_s": amortised,
            "amortised_ratio": amortised / step}


def agent_vs_mlp(batch: int = 64, steps: int = 200) -> dict[str, float]:
    """Seconds per step (median) of the bench's MLP (64→256→256→10) SGD step in plain torch, and of the Data Agent's
    work for the same batch: acting alone (score + reward, `learn=False`) and acting plus learning (PPO every 10
    steps, amortised), one thread. Why the callback's share on the MLP workloads cannot reach 15% by bookkeeping."""
    from framework.models.convnet import MLP

    torch.manual_seed(0)
    model = MLP(num_classes=10, input_shape=[64], hidden=256, depth=2)
    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    times, feats = _sgd_steps(model, x, y, steps)
    return {"mlp_step_s": statistics.median(times[10:]),  # 100 steps each: 10 PPO updates when learning
            "act_s": _observe_seconds(feats, y, 100, learn=False), "act_learn_s": _observe_seconds(feats, y, 100),
            "amortised_s": _amortised_seconds(feats, y, steps_per_epoch=10, epochs=8)}  # digits: 10 steps an epoch


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
            "agent": statistics.mean(r["agent_s"] / r["seconds"] for r in rs),
            "noisy": statistics.mean(r["noisy_share"] for r in rs),
            "overlap": statistics.mean(r["overlap"] for r in rs),
        })
    return out


def markdown(summary: list[dict], overhead: dict[str, float] | None, mlp: dict[str, float] | None = None) -> str:
    lines = ["| workload | policy | test acc % (mean ± sd) | Δ vs full | cost | wall s | time ratio vs full "
             "| callback share of fit | of which the agent | bookkeeping share | repeat share of selection "
             "| mislabelled share of selection |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    full = {s["workload"]: s for s in summary if s["policy"] == "full"}
    for s in summary:
        ref = full.get(s["workload"])
        delta = f"{s['acc'] - ref['acc']:+.2f}" if ref else "–"
        ratio = f"{s['seconds'] / ref['seconds']:.2f}" if ref else "–"
        noisy = "–" if s["noisy"] != s["noisy"] else f"{s['noisy']:.3f}"
        overlap = "–" if s["overlap"] != s["overlap"] else f"{s['overlap']:.2f}"
        agent = f"{100 * s['agent']:.1f}%" if s["agent"] else "–"
        lines.append(f"| {s['workload']} | {s['policy']} | {s['acc']:.2f} ± {s['sd']:.2f} (n={s['n']}) | {delta} "
                     f"| {s['cost']:.3f} | {s['seconds']:.1f} | {ratio} | {100 * s['overhead']:.1f}% | {agent} "
                     f"| {100 * (s['overhead'] - s['agent']):.1f}% | {overlap} | {noisy} |")
    if overhead:
        lines += ["", f"Data Agent work per step next to a timm ResNet-18 SGD step (32×32, batch 64, 1 thread): "
                      f"{1e3 * overhead['agent_step_s']:.1f} ms vs {1e3 * overhead['resnet18_step_s']:.1f} ms "
                      f"= **{100 * overhead['ratio']:.1f}%** of the step; `data_agent_amortised` (an epoch of 100 "
                      f"steps, scored once, learning every 8th epoch) {1e3 * overhead['amortised_step_s']:.2f} ms per "
                      f"step = **{100 * overhead['amortised_ratio']:.2f}%**."]
    if mlp:
        lines += ["", f"The agent next to the MLP workloads' model (64→256→256→10 SGD step in plain torch, batch 64, 1 "
                      f"thread): the step {1e3 * mlp['mlp_step_s']:.2f} ms; the agent acting alone "
                      f"{1e3 * mlp['act_s']:.2f} ms ({mlp['act_s'] / mlp['mlp_step_s']:.2f}× the step), acting and "
                      f"learning {1e3 * mlp['act_learn_s']:.2f} ms ({mlp['act_learn_s'] / mlp['mlp_step_s']:.2f}×); "
                      f"`data_agent_amortised` (epochs of 10 steps) {1e3 * mlp['amortised_s']:.2f} ms per step "
                      f"({mlp['amortised_s'] / mlp['mlp_step_s']:.2f}×)."]
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


def main(quick: bool = False, seeds: int = 5, out: Path | None = None, workers: int = 2,
         policies: tuple[str, ...] | None = None, workloads: tuple[str, ...] | None = None) -> str:
    for name, valid in ((policies, POLICIES), (workloads, WORKLOADS)):
        unknown = sorted(set(name or ()) - set(valid))
        if unknown:
            raise SystemExit(f"error: unknown {unknown}; valid: {sorted(valid)}")
    policies = policies or (QUICK_POLICIES if quick else DEFAULT_POLICIES)
    workloads = workloads or (("digits",) if quick else tuple(WORKLOADS))
    n_seeds = 1 if quick else seeds
    epochs = 8 if quick else None
    jobs = [(w, p, s, epochs) for w in workloads for s in range(n_seeds) for p in policies]
    if not quick and "synth_noisy" in workloads and policies == DEFAULT_POLICIES:
        jobs += [("synth_noisy", p, s, None) for s in range(n_seeds) for p in ABLATION]
    if not quick and policies == DEFAULT_POLICIES:  # the amortised variant's cost ablation, where the cost is
        jobs += [(w, p, s, None) for w in ("digits", "synth_noisy") if w in workloads for s in range(n_seeds)
                 for p in AMORTISED_ABLATION]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(_run, jobs))
    order = {name: i for i, name in enumerate([*WORKLOADS, *POLICIES])}
    summary = sorted(summarise(rows), key=lambda s: (order[s["workload"]], order[s["policy"]]))
    overhead = None if quick else agent_overhead()
    table = markdown(summary, overhead, None if quick else agent_vs_mlp())
    out = out or REPO / "docs" / "img"
    if not quick:
        png = out / "selection_compare.png"
        plot(summary, png)
        table += f"\n\nPlot: {png.relative_to(REPO) if png.is_relative_to(REPO) else png}"
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="digits only, 8 epochs, 1 seed")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--policies", nargs="*", default=None, help=f"default: {' '.join(DEFAULT_POLICIES)} "
                        f"(+ the ablation {' '.join(ABLATION)} on synth_noisy)")
    parser.add_argument("--workloads", nargs="*", default=None, help=f"default: all of {' '.join(WORKLOADS)}")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="where the PNG goes (default docs/img)")
    args = parser.parse_args()
    started = time.time()
    print(main(args.quick, args.seeds, args.out, args.workers,
               tuple(args.policies) if args.policies else None, tuple(args.workloads) if args.workloads else None))
    print(f"\n({time.time() - started:.0f} s)")
