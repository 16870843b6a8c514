"""What each side of `python -m framework.metrics` can be: features already computed (a `.npy` array), images that a
timm model turns into features (`framework.metrics.image_features`), or texts that a transformers model embeds
(`framework.models.hf_features.HFFeatures`).

Images are a folder (searched recursively), a Hub image dataset by id, or `.parquet` / webdataset `.tar` files with
an image column (`framework.data.image_sources.open_images`). Texts are a `.txt` file (one text per line, blank
lines skipped) or any source `data=text` reads (`.jsonl` / `.json` / `.csv` / `.parquet` / `.arrow` files, a folder,
a glob, a Hub dataset id), whose documents are the texts of `column` in `split`. A Hub id or a `.parquet` file is
read as images unless `--feature` names a transformers model. Both sides are checked before any feature is computed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from framework.data.image_files import is_image_name, list_images
from framework.errors import InputError

FEATURES, IMAGES, TEXTS = "features", "images", "texts"


@dataclass
class Side:
    """One side's points: `features` (N, D), read or computed, and how they were read (`info`), for the output."""

    path: str
    kind: str  # FEATURES, IMAGES or TEXTS
    features: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "read_as": self.kind, "points": int(self.features.shape[0]), **self.info}


@dataclass
class Plan:
    """A side checked but not yet turned into features: its `.npy` array, its texts, or its images."""

    path: str
    kind: str
    features: np.ndarray | None = None
    texts: list[str] | None = None
    images: Any = None  # an image_features.ImageSet
    info: dict[str, Any] = field(default_factory=dict)


def read_features(path: str) -> np.ndarray:
    """A plain `.npy` array (nothing unpickled)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such features file: {path}")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as err:
        raise InputError(f"{path} is not a plain .npy array ({err}); object arrays are refused") from None


def read_texts(path: str, column: str = "text", split: str = "train") -> list[str]:
    """The texts of `path`: a `.txt` file's lines, else the documents of a `data=text` source (module docstring)."""
    from framework.data import sources

    file = Path(path).expanduser()
    if file.suffix == ".txt" and file.is_file():
        sources.check_utf8(str(file))
        return [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    source = sources.resolve(path)
    if split not in sources.splits_of(source):
        raise InputError(f"--split {split}: {path} has the splits {', '.join(sources.splits_of(source))}")
    sources.check(source, column, [split])
    return [text for batch in sources.read_texts(source, split, column) for text in batch]


def text_feature(feature: str | None) -> bool:
    """Whether `--feature` names a transformers model (a folder, or a Hub id that is neither hf-hub: nor timm's)."""
    if not feature or feature.startswith("hf-hub:"):
        return False
    if Path(feature).expanduser().exists():
        return True
    import timm
    from timm.models import split_model_name_tag

    return not timm.is_model(split_model_name_tag(feature)[0])


def _holds_files(folder: Path, match: Callable[[str], bool]) -> bool:
    for _, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if any(not f.startswith(".") and match(f) for f in filenames):
            return True
    return False


def kind_of(path: str, feature: str | None) -> str:
    """FEATURES (`.npy`), IMAGES (a folder holding images; a Hub id, `.parquet` or `.tar` unless `feature` is a
    transformers model) or TEXTS. An empty folder is refused here."""
    file = Path(path).expanduser()
    if file.suffix == ".npy":
        return FEATURES
    if file.is_dir():
        if _holds_files(file, is_image_name):
            return IMAGES
        if not _holds_files(file, lambda name: True):
            list_images(file)  # raises, naming the folder and the image types looked for
        return TEXTS
    if file.is_file() and is_image_name(file):
        raise InputError(f"{path} is one image: a side is a folder of images (searched recursively), a Hub image "
                         "dataset, texts, or a .npy array of features")
    if file.suffix == ".tar":
        return IMAGES
    hub_id = path.count("/") == 1 and not path.startswith((".", "~", "/")) and not path.endswith("/")
    if not file.exists() and not hub_id and not any(c in path for c in "*?["):
        raise InputError(f"{path}: no such file or folder (a side is a folder of images, a Hub dataset id "
                         "'owner/name', .parquet or .tar files, a file of texts, or a .npy array of features)")
    ambiguous = file.suffix == ".parquet" or not file.exists() and "/" in path and not path.startswith((".", "~", "/"))
    return IMAGES if ambiguous and not text_feature(feature) else TEXTS


def plan_side(path: str, feature: str | None, column: str = "text", split: str = "train",
              image_column: str = "image", strict: bool = False) -> Plan:
    """One side checked: its kind, and its array, texts or list of images (no feature computed yet)."""
    kind = kind_of(path, feature)
    if kind == FEATURES:
        return Plan(path, kind, features=read_features(path))
    if kind == TEXTS:
        texts = read_texts(path, column, split)
        if not texts:
            raise InputError(f"{path} holds no text (an empty source)")
        return Plan(path, kind, texts=texts)
    return image_plan(path, split, image_column, strict)


def image_plan(path: str, split: str, image_column: str, strict: bool) -> Plan:
    """A folder of images (fingerprinted by the files' digests) or a source `open_images` reads (by its commit or
    its files); files that do not decode are found when the features are extracted (folders) or on opening."""
    from framework.metrics.image_features import ImageSet, folder_images

    folder = Path(path).expanduser()
    if folder.is_dir() and _holds_files(folder, is_image_name):
        images = folder_images(folder)
        return Plan(path, IMAGES, images=images, info={"files": len(images)})
    from framework.data.image_sources import open_images

    source = open_images(path, split=split, image_column=image_column, label_column="", strict=strict)
    images = ImageSet([source.name(i) for i in range(len(source))], source.image,
                      f"source:{source.identity()}:{image_column}")
    skipped = [f"{name}: {why}" for name, why in source.skipped]
    return Plan(path, IMAGES, images=images, info={"source": source.describe(), "skipped_on_open": skipped})


def check_plans(real: Plan, fake: Plan, feature: str | None) -> None:
    """Refuse what cannot be compared before anything is computed: texts against images, texts without a model."""
    kinds = {real.kind, fake.kind}
    if kinds == {TEXTS, IMAGES}:
        raise InputError(f"{real.path} holds {real.kind} but {fake.path} holds {fake.kind}: both sides must be "
                         "turned into features by the same model (or give both as .npy features)")
    for plan in (real, fake):
        if plan.kind == TEXTS and not feature:
            raise InputError(f"{plan.path} holds texts: name the model that embeds them with --feature <a "
                             "transformers model folder or Hub id> (or give features as a .npy array)")
    widths = {p.path: p.features.shape[1] for p in (real, fake) if p.kind == FEATURES and p.features.ndim == 2}
    if len(widths) == 2 and len(set(widths.values())) == 2:
        raise InputError(f"the real features ({real.path}) have {widths[real.path]} dims but the generated ones "
                         f"({fake.path}) have {widths[fake.path]}: both sides must come from the same extractor")


def realise(plan: Plan, embed: Callable[[list[str]], np.ndarray] | None, extract: Callable[..., Any] | None,
            role: str) -> tuple[Side, Any]:
    """The side's features: read, embedded (`embed`), or extracted (`extract(images, desc)` -> Extracted). Returns
    the side and, for images, what was extracted (its cache state, to be stored once everything succeeded)."""
    if plan.kind == FEATURES:
        return Side(plan.path, plan.kind, plan.features), None
    if plan.kind == TEXTS:
        return Side(plan.path, plan.kind, embed(plan.texts)), None
    got = extract(plan.images, desc=role)
    skipped = plan.info.pop("skipped_on_open", []) + got.skipped
    if not len(got.features):
        raise InputError(f"{plan.path}: none of its {len(plan.images)} images could be decoded (first: "
                         f"{skipped[0] if skipped else '?'})")
    info = {**plan.info, "skipped": len(skipped), "features_cache": got.cache}
    if skipped:
        info["skipped_examples"] = skipped[:5]
    if got.cache_file is not None:
        info["cache_file"] = str(got.cache_file)
    return Side(plan.path, plan.kind, got.features, info), got


__all__ = ["FEATURES", "IMAGES", "TEXTS", "Plan", "Side", "check_plans", "kind_of", "plan_side", "read_features",
           "read_texts", "realise", "text_feature"]
