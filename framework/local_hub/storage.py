"""Storage behind `LocalHub`: content-addressed blobs, immutable commits and branch refs (the Hub's JSON/NDJSON
payloads built from them, and parsed into them, are `framework.local_hub.wire`).

Layout under `root`: `blobs/ab/<git-blob-sha1>` and `repos/<type>s/<ns>/<name>/` holding `meta.json`,
`refs.json` and `commits/<id>.json`. Every write goes to a temporary file then `os.replace`, and a branch
moves only after its commit file is on disk, so a failed commit never changes what a branch points to.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_TYPES = ("model", "dataset", "space")
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
USER_NAME = "local-user"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_BRANCH_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


class HubError(Exception):
    """An error the server turns into an HTTP response; `code` becomes the `X-Error-Code` header."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


def git_blob_sha(data: bytes) -> str:
    """The git blob id of `data` (what the Hub reports as the `oid`/ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def now_iso() -> str:
    """Current UTC time in the Hub's `%Y-%m-%dT%H:%M:%S.%fZ` (milliseconds) format."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def check_repo_path(path: str) -> str:
    """Return `path` if it is a valid relative file path inside a repo, else raise a 400 naming it."""
    parts = path.split("/")
    if not path or len(path) > 1000 or any(p in ("", ".", "..") for p in parts) or parts[0] == ".git":
        raise HubError(400, f"invalid path in repo: {path!r} (relative, no empty/'.'/'..' segment, not .git)")
    return path


@dataclass
class Commit:
    """One immutable commit: its parent and the full tree (path → {"oid", "size"})."""

    id: str
    parent: str | None
    tree: dict[str, dict[str, Any]]
    title: str
    message: str
    date: str
    authors: list[str] = field(default_factory=lambda: [USER_NAME])


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class HubStorage:
    """Repos, commits and blobs persisted under `root`; writes are serialised by one lock."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "repos").mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()

    # ---- repos -------------------------------------------------------------------------------------------
    def repo_dir(self, repo_type: str, repo_id: str) -> Path:
        """Directory of `repo_id`; raises a 400 for an unknown type or a malformed id."""
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"unknown repo type {repo_type!r}; expected one of {REPO_TYPES}")
        parts = repo_id.split("/")
        if len(parts) != 2 or not all(_NAME_RE.match(p) and ".." not in p for p in parts):
            raise HubError(400, f"invalid repo id {repo_id!r}: expected 'namespace/name' of [A-Za-z0-9._-]")
        return self.root / "repos" / f"{repo_type}s" / parts[0] / parts[1]

    def require(self, repo_type: str, repo_id: str) -> Path:
        """Directory of an existing repo, or a 404 `RepoNotFound`."""
        path = self.repo_dir(repo_type, repo_id)
        if not (path / "refs.json").is_file():
            raise HubError(404, f"Repository {repo_type} {repo_id!r} not found", "RepoNotFound")
        return path

    def meta(self, repo_type: str, repo_id: str) -> dict[str, Any]:
        """Creation metadata of an existing repo (`private`, `createdAt`)."""
        return json.loads((self.require(repo_type, repo_id) / "meta.json").read_text())

    def create_repo(self, repo_type: str, repo_id: str, private: bool = False) -> bool:
        """Create a repo whose `main` holds an initial commit with `.gitattributes`; False if it existed."""
        with self.lock:
            path = self.repo_dir(repo_type, repo_id)
            if (path / "refs.json").is_file():
                return False
            meta = {"private": private, "createdAt": now_iso()}
            _atomic_write(path / "meta.json", json.dumps(meta).encode())
            gitattributes = b"# LocalHub stores every file as a plain git blob: no LFS, no Xet.\n"
            commit = self._write_commit(path, None, {}, [("add", ".gitattributes", gitattributes)],
                                        "initial commit", "")
            _atomic_write(path / "refs.json", json.dumps({"main": commit.id}).encode())
            return True

    def delete_repo(self, repo_type: str, repo_id: str) -> None:
        """Remove a repo (blobs stay in the shared store); 404 if it does not exist."""
        with self.lock:
            path = self.require(repo_type, repo_id)
            trash = self.root / "trash" / uuid.uuid4().hex
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, trash)  # atomic: the repo vanishes in one step, cleanup happens after
        shutil.rmtree(trash, ignore_errors=True)

    # ---- refs and commits --------------------------------------------------------------------------------
    def branches(self, repo_type: str, repo_id: str) -> dict[str, str]:
        """Branch name → commit id."""
        return json.loads((self.require(repo_type, repo_id) / "refs.json").read_text())

    def resolve(self, repo_type: str, repo_id: str, revision: str) -> Commit:
        """The commit a branch name or a 40-hex commit id designates; 404 `RevisionNotFound` otherwise."""
        path = self.require(repo_type, repo_id)
        name = revision.removeprefix("refs/heads/")
        branches = json.loads((path / "refs.json").read_text())
        commit_id = branches.get(name)
        if commit_id is None and COMMIT_RE.match(revision) and (path / f"commits/{revision}.json").is_file():
            commit_id = revision
        if commit_id is None:
            raise HubError(404, f"Invalid rev id: {revision!r} is neither a branch nor a commit of {repo_id}",
                           "RevisionNotFound")
        return self._load(path, commit_id)

    def history(self, repo_type: str, repo_id: str, revision: str) -> list[Commit]:
        """Commits reachable from `revision`, newest first."""
        path = self.require(repo_type, repo_id)
        commits = [self.resolve(repo_type, repo_id, revision)]
        while commits[-1].parent is not None:
            commits.append(self._load(path, commits[-1].parent))
        return commits

    def _load(self, path: Path, commit_id: str) -> Commit:
        return Commit(**json.loads((path / "commits" / f"{commit_id}.json").read_text()))

    def create_branch(self, repo_type: str, repo_id: str, branch: str, start: str = "main") -> None:
        """Point a new branch at the commit `start` resolves to; 409 if the branch exists."""
        with self.lock:
            if not _BRANCH_RE.match(branch) or ".." in branch:
                raise HubError(400, f"invalid branch name {branch!r}")
            path, commit = self.require(repo_type, repo_id), self.resolve(repo_type, repo_id, start)
            branches = json.loads((path / "refs.json").read_text())
            if branch in branches:
                raise HubError(409, f"branch {branch!r} already exists in {repo_id}")
            _atomic_write(path / "refs.json", json.dumps({**branches, branch: commit.id}).encode())

    def delete_branch(self, repo_type: str, repo_id: str, branch: str) -> None:
        """Remove a branch other than `main`; 404 `RevisionNotFound` if it does not exist."""
        with self.lock:
            path = self.require(repo_type, repo_id)
            branches = json.loads((path / "refs.json").read_text())
            if branch == "main" or branch not in branches:
                raise HubError(404 if branch != "main" else 403, f"cannot delete branch {branch!r}",
                               "RevisionNotFound" if branch != "main" else None)
            del branches[branch]
            _atomic_write(path / "refs.json", json.dumps(branches).encode())

    def commit(self, repo_type: str, repo_id: str, branch: str, ops: list[tuple], title: str, message: str,
               parent_commit: str | None = None) -> Commit:
        """Apply `ops` ("add", path, bytes) / ("delete_file"|"delete_folder", path) to `branch` as one commit.

        Everything is validated before anything is written; the branch moves last, in one atomic replace.
        """
        with self.lock:
            path = self.require(repo_type, repo_id)
            branch = branch.removeprefix("refs/heads/")
            branches = json.loads((path / "refs.json").read_text())
            if branch not in branches:
                raise HubError(404, f"Invalid rev id: {branch!r} is not a branch of {repo_id}",
                               "RevisionNotFound")
            head = self._load(path, branches[branch])
            if parent_commit is not None and parent_commit != head.id:
                raise HubError(412, f"parentCommit {parent_commit} is not the head of {branch!r} ({head.id})")
            commit = self._write_commit(path, head.id, head.tree, ops, title, message)
            _atomic_write(path / "refs.json", json.dumps({**branches, branch: commit.id}).encode())
            return commit

    def _write_commit(self, path: Path, parent: str | None, tree: dict, ops: list[tuple], title: str,
                      message: str) -> Commit:
        new_tree = dict(tree)
        blobs: dict[str, bytes] = {}
        for op in ops:
            kind, target = op[0], op[1].strip("/") if op[0] == "delete_folder" else op[1]
            if kind == "add":
                oid = git_blob_sha(op[2])
                blobs[oid] = op[2]
                new_tree[check_repo_path(target)] = {"oid": oid, "size": len(op[2])}
            elif kind == "delete_file":
                if new_tree.pop(target, None) is None:
                    raise HubError(404, f"A file with this name doesn't exist: {target!r}", "EntryNotFound")
            elif kind == "delete_folder":
                doomed = [p for p in new_tree if target == "" or p.startswith(target + "/")]
                if not doomed:
                    raise HubError(404, f"A folder with this name doesn't exist: {target!r}", "EntryNotFound")
                for p in doomed:
                    del new_tree[p]
            else:
                raise HubError(400, f"unknown commit operation {kind!r}")
        for p in new_tree:  # a path cannot be both a file and a folder
            for i in range(p.count("/")):
                prefix = p.rsplit("/", i + 1)[0]
                if prefix in new_tree:
                    raise HubError(400, f"path conflict: {p!r} needs folder {prefix!r}, which is a file")
        for oid, data in blobs.items():
            blob = self.blob_path(oid)
            if not blob.is_file():
                _atomic_write(blob, data)
        date = now_iso()
        seed = json.dumps([str(path), parent, new_tree, title, message, date, uuid.uuid4().hex]).encode()
        commit = Commit(hashlib.sha1(seed).hexdigest(), parent, new_tree, title, message, date)
        _atomic_write(path / "commits" / f"{commit.id}.json", json.dumps(asdict(commit)).encode())
        return commit

    def blob_path(self, oid: str) -> Path:
        """Where the blob `oid` lives on disk."""
        return self.root / "blobs" / oid[:2] / oid


# ---- tree views -----------------------------------------------------------------------------------------
