"""GICDM between two folders of images (issue 45, item 4): `python -m framework.metrics REAL GEN` side by side with
the `prdc` package and torch-fidelity on the same features, and our extraction against a plain loop, one thread.

Two folders of PNG files are written first: the reals are scikit-learn's digits upsampled to 128x128, the
generated side noisy copies of other digits (Gaussian noise). The extractor is a timm architecture at its random
initialisation (seed 0) pushed to a local Hub and named `hf-hub:...`, as a user names theirs: no pretrained weights
can be downloaded here, and every comparison below holds for any weights.
(a) The CLI in a fresh process, twice: raw and corrected figures, then `--k 3 --le` (the second call reuses the
    features cache, and says so).
(b) Same answers on the features the CLI cached: our raw P/R/D/C (k = 5) against `prdc.compute_prdc`; our P/R at
    k = 3 with the `<=` ball test against torch-fidelity's `prc_features_to_metric` (its input1 is the generated
    side, input2 the real one: the roles are checked by swapping them). Goal: |diff| <= 1e-6.
(c) Extraction throughput, one thread (torch.set_num_threads(1), decoding in the main process for both): ours
    (list the folder, digest every file for the cache key, decode in a DataLoader, forward, write the cache; a cold
    cache each round) against a plain loop (a torch DataLoader over PIL decoding and the model's own eval transform,
    then the timm model's forward) on the same folder and the same model; the median of interleaved rounds.
    Goal: >= 0.95x.

    python tools/bench/gicdm_folders.py [--quick] [--images 600] [--rounds 3] [--arch vit_tiny_patch16_224]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from framework.local_hub import LocalHub, patch_client  # noqa: E402
from framework.metrics import image_features as F  # noqa: E402

METRICS = ("precision", "recall", "density", "coverage")
REPO_ID = "bench/extractor"
BATCH = 64


def make_folders(root: Path, n: int, noise: float) -> tuple[Path, Path]:
    """`real/`: digits 0..n-1 as 128x128 RGB PNGs (a subfolder per class); `generated/`: digits n..2n-1 + noise."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    for side, first, sigma in (("real", 0, 0.0), ("generated", n, noise)):
        for i in range(first, first + n):
            small = Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8))
            pixels = np.asarray(small.resize((128, 128), Image.BICUBIC), dtype=np.float64)
            pixels = np.clip(pixels + rng.normal(0, sigma, pixels.shape), 0, 255).astype(np.uint8)
            where = root / side / str(digits.target[i]) / f"{i:05d}.png"
            where.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).convert("RGB").save(where)
    return root / "real", root / "generated"


def push_extractor(arch: str) -> None:
    """`arch` at timm's random initialisation (seed 0), pushed in timm's format to the Hub the client points at."""
    import timm
    from timm.models import push_to_hf_hub

    torch.manual_seed(0)
    push_to_hf_hub(timm.create_model(arch, pretrained=False, num_classes=0), REPO_ID, safe_serialization=True)


def cli(args: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """`python -m framework.metrics ARGS` in a fresh process: its JSON and its wall seconds."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "framework.metrics", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"python -m framework.metrics failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout), time.perf_counter() - start


def same_answers(real: np.ndarray, gen: np.ndarray, k5: dict[str, Any], k3: dict[str, Any]) -> bool:
    """(b): print the comparisons with prdc and torch-fidelity; True when every one is within 1e-6."""
    import prdc as prdc_package
    from torch_fidelity.metric_prc import prc_features_to_metric

    with contextlib.redirect_stdout(io.StringIO()):  # it prints the set sizes
        theirs = prdc_package.compute_prdc(real_features=real, fake_features=gen, nearest_k=5)
    kw = {"prc_neighborhood": 3, "prc_batch_size": 10000, "save_cpu_ram": False, "verbose": False}
    real64, gen64 = torch.from_numpy(real.astype(np.float64)), torch.from_numpy(gen.astype(np.float64))
    fid = prc_features_to_metric(gen64, real64, **kw)  # input1 = generated, input2 = real
    swapped = prc_features_to_metric(real64, gen64, **kw)
    rows = [("raw P/R/D/C, k = 5, `<` (ours: the CLI's `raw`) vs prdc.compute_prdc",
             [k5["raw"][m] for m in METRICS], [float(theirs[m]) for m in METRICS]),
            ("P/R, k = 3, `<=` (ours: --k 3 --le) vs torch-fidelity prc (input1 = GEN, input2 = REAL)",
             [k3["precision"], k3["recall"]], [fid["precision"], fid["recall"]]),
            ("roles: torch-fidelity with input1 = REAL gives (our R, our P)",
             [k3["recall"], k3["precision"]], [swapped["precision"], swapped["recall"]])]
    print("| comparison (same features) | ours | theirs | max abs diff | goal |\n|---|---|---|---|---|")
    worst = 0.0
    for name, ours, other in rows:
        diff = max(abs(a - b) for a, b in zip(ours, other, strict=True))
        worst = max(worst, diff)
        print(f"| {name} | {' / '.join(f'{v:.4f}' for v in ours)} | {' / '.join(f'{v:.4f}' for v in other)} | "
              f"{diff:.1e} | <= 1e-6 |")
    distinct = abs(k3["precision"] - k3["recall"]) > 0
    print(f"\nroles check discriminates: our P != our R at k = 3 ({k3['precision']:.4f} vs {k3['recall']:.4f}), so "
          f"swapping torch-fidelity's inputs changes its answer: {distinct}")
    return worst <= 1e-6 and distinct


def plain_loop(root: Path, model: torch.nn.Module, transform: Any) -> np.ndarray:
    """The peer: sorted files, a DataLoader over PIL decoding + the model's eval transform, then the forward."""
    from PIL import Image

    files = sorted(p for p in root.rglob("*.png"))

    class Files(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> torch.Tensor:
            with Image.open(files[i]) as img:
                return transform(img.convert("RGB"))

    out = []
    with torch.inference_mode():
        for x in torch.utils.data.DataLoader(Files(), batch_size=BATCH, num_workers=0):
            out.append(model(x).numpy())
    return np.concatenate(out)


def ours(root: Path, extractor: F.ImageFeatures, cache_dir: Path) -> np.ndarray:
    """Our path with a cold cache: list + digest, extract, write the cache."""
    cache = F.FeatureCache(cache_dir)
    got = F.features(extractor, F.folder_images(root), cache)
    cache.store(got.cache_file, got)
    return got.features


def throughput(root: Path, rounds: int, n: int, tmp: Path) -> bool:
    """(c): print images/s of both paths (median of interleaved rounds); True when ours >= 0.95x the plain loop."""
    extractor = F.ImageFeatures(F.resolve(f"hf-hub:{REPO_ID}"), device="cpu", batch_size=BATCH, workers=0,
                                progress=False)
    model, transform, _ = extractor.model()  # the same model object for both: built once, outside the clock
    times: dict[str, list[float]] = {"plain": [], "ours": []}
    feats: dict[str, np.ndarray] = {}
    ours(root, extractor, tmp / "warm")
    for r in range(rounds):
        for name in (("plain", "ours") if r % 2 == 0 else ("ours", "plain")):
            start = time.perf_counter()
            feats[name] = plain_loop(root, model, transform) if name == "plain" else \
                ours(root, extractor, tmp / f"cache{r}")
            times[name].append(time.perf_counter() - start)
    speed = {k: n / statistics.median(v) for k, v in times.items()}
    ratio = speed["ours"] / speed["plain"]
    print(f"| path (one thread, batch {BATCH}, {n} PNGs 128x128) | images/s (median of {rounds}) | x plain | goal |"
          "\n|---|---|---|---|")
    print(f"| plain loop: DataLoader(PIL decode + eval transform) + forward | {speed['plain']:.1f} | 1.000 | |")
    print(f"| ours: list + digest + DataLoader decode + forward + cache write | {speed['ours']:.1f} | {ratio:.3f} | "
          ">= 0.95 |")
    diff = float(np.abs(feats["ours"] - feats["plain"]).max())
    print(f"\nthe two paths' features: max abs diff {diff:.1e} (same files, same order, same model)")
    return ratio >= 0.95 and diff <= 1e-5


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="150 images a side, 2 rounds")
    ap.add_argument("--images", type=int, default=600, help="images per side (at most 898: digits has 1797)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", default="vit_tiny_patch16_224", help="the timm architecture of the extractor")
    ap.add_argument("--noise", type=float, default=24.0, help="the generated side's noise (pixel std)")
    args = ap.parse_args(argv)
    n, rounds = (150, 2) if args.quick else (args.images, args.rounds)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        real, gen = make_folders(tmp / "images", n, args.noise)
        server = LocalHub(tmp / "hub" / "repos").start()
        try:
            with patch_client(server.url, tmp / "hub" / "cache", token="dummy"):
                push_extractor(args.arch)
                ok = run(real, gen, tmp, n, rounds, args)
        finally:
            server.stop()
            shutil.rmtree(tmp / "images", ignore_errors=True)
    return 0 if ok else 1


def run(real: Path, gen: Path, tmp: Path, n: int, rounds: int, args: argparse.Namespace) -> bool:
    """(a), (b), (c) with the extractor pushed and the client pointed at the local Hub."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "0"}
    common = [str(real), str(gen), "--feature", f"hf-hub:{REPO_ID}", "--cache-dir", str(tmp / "cli-cache")]
    figure = REPO / "runs" / "bench" / "gicdm_folders.png"
    k5, first = cli([*common, "--correction", "icdm", "--plot", str(figure)], env)
    k3, second = cli([*common, "--k", "3", "--le"], env)
    feature = k5["feature"]
    print(f"real: {real.name}/ {n} PNG files (scikit-learn digits, 128x128, a folder per class); generated: "
          f"{gen.name}/ {n} PNGs (other digits + Gaussian noise, std {args.noise:g})")
    print(f"extractor: {feature['name']} = timm {args.arch} at its random init (seed 0), revision "
          f"{feature['revision'][:12]}, {k5['dim']}-dim pooled features, on {feature['device']}")
    print(f"\n(a) the CLI in a fresh process: {first:.1f} s (features: real {k5['real']['features_cache']}, generated "
          f"{k5['fake']['features_cache']}); again with --k 3 --le: {second:.1f} s (real "
          f"{k3['real']['features_cache']}, generated {k3['fake']['features_cache']})\n")
    print("| k = 5 | precision | recall | density | coverage | real S_Nk |\n|---|---|---|---|---|---|")
    hub = k5["hubness"]
    for label, figures, skew in (("raw", k5["raw"], hub["real_k_occurrence_skewness"]),
                                 (k5["corrected"]["correction"], k5["corrected"],
                                  hub["real_k_occurrence_skewness_corrected"])):
        print(f"| {label} | {' | '.join(format(figures[m], '.4f') for m in METRICS)} | {skew:.2f} |")
    print(f"\nthe CLI's --plot figure: {figure.relative_to(REPO)}")
    real_feats, gen_feats = (np.load(k5[side]["cache_file"])["features"] for side in ("real", "fake"))
    print("\n(b) same answers on the features the CLI cached\n")
    same = same_answers(real_feats, gen_feats, k5, k3)
    print("\n(c) extraction throughput\n")
    fast = throughput(real, rounds, n, tmp)
    print(f"\ngoals: same answers {'met' if same else 'NOT met'}; throughput {'met' if fast else 'NOT met'}")
    return same and fast


if __name__ == "__main__":
    sys.exit(main())
