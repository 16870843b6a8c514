"""Image features for the generative metrics: a timm model by name or Hub id (`hf-hub:org/name`), its pooled
features (`num_classes=0`) after its own eval transform, extracted batch by batch and cached by content.

The default extractor is DINOv2 ViT-L/14 (`vit_large_patch14_dinov2.lvd142m`), the one the dgm-eval study chose
for generative metrics. Weights are pinned to the Hub commit they were read at, and the features cache is keyed by
that commit and by the images' content (file digests, or a Hub dataset's commit), never by a folder's name, so a
renamed folder is reused and a changed file is not. Images are decoded in DataLoader workers, one batch at a time:
memory holds a few batches of pixels and the (N, D) features, never N decoded images.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from framework.data.image_files import BadImage, file_digest, list_images, load_image
from framework.devices import usable_cpus
from framework.errors import InputError

DEFAULT = "vit_large_patch14_dinov2.lvd142m"
DEFAULT_NOTE = "DINOv2 ViT-L/14, the extractor dgm-eval chose"
VERSION = 1  # bumped when what a cached row holds changes: the cache key carries it


class ExtractorUnavailable(OSError):  # noqa: N818 - an environment failure (exit 1), named for what the user meets
    """The extractor's weights are neither cached nor downloadable (the Hub unreachable)."""


@dataclass(frozen=True)
class Extractor:
    """A timm extractor resolved to the Hub commit of its weights (`repo` at `revision`), before any weight is read."""

    name: str  # as given, or DEFAULT
    repo: str
    revision: str
    default: bool = False

    def key(self, bf16: bool) -> str:
        """What the features depend on besides the images: the weights' commit, precision, timm, this code."""
        import timm

        return f"{self.name}|{self.repo}@{self.revision}|bf16={bf16}|timm={timm.__version__}|v{VERSION}"

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "repo": self.repo, "revision": self.revision, "library": "timm"}
        return out | ({"default": True, "note": DEFAULT_NOTE} if self.default else {})


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _network_errors() -> tuple[type[BaseException], ...]:
    """What the Hub client raises when the Hub cannot be reached (its HTTP library's errors, and OSError)."""
    found: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            found.append(__import__(module).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _revision(repo: str, revision: str | None, given: str, files: tuple[str, ...]) -> str:
    """The commit sha of `repo` at `revision` (None: main), from the Hub, else from the local Hub cache."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        return HfApi().model_info(repo, revision=revision, timeout=10).sha
    except RepositoryNotFoundError:
        raise InputError(f"--feature {given}: no model repository {repo!r} on {_endpoint()} (a timm name such as "
                         f"{DEFAULT!r}, or hf-hub:ORG/NAME of a timm model on HF_ENDPOINT)") from None
    except RevisionNotFoundError:
        raise InputError(f"--feature {given}: {repo} has no revision {revision!r}") from None
    except (HfHubHTTPError, *_network_errors()) as err:
        for name in files:
            cached = try_to_load_from_cache(repo, name, revision=revision or "main")
            if isinstance(cached, str):
                return Path(cached).parent.name  # .../snapshots/<sha>/<file>
        what = f"the default feature extractor {given} ({DEFAULT_NOTE})" if given == DEFAULT else given
        raise ExtractorUnavailable(
            f"{what} is not in the Hub cache and {_endpoint()} cannot give it ({' '.join(str(err).split())[:160]}); "
            "connect to the Hub once, or pass --feature a timm model you have (hf-hub:ORG/NAME on HF_ENDPOINT)"
        ) from None


def _check_timm_config(repo: str, sha: str, given: str) -> None:
    """Refuse a Hub repository that timm cannot open as a model, saying what it is instead."""
    import timm
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        cfg = json.loads(Path(hf_hub_download(repo, "config.json", revision=sha)).read_text())
    except EntryNotFoundError:
        raise InputError(f"--feature {given} is not a timm model: {repo} has no config.json (timm's push writes "
                         "one naming the 'architecture')") from None
    arch = cfg.get("architecture") if isinstance(cfg, dict) else None
    if isinstance(arch, str) and timm.is_model(arch):
        return
    if isinstance(cfg, dict) and "model_type" in cfg:
        what = f"a transformers model (model_type {cfg['model_type']!r}; for texts, name it without hf-hub:)"
    elif isinstance(arch, str):
        what = f"a config naming the architecture {arch!r}, which this timm ({timm.__version__}) does not have"
    else:
        keys = ", ".join(sorted(cfg)[:8]) if isinstance(cfg, dict) else type(cfg).__name__
        what = f"a config.json without 'architecture' (keys: {keys})"
    raise InputError(f"--feature {given} is not a timm model: {repo} holds {what}")


def resolve(name: str | None) -> Extractor:
    """`--feature` checked and pinned: a timm name (its pretrained weights on the Hub) or `hf-hub:org/name[@rev]`;
    None is DEFAULT. Unknown names get close matches; a Hub repo timm cannot open is named for what it is."""
    import timm
    from timm.models import get_pretrained_cfg, split_model_name_tag

    given = name or DEFAULT
    if given.startswith("hf-hub:"):
        repo, _, revision = given[len("hf-hub:"):].partition("@")
        sha = _revision(repo, revision or None, given, ("config.json",))
        _check_timm_config(repo, sha, given)
        return Extractor(given, repo, sha)
    arch, tag = split_model_name_tag(given)
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise InputError(f"--feature {given!r} is not a timm model: {hint}(timm.list_models() lists "
                         f"{len(timm.list_models())} names; or hf-hub:ORG/NAME for a model on the Hub)")
    try:
        cfg = get_pretrained_cfg(given)
    except RuntimeError:
        cfg = None
    if cfg is None or not cfg.hf_hub_id:
        tags = timm.list_pretrained(f"{arch}.*")
        raise InputError(f"--feature {given!r}: timm has no pretrained weights on the Hub for it (tags with weights: "
                         f"{', '.join(tags[:6]) or 'none'})")
    repo, _, revision = cfg.hf_hub_id.partition("@")
    sha = _revision(repo, revision or None, given, ("model.safetensors", "pytorch_model.bin", "config.json"))
    return Extractor(given, repo, sha, default=name is None)


@dataclass
class ImageSet:
    """Images to extract: a name per item, `read(i)` -> RGB PIL image (raises BadImage), and `content`, a
    fingerprint of what is read (the cache key's other half)."""

    names: list[str]
    read: Callable[[int], Any]
    content: str

    def __len__(self) -> int:
        return len(self.names)


class _ReadFile:
    """`read(i)` for a list of files (a class, not a closure, so DataLoader workers can take it)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def __call__(self, i: int) -> Any:
        return load_image(self.paths[i])


class _Grey:
    """A one-channel model's transform: the image made grey first (a class, so DataLoader workers can take it)."""

    def __init__(self, transform: Callable):
        self.transform = transform

    def __call__(self, image: Any) -> Any:
        return self.transform(image.convert("L"))


def folder_images(root: str | os.PathLike) -> ImageSet:
    """Every image under `root` (recursive, sorted), fingerprinted by the files' content digests in that order."""
    paths = list_images(root)
    digest = hashlib.blake2b(digest_size=20)
    for path in paths:
        digest.update(file_digest(path).encode() + b"\n")
    return ImageSet([str(p) for p in paths], _ReadFile(paths), f"files:{len(paths)}:{digest.hexdigest()}")


@dataclass
class Extracted:
    """Features of the images that decoded (N_kept, D) and, for each skipped one, `name: why`."""

    features: np.ndarray
    skipped: list[str] = field(default_factory=list)
    cache: str = "off"  # "off", "reused" or "new" (written once the whole command succeeds)
    cache_file: Path | None = None


class _Decoded(torch.utils.data.Dataset):
    """Item i: (transformed image, i, "") or, for a file that does not decode, (zeros, i, "name: why")."""

    def __init__(self, images: ImageSet, transform: Callable, shape: tuple[int, ...]):
        self.images, self.transform, self.shape = images, transform, shape

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, str]:
        try:
            return self.transform(self.images.read(i)), i, ""
        except BadImage as err:  # reported by the main process: a worker's exception would lose its type
            return torch.zeros(self.shape), i, str(err)


def default_workers() -> int:
    """Decoding processes: every CPU this process may use but the one running the model, at least 1, at most 8."""
    return max(1, min(8, usable_cpus() - 1))


class ImageFeatures:
    """Pooled features of a resolved timm `extractor` on `device` (default: the GPU when there is one)."""

    def __init__(self, extractor: Extractor, *, device: str | None = None, bf16: bool = False,
                 batch_size: int = 64, workers: int | None = None, progress: bool | None = None):
        self.extractor, self.bf16, self.batch_size = extractor, bf16, batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.workers = default_workers() if workers is None else workers
        self.progress = progress  # None: a bar when stderr is a terminal
        self._built: tuple[torch.nn.Module, Callable, tuple[int, ...]] | None = None

    def model(self) -> tuple[torch.nn.Module, Callable, tuple[int, ...]]:
        """(the model in eval mode on `device`, its eval transform, its input shape), built once."""
        if self._built is None:
            import timm

            e = self.extractor
            pinned = f"{e.repo}@{e.revision}"
            if e.name.startswith("hf-hub:"):
                model = timm.create_model(f"hf-hub:{pinned}", pretrained=True, num_classes=0)
            else:
                model = timm.create_model(e.name, pretrained=True, num_classes=0,
                                          pretrained_cfg_overlay={"hf_hub_id": pinned})
            cfg = timm.data.resolve_model_data_config(model)
            transform = timm.data.create_transform(**cfg, is_training=False)
            if cfg["input_size"][0] == 1:  # a model trained on grey images (data=images gives it one channel)
                transform = _Grey(transform)
            self._built = (model.eval().to(self.device), transform, tuple(cfg["input_size"]))
        return self._built

    def extract(self, images: ImageSet, *, strict: bool = False, desc: str = "") -> Extracted:
        """Features of every image that decodes, batch by batch; with `strict` the first bad file is refused."""
        model, transform, shape = self.model()
        loader = torch.utils.data.DataLoader(_Decoded(images, transform, shape), batch_size=self.batch_size,
                                             num_workers=self.workers, pin_memory=self.device.type == "cuda")
        from tqdm.auto import tqdm

        feats: np.ndarray | None = None
        ok, skipped = np.ones(len(images), dtype=bool), []
        bar = tqdm(total=len(images), desc=desc or self.extractor.name, unit="img", file=sys.stderr,
                   disable=None if self.progress is None else not self.progress)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)
        with bar, torch.inference_mode(), autocast:
            for x, index, errors in loader:
                for i, why in zip(index.tolist(), errors, strict=True):
                    if why and strict:
                        raise InputError(f"{why} (--strict refuses it; without --strict such files are skipped and "
                                         "counted)")
                    if why:
                        ok[i] = False
                        skipped.append(why)
                out = model(x.to(self.device, non_blocking=True)).float().cpu().numpy()
                if feats is None:
                    feats = np.zeros((len(images), out.shape[1]), dtype=np.float32)
                feats[index.numpy()] = out
                bar.update(len(index))
        return Extracted(feats[ok], skipped)


def default_cache_dir() -> Path:
    """$FRAMEWORK_DATA_CACHE/features, else ~/.cache/framework/features."""
    root = os.environ.get("FRAMEWORK_DATA_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "framework") / "features"


class FeatureCache:
    """Features on disk, one `.npz` per (extractor, content) key; written atomically (a temporary file renamed)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root).expanduser() if root else default_cache_dir()

    def path(self, extractor_key: str, content: str) -> Path:
        key = hashlib.blake2b(f"{extractor_key}\n{content}".encode(), digest_size=20).hexdigest()
        return self.root / f"{key}.npz"

    def load(self, path: Path) -> Extracted | None:
        """The cached features, or None when absent or unreadable (then recomputed and rewritten)."""
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                return Extracted(z["features"], json.loads(str(z["skipped"])), "reused", path)
        except (OSError, ValueError, KeyError):
            return None

    def store(self, path: Path, extracted: Extracted) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, features=extracted.features, skipped=np.array(json.dumps(extracted.skipped)))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def features(extractor: ImageFeatures, images: ImageSet, cache: FeatureCache | None, *, strict: bool = False,
             desc: str = "") -> Extracted:
    """Cached features of `images` (`cache="reused"`) or freshly extracted ones (`"new"`: the caller stores them
    with `cache.store(out.cache_file, out)` once everything succeeded, so a refused command writes nothing)."""
    if cache is None:
        return extractor.extract(images, strict=strict, desc=desc)
    path = cache.path(extractor.extractor.key(extractor.bf16), images.content)
    hit = cache.load(path)
    if hit is not None and (not strict or not hit.skipped):
        return hit
    out = extractor.extract(images, strict=strict, desc=desc)
    out.cache, out.cache_file = "new", path
    return out


__all__ = ["DEFAULT", "Extracted", "Extractor", "ExtractorUnavailable", "FeatureCache", "ImageFeatures", "ImageSet",
           "features", "folder_images", "resolve"]
