"""A Hub dataset as a source: the commit its revision names, its config, and the way it works offline.

Online, one request resolves `data.revision` (a branch, tag or commit; `main` by default) to a commit sha; the
answer is remembered under the data cache (`sources/hub-*.json`). With `HF_HUB_OFFLINE=1` (a compute node without
internet) nothing is asked: a revision that is a full commit sha is used as it is, so data prepared at that commit
(`python -m framework.data prepare ... data.revision=<sha>`) trains from the cache; an unpinned one is refused with
the commit it would use (the one remembered) and how to pin it. `data.config=` names one of the dataset's configs
(a did-you-mean over them when it is not one).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from framework.errors import InputError

_SHA = re.compile(r"^[0-9a-f]{40}$")


def _memo(root: Path, repo_id: str, revision: str) -> Path:
    key = hashlib.sha256(f"{repo_id}@{revision}".encode()).hexdigest()[:24]
    return root / "sources" / f"hub-{key}.json"


def _recall(root: Path, repo_id: str, revision: str) -> dict[str, Any] | None:
    try:
        return json.loads(_memo(root, repo_id, revision).read_text())
    except (OSError, ValueError):
        return None


def _keep(root: Path, repo_id: str, revision: str, answer: dict[str, Any]) -> None:
    path = _memo(root, repo_id, revision)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(answer))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the next online run asks again
        pass


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def resolve_hub(repo_id: str, revision: str | None, config: str | None, root: Path, formats: dict[str, str]
                ) -> dict[str, Any]:
    """A Hub dataset's `Source` fields: its commit sha now (or, offline, the pinned one) and its files' format
    (`formats`: extension → builder)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    from framework.data.text_files import inner_suffix

    fields = {"spec": repo_id, "builder": "hub", "repo_id": repo_id, "revision": revision, "config": config,
              "memo": root}

    asked = revision or "main"
    if offline():
        seen = _recall(root, repo_id, asked)
        if revision is not None and _SHA.match(revision):
            fmt = (_recall(root, repo_id, revision) or {}).get("format", "hub")
            return {**fields, "sha": revision, "format": fmt}
        would = (f"the prepared copy here is at commit {seen['sha']}: add data.revision={seen['sha']}" if seen else
                 "prepare it on a node with internet, pinned: python -m framework.data prepare ... "
                 "data.revision=<the commit sha>")
        raise InputError(f"data.source={repo_id}: HF_HUB_OFFLINE=1 and data.revision={asked} is not a commit sha, "
                         f"so it cannot be resolved without the Hub; {would}")
    try:
        info = HfApi().dataset_info(repo_id, revision=revision)
    except RevisionNotFoundError:
        raise InputError(f"data.revision={revision}: the Hub dataset '{repo_id}' at {constants.ENDPOINT} has no "
                         "such branch, tag or commit") from None
    except RepositoryNotFoundError:
        raise InputError(f"data.source={repo_id}: no such local file or folder, and the Hub at {constants.ENDPOINT} "
                         f"has no dataset repo '{repo_id}' (or it is private and this token cannot read it)") from None
    except Exception as err:  # noqa: BLE001 - offline, unreachable: say which Hub and why, in one line
        raise InputError(f"data.source={repo_id}: no such local file or folder, and the Hub at {constants.ENDPOINT} "
                         f"cannot be asked for the dataset '{repo_id}' ({_short(err)}); on a node without "
                         "internet set HF_HUB_OFFLINE=1 and pin data.revision= to a prepared commit") from None
    suffixes = {inner_suffix(f.rfilename) for f in info.siblings or []}
    kinds = sorted({formats[suffix] for suffix in suffixes if suffix in formats})
    fmt = "+".join(kinds) or "hub"
    for key in {asked, info.sha}:
        _keep(root, repo_id, key, {"sha": info.sha, "format": fmt})
    return {**fields, "sha": info.sha, "format": fmt}


def _short(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]


def hub_splits(source: Any, datasets: Any) -> list[str]:
    """The split names of the dataset's config (`data.config=`, checked against the configs it has); `datasets`:
    the module."""
    configs = list(datasets.get_dataset_config_names(source.repo_id, revision=source.sha))
    if source.config is not None and source.config not in configs:
        close = difflib.get_close_matches(source.config, configs, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise InputError(f"data.config={source.config!r} is not a config of the Hub dataset '{source.repo_id}'."
                         f"{hint} Its configs: {', '.join(configs)}")
    if source.config is None and len(configs) > 1:
        try:
            return list(datasets.load_dataset(source.repo_id, revision=source.sha, streaming=True))
        except ValueError:  # no default config: the user picks one
            raise InputError(f"data.source={source.repo_id} has {len(configs)} configs and no default: name one "
                             f"with data.config= ({', '.join(configs)})") from None
    return list(datasets.load_dataset(source.repo_id, source.config, revision=source.sha, streaming=True))


__all__ = ["hub_splits", "offline", "resolve_hub"]
