"""Image files on disk: which files are images, decoding one to RGB, and a content hash for caches.

Shared by the `images` data module and the metrics CLI, so both see the same files and refuse the same bad ones
(a file that is not an image, a truncated one) with a message that names the file.
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


def list_images(root: str | os.PathLike) -> list[Path]:
    """Every image file under `root`, recursively, sorted by path; hidden files and folders are left out."""
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise InputError(f"{str(root)!r} is not a folder (expected a folder of {', '.join(IMAGE_SUFFIXES)} files)")
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath) / f for f in filenames if not f.startswith(".") and is_image_name(f))
    if not found:
        raise InputError(f"{str(root)!r} holds no image ({', '.join(IMAGE_SUFFIXES)} files, searched recursively)")
    return sorted(found)


def load_image(source: str | os.PathLike | bytes, name: str | None = None):
    """Decode a file (or its bytes) fully into an RGB PIL image; `BadImage` names it when it is not an image or is
    truncated (decoded eagerly, so a bad file fails here and not later in a transform)."""
    return _decode(source, name, draft=False)


def check_image(source: str | os.PathLike | bytes, name: str | None = None) -> None:
    """`load_image`'s refusals without its full cost: a JPEG is decoded at reduced scale (PIL's draft mode still
    reads every byte, so a truncated file is caught); other formats are decoded whole."""
    _decode(source, name, draft=True)


def _decode(source: str | os.PathLike | bytes, name: str | None, draft: bool):
    from PIL import Image, UnidentifiedImageError

    label = name or (f"<{len(source)} bytes>" if isinstance(source, bytes | bytearray) else str(source))
    stream = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    try:
        with Image.open(stream) as img:
            if draft:
                img.draft("RGB", (1, 1))
            img.load()
            return None if draft else _to_rgb(img)
    except UnidentifiedImageError:
        raise BadImage(label, "not an image (PIL cannot identify its format)") from None
    except Image.DecompressionBombError as err:
        raise BadImage(label, f"refused as a decompression bomb ({err})") from None
    except (OSError, SyntaxError, ValueError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        why = "truncated" if "truncat" in str(err).lower() else "cannot be decoded"
        raise BadImage(label, f"{why} ({err})") from None


def _to_rgb(img):
    """RGB, with a transparent background composited on white (as a viewer shows it), not left black."""
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        from PIL import Image

        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return img.convert("RGB")


def file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """A content hash of the file (blake2b, 16 bytes, hex): equal exactly when the bytes are equal."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
