"""Real images on disk for the image tests: scikit-learn's digits written as PNG (or JPEG) files in class folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def digits_pngs(folder: Path, n: int = 40, classes=(0, 1, 2), size: int = 16, suffix: str = "png",
                start: int = 0) -> Path:
    """scikit-learn's digits of `classes` (the `n` first from position `start`) as `size`-pixel images in
    `folder/<digit>/<i>.<suffix>`."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    picked = [i for i in range(len(data.target)) if data.target[i] in classes][start:start + n]
    for i in picked:
        sub = folder / str(data.target[i])
        sub.mkdir(parents=True, exist_ok=True)
        pixels = (data.images[i] * 16).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).resize((size, size)).save(sub / f"{i:04d}.{suffix}")
    return folder
