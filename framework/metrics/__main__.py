"""`python -m framework.metrics real.npy fake.npy [--k 5] [--correction none]`: P/R/D/C as JSON (raw by default).

Each file holds a 2-D (points, dims) array of features (`np.save`); nothing is unpickled.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from framework.errors import InputError, run_cli
from framework.metrics.functional import CORRECTIONS, NEIGHBOURS, prdc


def _load(path: str) -> np.ndarray:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such features file: {path}")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as err:
        raise InputError(f"{path} is not a plain .npy array ({err}); object arrays are refused") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.metrics", description=__doc__.split("\n")[0])
    parser.add_argument("real", help="real features, .npy of shape (N, D)")
    parser.add_argument("fake", help="generated features, .npy of shape (M, D)")
    parser.add_argument("--k", type=int, default=5, help="neighbourhood size (prdc: 5, Kynkäänniemi: 3)")
    parser.add_argument("--correction", default="none",
                        help=f"one of {', '.join(CORRECTIONS)}: none (default, = prdc), icdm (real factors only), "
                             "gicdm_reconstructed (our reconstruction of GICDM; over-corrects, see docs/gicdm.md)")
    parser.add_argument("--neighbours", default="exact",
                        help=f"ICDM neighbours, one of {', '.join(NEIGHBOURS)} (approx_graph: candidate graph)")
    parser.add_argument("--le", action="store_true", help="ball test with <= (Kynkäänniemi) instead of < (prdc)")
    parser.add_argument("--block-size", type=int, default=None, help="tile edge in points (default 1024)")
    args = parser.parse_args(argv)
    return run_cli(lambda: _evaluate(args))


def _evaluate(args: argparse.Namespace) -> None:
    real, fake = _load(args.real), _load(args.fake)
    out = prdc(real, fake, args.k, args.correction, strict=not args.le, neighbours=args.neighbours,
               block_size=args.block_size)
    out.update(n_real=int(real.shape[0]), n_fake=int(fake.shape[0]), dim=int(real.shape[1]))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
