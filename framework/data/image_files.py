"""Image files on disk: which files are images, decoding one as a viewer shows it, and a content hash for caches.

Shared by the `images` data module and the metrics CLI, so both see the same files and refuse the same bad ones
(a file that is not an image, a truncated one) with a message that names the file. Decoding shows the image as an
image viewer does: EXIF orientation applied, 16-bit and 32-bit integer images rescaled to 8 bits (not clipped:
a 16-bit value v becomes round(v / 257)), float images in [0, 1] scaled by 255 (other float ranges stretched from
their minimum to their maximum), transparency composited on white; then RGB, or one channel (`channels=1`) for
data whose images are all grey (`check_image` says which).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

from framework.errors import InputError

#: suffixes read as images (lower case; the match ignores case), the formats PIL decodes without plugins
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


class BadImage(InputError):  # noqa: N818 - named in the shared contract; it is an InputError
    """A file (or bytes) that cannot be decoded as an image; the message names the file and why."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")
        self.name, self.why = name, why


def is_image_name(path: str | os.PathLike) -> bool:
    """True when the file name ends in one of IMAGE_SUFFIXES (any case)."""
    return str(path).lower().endswith(IMAGE_SUFFIXES)


#: PIL modes of one-channel images (grey, 1-bit, 16/32-bit integer, float; with alpha: LA)
GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F", "La"})


def list_images(root: str | os.PathLike) -> list[Path]:
    """Every image file under `root`, recursively, sorted by path; hidden files and folders are left out. Symbolic
    links are followed, but a folder reached twice (a link back up the tree: a loop) is listed once, with a warning
    naming the link."""
    import logging

    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise InputError(f"{str(root)!r} is not a folder (expected a folder of {', '.join(IMAGE_SUFFIXES)} files)")
    found = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            logging.getLogger(__name__).warning("%s: a link to the folder %s, listed already (a symbolic link loop?): "
                                                "its images are listed once", dirpath, real)
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath) / f for f in filenames if not f.startswith(".") and is_image_name(f))
    if not found:
        raise InputError(f"{str(root)!r} holds no image ({', '.join(IMAGE_SUFFIXES)} files, searched recursively)")
    return sorted(found)


def load_image(source: str | os.PathLike | bytes, name: str | None = None, channels: int = 3):
    """Decode a file (or its bytes) fully into a PIL image as a viewer shows it (module docstring), RGB or, with
    `channels=1`, grey; `BadImage` names it when it is not an image or is truncated (decoded eagerly, so a bad file
    fails here and not later in a transform)."""
    return _decode(source, name, draft=False, channels=channels)


def check_image(source: str | os.PathLike | bytes, name: str | None = None) -> int:
    """`load_image`'s refusals without its full cost (a JPEG is decoded at reduced scale: PIL's draft mode still
    reads every byte, so a truncated file is caught; other formats are decoded whole). Returns the image's
    channels: 1 for a grey image (`GREY_MODES`), else 3."""
    return _decode(source, name, draft=True)


def _decode(source: str | os.PathLike | bytes, name: str | None, draft: bool, channels: int = 3):
    from PIL import Image, UnidentifiedImageError

    label = name or (f"<{len(source)} bytes>" if isinstance(source, bytes | bytearray) else str(source))
    stream = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    try:
        with Image.open(stream) as img:
            mode = img.mode
            if draft:
                img.draft("RGB", (1, 1))
            img.load()
            if draft:
                return 1 if mode in GREY_MODES else 3
            return _viewable(img, channels)
    except UnidentifiedImageError:
        raise BadImage(label, "not an image (PIL cannot identify its format)") from None
    except Image.DecompressionBombError as err:
        raise BadImage(label, f"refused as a decompression bomb ({err})") from None
    except (OSError, SyntaxError, ValueError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        why = "truncated" if "truncat" in str(err).lower() else "cannot be decoded"
        raise BadImage(label, f"{why} ({err})") from None


def _viewable(img, channels: int):
    """The image upright (EXIF), in 8 bits (high bit depths and floats rescaled), transparency on white, RGB or L."""
    from PIL import Image, ImageOps

    img = ImageOps.exif_transpose(img)
    if img.mode in GREY_MODES - {"1", "L", "LA", "La"}:
        img = Image.fromarray(_eight_bits(img), mode="L")
    if img.mode in ("RGBA", "LA", "La") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(canvas, rgba)
    return img.convert("L" if channels == 1 else "RGB")


def _eight_bits(img):
    """A 16/32-bit integer or float image's values in 0..255 (uint8): integers by their bit depth (16-bit: / 257;
    32-bit: as 16-bit when they fit it, else stretched), floats in [0, 1] times 255, anything else stretched from
    its minimum to its maximum (NaN as the minimum)."""
    import numpy as np

    a = np.asarray(img)
    if img.mode.startswith("I;16"):
        return np.round(a.astype(np.float64) / 257).astype(np.uint8)
    a = np.nan_to_num(a.astype(np.float64), nan=float(np.nanmin(a)) if np.isfinite(a).any() else 0.0)
    lo, hi = float(a.min()), float(a.max())
    if img.mode == "I" and lo >= 0 and hi <= 255:
        scaled = a
    elif img.mode == "I" and lo >= 0 and hi <= 65535:
        scaled = a / 257
    elif img.mode == "F" and lo >= 0 and hi <= 1:
        scaled = a * 255
    else:
        scaled = (a - lo) * (255 / (hi - lo)) if hi > lo else np.zeros_like(a)
    return np.clip(np.round(scaled), 0, 255).astype(np.uint8)


def file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """A content hash of the file (blake2b, 16 bytes, hex): equal exactly when the bytes are equal."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
