"""`data=images`: the user's own labelled images (`framework.data.image_sources`) as classifier batches
`{"x", "y", "index"}`, with the model's own resize, crop and normalisation (timm's `create_transform`).

The validation images are `val_split` (default: the source's own `validation`/`valid`/`val`/`dev`/`test` split),
else a held-out `val_fraction` of the training split's images in their sorted order (every (1/val_fraction)-th from
the first: deterministic, the same on every rank). A model that states its data config (a timm model:
`use_data_config`) sets the input size, interpolation, mean, std and crop; otherwise `image_size` (32) with
ImageNet's mean and std. Training images are augmented (`train_transform`: timm's random resized crop, flip and
colour jitter; `flip`; `none`), each with random draws seeded by (seed, epoch, index), so a run resumed mid-epoch
(the sampler skips what was trained on: `framework.data.resumable`) sees the very same batches; images are decoded
in the loader's worker processes (`num_workers`).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from framework.data.image_sources import ImageSource, open_images
from framework.data.image_stream import seeded
from framework.data.packing import fingerprint
from framework.data.resumable import SplitData
from framework.data.sources import VAL_SPLITS
from framework.data.user_text import held_out
from framework.errors import InputError

DEFAULT_IMAGE_SIZE = 32
TRAIN_TRANSFORMS = ("timm", "flip", "none")
#: the transform's defaults when no model states its own (timm's keys: `resolve_model_data_config`)
DEFAULT_CONFIG = {"interpolation": "bilinear", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
                  "crop_pct": 1.0, "crop_mode": "center"}
_CONFIG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


class EpochClock:
    """The epoch the training set is read in (the trainer's), frozen into a worker process's copy when the loader
    starts its workers for that epoch (they are started anew each epoch)."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.frozen: int | None = None

    def epoch(self) -> int:
        if self.frozen is not None:
            return self.frozen
        return int(self.trainer.current_epoch) if self.trainer is not None else 0

    def __getstate__(self) -> dict[str, Any]:
        return {"trainer": None, "frozen": self.epoch()}


class ImageItems(Dataset):
    """Item i: image `rows[i]` of `source`, transformed, as {"x", "y", "index": i}; with a `clock`, the transform's
    random draws are seeded by (seed, epoch, i)."""

    def __init__(self, source: ImageSource, rows: list[int], transform: Any, seed: int = 0,
                 clock: EpochClock | None = None):
        self.source, self.rows, self.transform, self.seed, self.clock = source, rows, transform, seed, clock

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        j = self.rows[i]
        image = self.source.image(j)
        if self.clock is None:
            x = self.transform(image)
        else:
            with seeded(((self.seed * 1_000_003 + self.clock.epoch()) * 10_000_019 + i) % 2**63):
                x = self.transform(image)
        return {"x": x, "y": self.source.label(j), "index": i}


class ImageData(SplitData):
    """The user's labelled images (a folder tree, a Hub image dataset, parquet, webdataset shards) for a
    classifier: states `num_classes`, `input_shape` (C, H, W) and `classes`.

    Args:
        source: a folder (a subfolder per class), parquet files, webdataset shards or a Hub image dataset id; required.
        split: the source's split to train on.
        val_split: the source's split to validate on; None: its own validation/valid/val/dev/test split if any.
        val_fraction: share of the training split's images held out for validation when there is none, in (0, 1).
        revision: Hub branch, tag or commit of a Hub `source`; None: the default branch.
        image_column: the table column holding the images (Hub, parquet or metadata sources).
        label_column: the table column holding the labels (Hub, parquet or metadata sources).
        class_map: folder/label → class index or name, as a mapping or a JSON file; unnamed classes are left out.
        image_size: image side in pixels (≥ 8), overriding the model's data config; None: the model's, else 32.
        train_transform: training augmentation: "timm" (random resized crop, flip, colour jitter), "flip" or "none".
        strict: refuse a file that is not an image or is truncated, naming it; False skips and counts it.
        batch_size: images per batch.
        seed: seed of the training order and of the augmentations' random draws.
        num_workers: DataLoader worker processes, which decode the images; 0 decodes in the main process.
        cache_dir: root of the data cache (decoded-image checks, datasets' Arrow cache); None: the default root.
        streaming: read the images as a stream instead of opening the whole source first.
    """

    def __init__(self, source: str | None = None, split: str = "train", val_split: str | None = None,
                 val_fraction: float = 0.1, revision: str | None = None, image_column: str = "image",
                 label_column: str = "label", class_map: Any = None, image_size: int | None = None,
                 train_transform: str = "timm", strict: bool = False, batch_size: int = 32, seed: int | None = 0,
                 num_workers: int = 0, cache_dir: str | None = None, streaming: bool = False):
        super().__init__()
        self._check_values(source, val_fraction, image_size, train_transform, batch_size, num_workers)
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.split, self.val_fraction, self.image_size = split, val_fraction, image_size
        self.train_transform, self.class_map = train_transform, _plain(class_map)
        self.streaming, self.strict, self.data_config, self.clock = bool(streaming), bool(strict), None, EpochClock()
        if self.streaming:
            self._init_stream(str(source), revision, image_column, label_column, val_split)
            return
        opts = {"revision": revision, "image_column": image_column, "label_column": label_column,
                "class_map": self.class_map, "strict": bool(strict), "cache_dir": cache_dir, "workers": num_workers}
        self.source = open_images(source, split, min_classes=2, **opts)
        if self.source.labels is None:
            raise InputError(f"data.source={source}: its images have no labels ({self.source.kind}: images directly "
                             "in the folder, or no label column); put each class's images in a folder of its own "
                             "(source/cat/*.jpg, source/dog/*.jpg) or name the label column with data.label_column=")
        self.val_split = self._choose_val(self.source.splits, val_split)
        if self.val_split:
            self.val_source = open_images(source, self.val_split, classes=self.source.classes, **opts)
            self.source.channels = self.val_source.channels = max(self.source.channels, self.val_source.channels)
            self.train_rows, self.val_rows = list(range(len(self.source))), list(range(len(self.val_source)))
        else:
            self.val_source = self.source
            held = [held_out(i, val_fraction) for i in range(len(self.source))]
            self.train_rows = [i for i, h in enumerate(held) if not h]
            self.val_rows = [i for i, h in enumerate(held) if h]
        if len(self.train_rows) < batch_size:
            raise InputError(f"data.source={source} gives {len(self.train_rows)} training images, fewer than one "
                             f"batch of data.batch_size={batch_size}: lower data.batch_size or add images")
        self.classes = list(self.source.classes or [])
        self.num_classes = len(self.classes)
        self.input_shape = list(self.config()["input_size"])

    def _init_stream(self, source: str, revision: str | None, image_column: str, label_column: str,
                     val_split: str | None) -> None:
        """`data.streaming=true`: the source resolved for a stream (`framework.data.image_stream`), nothing read."""
        from framework.data.image_stream import setup_stream

        setup_stream(self, source, revision, image_column, label_column, self.class_map)
        if len(self.classes) < 2:
            raise InputError(f"data.source={source}: {len(self.classes)} class ({', '.join(self.classes)}); training "
                             "a classifier needs at least 2")
        self.val_split = self._choose_val(self.splits, val_split)
        self.stream_held = None if self.val_split else self.val_fraction
        self.num_classes, self.input_shape = len(self.classes), list(self.config()["input_size"])
        self.stream_loader = None

    @staticmethod
    def _check_values(source: Any, val_fraction: float, image_size: Any, train_transform: str, batch_size: Any,
                      num_workers: Any) -> None:
        if not source:
            raise InputError("data.source= is required: a folder of images in one folder per class, a folder of "
                             ".parquet files or webdataset .tar shards, or a Hub image dataset id 'owner/name'")
        for key, value, low in (("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                                ("image_size", 8 if image_size is None else image_size, 8)):
            if not isinstance(value, int) or value < low:
                raise InputError(f"data.{key}={value!r} must be an integer >= {low}")
        if not 0.0 < val_fraction < 1.0:
            raise InputError(f"data.val_fraction={val_fraction} must be in (0, 1) (the share of images held out for "
                             "validation when the source has no validation split)")
        if train_transform not in TRAIN_TRANSFORMS:
            raise InputError(f"data.train_transform={train_transform!r} is not one of {', '.join(TRAIN_TRANSFORMS)} "
                             "(timm: random resized crop, flip, colour jitter; flip: the evaluation transform after "
                             "a random horizontal flip; none: the evaluation transform)")

    def _choose_val(self, splits: list[str], val_split: str | None) -> str | None:
        if val_split is not None and val_split not in splits:
            raise InputError(f"data.val_split={val_split!r} is not a split of this source; its splits: "
                             f"{', '.join(splits)} (or null: its own validation split, else data.val_fraction)")
        return val_split or next((s for s in VAL_SPLITS if s in splits and s != self.split), None)

    def use_data_config(self, cfg: dict[str, Any]) -> None:
        """Transform the images as the model expects (timm's data config: input_size, interpolation, mean, std,
        crop_pct, crop_mode); an explicit `image_size` still sets the size."""
        self.data_config = {k: cfg[k] for k in _CONFIG_KEYS if k in cfg}
        self.input_shape = list(self.config()["input_size"])
        self.train_set = self.val_set = None

    @property
    def channels(self) -> int:
        """The images' channels: 1 when every image of a folder or table is grey, else 3 (a stream: 3)."""
        return getattr(getattr(self, "source", None), "channels", 3)

    def config(self) -> dict[str, Any]:
        """The transform's settings: the model's data config, else the defaults at `image_size`; the channels are
        the data's (grey images: one channel, mean and std averaged to one value)."""
        cfg = {**DEFAULT_CONFIG, "input_size": (3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE), **(self.data_config or {})}
        if self.image_size is not None:
            cfg["input_size"] = (3, self.image_size, self.image_size)
        c = self.channels
        cfg["input_size"] = (c, *(int(s) for s in cfg["input_size"][1:]))
        if c == 1:
            cfg["mean"], cfg["std"] = ((sum(cfg[k]) / len(cfg[k]),) for k in ("mean", "std"))
        return cfg

    def transforms(self) -> tuple[Any, Any]:
        """(training, evaluation) transforms from `timm.data.create_transform`."""
        from timm.data import create_transform
        from torchvision import transforms

        cfg = self.config()
        plain = create_transform(**cfg, is_training=False)
        if self.train_transform == "timm":
            return create_transform(**cfg, is_training=True), plain
        if self.train_transform == "flip":
            return transforms.Compose([transforms.RandomHorizontalFlip(), plain]), plain
        return plain, plain

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None or (self.streaming and self.val_set is not None):
            return
        if self.streaming:
            from framework.data.image_stream import val_items

            self._stream_transform, plain = self.transforms()
            self.val_set = val_items(self, plain)
            return
        world = self.trainer.world_size if self.trainer is not None else 1
        if len(self.train_rows) < self.batch_size * world:
            raise InputError(f"data.source={self.source.spec} gives {len(self.train_rows)} training images, fewer "
                             f"than one batch of data.batch_size={self.batch_size} on each of {world} ranks")
        train, plain = self.transforms()
        self.train_set = ImageItems(self.source, self.train_rows, train, int(self.seed or 0), self.clock)
        self.val_set = ImageItems(self.val_source, self.val_rows, plain)

    def train_dataloader(self) -> Any:
        """The resumable, self-sharding loader over the images; streamed: `framework.data.image_stream`'s."""
        self.clock.trainer = self.trainer
        if not self.streaming:
            return super().train_dataloader()
        from framework.data.image_stream import ImageStreamLoader

        self.setup()
        self.stream_loader = ImageStreamLoader(self, self._stream_transform, self.trainer)
        return self.stream_loader

    def identity(self) -> dict[str, Any]:
        """What the batches are made of: the images (each split's fingerprint), classes, held-out rule, transform."""
        if self.streaming:
            return {"kind": "images", "stream": self.stream_source.identity(), "split": self.split,
                    "val_split": self.val_split, "val_fraction": self.stream_held, "classes": self.classes,
                    "config": self.config(), "train_transform": self.train_transform}
        return {"kind": "images", "train": self.source.identity(), "split": self.split,
                "val": self.val_source.identity() if self.val_split else None, "val_split": self.val_split,
                "val_fraction": None if self.val_split else self.val_fraction, "classes": self.classes,
                "config": self.config(), "train_transform": self.train_transform}

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.identity())

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refuse to resume on other images than the checkpoint's (InputError naming both fingerprints)."""
        theirs = state.get("fingerprint")
        if theirs is not None and theirs != self.fingerprint:
            raise InputError(f"data.source={self.source.spec}: the data changed since the checkpoint was written "
                             f"(fingerprint {theirs} then, {self.fingerprint} now: the images, their classes, the "
                             "split or the transform differ); resume with the same data, or start a new run")

    def record(self) -> dict[str, Any]:
        """What results.json and the model card say about the data: the source, counts, classes, skipped files."""
        shown = self.classes if len(self.classes) <= 20 else [*self.classes[:20], f"... ({len(self.classes)})"]
        if self.streaming:
            counts = getattr(self.stream_loader, "totals", {})
            return {**self.stream_source.describe(), "fingerprint": self.fingerprint, "streaming": True,
                    "num_classes": self.num_classes, "class_names": shown, "images_read": counts.get("images", 0),
                    "repeated_images": counts.get("repeated", 0), "skipped": counts.get("skipped", 0),
                    "val_images": len(self.val_set or ()), "input_size": list(self.config()["input_size"]),
                    "validation": self.val_split or f"held out: {self.val_fraction:g} of the images (by content hash)",
                    "train_transform": self.train_transform}
        out = {**self.source.describe(), "fingerprint": self.fingerprint, "num_classes": self.num_classes,
               "class_names": shown, "train_images": len(self.train_rows), "val_images": len(self.val_rows),
               "validation": self.val_split or f"held out: {self.val_fraction:g} of the images",
               "input_size": list(self.config()["input_size"]), "train_transform": self.train_transform}
        if self.val_split and self.val_source.skipped:
            out["val_skipped"] = len(self.val_source.skipped)
        return out


def _plain(value: Any) -> Any:
    """An OmegaConf mapping (data.class_map={cat:0,dog:1} on the command line) as a plain dict; others as given."""
    if hasattr(value, "items") and not isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return value


__all__ = ["DEFAULT_IMAGE_SIZE", "EpochClock", "ImageData", "ImageItems", "TRAIN_TRANSFORMS", "seeded"]
