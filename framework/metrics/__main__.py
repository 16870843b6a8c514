"""`python -m framework.metrics REAL FAKE [--k 5] [--correction none]`: P/R/D/C as JSON (raw by default).

REAL and FAKE are each a 2-D (points, dims) `.npy` array of features (`np.save`; nothing is unpickled), or texts
(a `.txt` file, one per line; `.jsonl` and the other files, folders and Hub datasets `data=text` reads: their
`--column`) embedded by `--feature MODEL` (a transformers model folder or Hub id: `HFFeatures`' pooled hidden states).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import numpy as np

from framework.errors import InputError, run_cli
from framework.metrics.functional import CORRECTIONS, NEIGHBOURS, prdc
from framework.metrics.inputs import read_side


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.metrics", description=__doc__.split("\n")[0])
    parser.add_argument("real", help="the real points: features, .npy of shape (N, D), or texts (with --feature)")
    parser.add_argument("fake", help="the generated points: features, .npy of shape (M, D), or texts (with --feature)")
    parser.add_argument("--k", type=int, default=5, help="neighbourhood size (prdc: 5, Kynkäänniemi: 3)")
    parser.add_argument("--correction", default="none",
                        help=f"one of {', '.join(CORRECTIONS)}: none (default, = prdc), icdm (real factors only), "
                             "gicdm_reconstructed (our reconstruction of GICDM; over-corrects, see docs/gicdm.md)")
    parser.add_argument("--neighbours", default="exact",
                        help=f"ICDM neighbours, one of {', '.join(NEIGHBOURS)} (approx_graph: candidate graph)")
    parser.add_argument("--le", action="store_true", help="ball test with <= (Kynkäänniemi) instead of < (prdc)")
    parser.add_argument("--block-size", type=int, default=None, help="tile edge in points (default 1024)")
    parser.add_argument("--feature", default=None, help="the transformers model (folder or Hub id) that embeds texts")
    parser.add_argument("--layer", type=int, default=-1, help="its hidden state to pool (default -1: the last)")
    parser.add_argument("--pool", default="mean", help="mean (over real tokens), last (a causal LM's) or first")
    parser.add_argument("--column", default="text", help="the text column of a .jsonl/.csv/... side (default text)")
    parser.add_argument("--split", default="train", help="the split of a folder or Hub dataset side (default train)")
    parser.add_argument("--max-length", type=int, default=512, help="tokens per text, the rest cut (default 512)")
    args = parser.parse_args(argv)
    return run_cli(lambda: _evaluate(args))


def _evaluate(args: argparse.Namespace) -> None:
    embed = _embedder(args)
    real, fake = (read_side(path, embed, args.column, args.split) for path in (args.real, args.fake))
    out = prdc(real.features, fake.features, args.k, args.correction, strict=not args.le, neighbours=args.neighbours,
               block_size=args.block_size)
    out.update(n_real=int(real.features.shape[0]), n_fake=int(fake.features.shape[0]),
               dim=int(real.features.shape[1]), real=real.describe(), fake=fake.describe())
    if args.feature:
        out["feature"] = {"model": args.feature, "layer": args.layer, "pool": args.pool}
    print(json.dumps(out, indent=2))


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


if __name__ == "__main__":
    raise SystemExit(main())
