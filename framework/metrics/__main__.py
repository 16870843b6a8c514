"""`python -m framework.metrics REAL GEN [--k 5] [--correction none] [--threads N] [--plot FIG.png]`: P/R/D/C as JSON.

REAL (the reference) and GEN (the generated samples) are each a 2-D (points, dims) `.npy` array of features
(`np.save`; nothing is unpickled); images (a folder, searched recursively, or a Hub image dataset) turned into
features by a timm model (`--feature NAME` or `hf-hub:ORG/NAME`; default DINOv2 ViT-L/14, as dgm-eval), cached by
content; or texts (a `.txt` file, one per line; `.jsonl` and the other files, folders and Hub datasets `data=text`
reads: their `--column`) embedded by `--feature MODEL` (a transformers model folder or Hub id: `HFFeatures`' pooled
hidden states). The JSON holds the raw metrics, the hubness of the reals, and names each role; with `--correction`
other than none, also the corrected metrics and the reals' hubness after the correction (ICDM runs only then). Each
quantity has one name: `hubness` holds `real_k_occurrence_skewness` (raw) and, only when a correction ran,
`real_k_occurrence_skewness_corrected` beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from framework.devices import usable_cpus
from framework.errors import InputError, run_cli
from framework.metrics import inputs
from framework.metrics.functional import CORRECTIONS, NEIGHBOURS, SKEWNESS, SKEWNESS_CORRECTED, check_correction, prdc

METRICS = ("precision", "recall", "density", "coverage")
#: what only a correction computes: reported once, in the JSON's `corrected`
_CORRECTION_ONLY = ("icdm_", "delta_real_", "filtered")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.metrics", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("real", help="the real (reference) side: .npy features (N, D), a folder of images, a Hub image dataset, texts")
    add("fake", metavar="gen", help="the generated side: .npy features, a folder of images, a Hub dataset, texts")
    add("--k", type=int, default=5, help="neighbourhood size (prdc: 5, Kynkäänniemi: 3)")
    add("--correction", default="none",
        help=f"one of {', '.join(CORRECTIONS)}: the top-level figures (default none = prdc, and no correction is "
             "computed); otherwise 'raw' and 'corrected' in the JSON hold both; icdm: real factors only; "
             "gicdm_reconstructed: our reconstruction of GICDM, over-corrects, see docs/gicdm.md")
    add("--neighbours", default="exact", help=f"ICDM neighbours, one of {', '.join(NEIGHBOURS)}")
    add("--le", action="store_true", help="ball test with <= (Kynkäänniemi) instead of < (prdc)")
    add("--block-size", type=int, default=None, help="tile edge in points (default 1024)")
    add("--feature", default=None, help="images: a timm model name or hf-hub:ORG/NAME (default "
        "vit_large_patch14_dinov2.lvd142m); texts: a transformers model folder or Hub id")
    add("--threads", type=int, default=None, metavar="N",
        help=f"torch threads for the feature extraction and the metrics (default: the CPUs this process may use, "
             f"{usable_cpus()} here, minus the decoding --workers when a side is images; at least 1)")
    add("--plot", type=Path, default=None, help="write a figure (P/R/D/C raw, and corrected with --correction; a "
        "PCA of both sides; the reals' k-occurrence) to this .png")
    images = parser.add_argument_group("images")
    images.add_argument("--bf16", action="store_true", help="extract in bfloat16 autocast")
    images.add_argument("--batch-size", type=int, default=64, help="images per forward (default 64)")
    images.add_argument("--workers", type=int, default=None,
                        help="decoding processes (default: the CPUs this process may use - 1, at least 1, at most 8)")
    images.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is a GPU)")
    images.add_argument("--cache-dir", default=None, help="features cache (default $FRAMEWORK_DATA_CACHE/features, "
                        "else ~/.cache/framework/features)")
    images.add_argument("--no-cache", action="store_true", help="neither read nor write the features cache")
    images.add_argument("--strict", action="store_true", help="refuse a file that is not an image or is truncated "
                        "(default: skipped and counted)")
    images.add_argument("--image-column", default="image", help="the image column of a Hub dataset (default image)")
    texts = parser.add_argument_group("texts")
    texts.add_argument("--layer", type=int, default=-1, help="the hidden state to pool (default -1: the last)")
    texts.add_argument("--pool", default="mean", help="mean (over real tokens), last (a causal LM's) or first")
    texts.add_argument("--column", default="text", help="the text column of a .jsonl/.csv/... (default text)")
    texts.add_argument("--max-length", type=int, default=512, help="tokens per text, the rest cut (default 512)")
    add("--split", default="train", help="the split of a folder or Hub dataset side (default train)")
    args = parser.parse_args(argv)
    return run_cli(lambda: _evaluate(args))


def _evaluate(args: argparse.Namespace) -> None:
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads={args.threads}: give a number of torch threads >= 1 (default: the CPUs this "
                         "process may use minus the decoding --workers, at least 1)")
    check_correction(args.correction)  # before any feature is computed
    if args.plot is not None and args.plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise InputError(f"--plot {args.plot}: give a .png, .pdf or .svg file")
    plans = [inputs.plan_side(p, args.feature, args.column, args.split, args.image_column, args.strict)
             for p in (args.real, args.fake)]
    inputs.check_plans(*plans, args.feature)
    extract, feature = _extractor(args, plans)
    threads = args.threads or default_threads(extract.workers if extract is not None else 0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = _measure(args, plans, extract, feature)
    finally:
        torch.set_num_threads(before)  # `main` may run inside a caller's process (tests, notebooks)
    print(json.dumps(out, indent=2))


def default_threads(workers: int) -> int:
    """torch threads that do not oversubscribe: the CPUs this process may use minus the decoding workers, >= 1."""
    return max(1, usable_cpus() - workers)


def _measure(args: argparse.Namespace, plans: list[inputs.Plan], extract: Any, feature: dict[str, Any] | None
             ) -> dict[str, Any]:
    """Features of both sides (read, embedded or extracted), their scores, the figure: the JSON's content."""
    (real, new_real), (fake, new_fake) = (inputs.realise(plan, _embedder(args), extract, role)
                                          for plan, role in zip(plans, ("real", "generated"), strict=True))
    if real.features.shape[1:] != fake.features.shape[1:]:
        raise InputError(f"the real features ({real.path}) have shape {real.features.shape} but the generated ones "
                         f"({fake.path}) {fake.features.shape}: both sides must come from the same extractor")
    out = _scores(real.features, fake.features, args)
    out.update(roles={"real": args.real, "generated": args.fake,
                      "reads": "precision: share of generated points inside the reals' k-NN balls; recall: share "
                               "of real points inside the generated points' balls"},
               n_real=int(real.features.shape[0]), n_fake=int(fake.features.shape[0]),
               dim=int(real.features.shape[1]), real=real.describe(), fake=fake.describe())
    if feature:
        out["feature"] = feature
    for got in (new_real, new_fake):  # the cache is written only now that everything succeeded
        if got is not None and got.cache == "new":
            extract.cache.store(got.cache_file, got)
    if args.plot is not None:
        plot(real.features, fake.features, out, args.plot)
        out["plot"] = str(args.plot)
    return out


def _scores(real: np.ndarray, fake: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    """The top-level figures (as `--correction` asks), `raw` and the reals' hubness; with a correction, also
    `corrected` and the hubness after it. `--correction none` runs no correction at all. The skewness is only in
    `hubness`, raw and corrected side by side; the ICDM diagnostics only in `corrected`."""
    options = {"strict": not args.le, "neighbours": args.neighbours, "block_size": args.block_size}
    raw = prdc(real, fake, args.k, "none", **options)
    corrected = None if args.correction == "none" else prdc(real, fake, args.k, args.correction, **options)
    chosen = raw if corrected is None else corrected
    out = {k: v for k, v in chosen.items() if k not in (SKEWNESS, SKEWNESS_CORRECTED) and not k.startswith(
        _CORRECTION_ONLY)}
    out["raw"] = {m: raw[m] for m in METRICS}
    out["hubness"] = {SKEWNESS: raw[SKEWNESS]}
    if corrected is not None:
        out["corrected"] = {"correction": args.correction, **{m: corrected[m] for m in METRICS},
                            **{k: v for k, v in corrected.items() if k.startswith(_CORRECTION_ONLY)}}
        out["hubness"].update({SKEWNESS_CORRECTED: corrected[SKEWNESS_CORRECTED], "corrected_by": args.correction})
    return out


def _extractor(args: argparse.Namespace, plans: list[inputs.Plan]) -> tuple[Any, dict[str, Any] | None]:
    """(extract(images, desc) with its `.cache`, the JSON's `feature`) for image sides; texts: (None, theirs)."""
    if not any(p.kind == inputs.IMAGES for p in plans):
        feature = {"model": args.feature, "layer": args.layer, "pool": args.pool} if args.feature else None
        return None, feature
    from framework.metrics import image_features as F

    resolved = F.resolve(args.feature)
    if resolved.default:
        print(f"feature extractor: {resolved.name} (the default: {F.DEFAULT_NOTE}; --feature names another)",
              file=sys.stderr)
    model = F.ImageFeatures(resolved, device=args.device, bf16=args.bf16, batch_size=args.batch_size,
                            workers=args.workers)
    cache = None if args.no_cache else F.FeatureCache(args.cache_dir)

    def extract(images: F.ImageSet, desc: str = "") -> F.Extracted:
        return F.features(model, images, cache, strict=args.strict, desc=desc)

    extract.cache, extract.workers = cache, model.workers
    return extract, {**resolved.describe(), "bf16": args.bf16, "device": str(model.device),
                     "pool": "timm num_classes=0 (the model's pooled features)"}


def _embedder(args: argparse.Namespace) -> Callable[[list[str]], np.ndarray] | None:
    """texts -> features with `--feature`'s model, loaded on first use (None without --feature)."""
    if not args.feature:
        return None
    loaded: list = []

    def embed(texts: list[str]) -> np.ndarray:
        if not loaded:
            from framework.models.hf_features import HFFeatures

            try:
                loaded.append(HFFeatures(args.feature, layer=args.layer, pool=args.pool))
            except ValueError as err:
                raise InputError(f"--feature {args.feature}: {err}") from None
        return loaded[0].embed_texts(texts, max_length=args.max_length).numpy()

    return embed


def plot(real: np.ndarray, fake: np.ndarray, out: dict[str, Any], path: Path) -> Path:
    """The figure to look at: P/R/D/C raw vs corrected, both sides on the reals' first two principal axes, and how
    often each real is among the others' k nearest (hubness: a long tail means a few reals sit in most balls)."""
    import torch
    from matplotlib.figure import Figure

    from framework.metrics.icdm import k_occurrence
    from framework.metrics.knn import knn
    from framework.metrics.screening import prepare

    fig = Figure(figsize=(14, 4))
    bars, scatter, hist = fig.subplots(1, 3)
    where = np.arange(len(METRICS))
    corrected = out.get("corrected")
    shift, width = (0.2, 0.4) if corrected else (0.0, 0.6)
    bars.bar(where - shift, [out["raw"][m] for m in METRICS], width, label="raw")
    if corrected:
        bars.bar(where + shift, [corrected[m] for m in METRICS], width, label=corrected["correction"])
    bars.set(xticks=where, xticklabels=METRICS, title=f"generated vs real, k = {out['k']}")
    bars.legend(fontsize=8)
    center = real.mean(0, dtype=np.float64)
    axes = np.linalg.svd((real[:5000] - center).astype(np.float64), full_matrices=False)[2][:2].T
    for name, x in (("real", real), ("generated", fake)):
        shown = x[np.random.default_rng(0).permutation(len(x))[:3000]]
        xy = (shown - center) @ axes
        scatter.scatter(xy[:, 0], xy[:, 1], s=4, alpha=0.5, label=f"{name} ({len(x)})")
    scatter.set(title="PCA of the reals (both sides projected)", xticks=[], yticks=[])
    scatter.legend(fontsize=8)
    x = prepare(torch.as_tensor(real), torch.as_tensor(center))
    counts = k_occurrence(knn(x, x, out["k"], self_index=torch.arange(len(real))).index, len(real)).numpy()
    hist.hist(counts, bins=min(50, int(counts.max()) + 1))
    hubness = out["hubness"]
    title = f"hubness: skewness {hubness[SKEWNESS]:.2f} raw"
    if corrected:
        title += f", {hubness[SKEWNESS_CORRECTED]:.2f} {hubness['corrected_by']}"
    hist.set(xlabel=f"N_k: times a real is among the others' {out['k']} nearest", ylabel="reals", yscale="log",
             title=title)
    fig.suptitle(f"real: {out['roles']['real']}   generated: {out['roles']['generated']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
