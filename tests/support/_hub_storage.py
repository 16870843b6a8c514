"""Storage and wire formats behind `LocalHub`: content-addressed blobs, immutable commits, branch refs, and
the pure helpers that turn them into (or parse them from) the Hub's JSON/NDJSON payloads.

Layout under `root`: `blobs/ab/<git-blob-sha1>` and `repos/<type>s/<ns>/<name>/` holding `meta.json`,
`refs.json` and `commits/<id>.json`. Every write goes to a temporary file then `os.replace`, and a branch
moves only after its commit file is on disk, so a failed commit never changes what a branch points to.
"""

from __future__ import annotations

import base64
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
_YAML_BLOCK = re.compile(r"^(\s*---[\r\n]+)([\S\s]*?)([\r\n]+---(\r\n|\n|$))")  # the client's own regex


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
def folder_oid(tree: dict[str, dict[str, Any]], folder: str) -> str:
    """A stable id for a folder: sha1 over the sorted (path, oid) pairs below it."""
    items = sorted(f"{p} {v['oid']}" for p, v in tree.items() if p.startswith(folder + "/"))
    return hashlib.sha1("\n".join(items).encode()).hexdigest()


def folders_of(tree: dict[str, dict[str, Any]]) -> set[str]:
    """All folder paths implied by the file paths of `tree`."""
    return {p.rsplit("/", i + 1)[0] for p in tree for i in range(p.count("/"))}


def list_tree(tree: dict[str, dict[str, Any]], folder: str, recursive: bool) -> list[dict[str, Any]] | None:
    """Tree entries under `folder` ("" = root) in the Hub's format, or None if `folder` is not a folder."""
    folder = folder.strip("/")
    folders = folders_of(tree)
    if folder and folder not in folders:
        return None
    prefix = f"{folder}/" if folder else ""

    def wanted(p: str) -> bool:
        return p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])

    entries = [{"type": "directory", "oid": folder_oid(tree, d), "size": 0, "path": d}
               for d in sorted(folders) if wanted(d)]
    entries += [{"type": "file", "oid": v["oid"], "size": v["size"], "path": p}
                for p, v in sorted(tree.items()) if wanted(p)]
    return entries


def with_last_commits(history: list[Commit], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tree entries plus `lastCommit`: the newest commit in `history` (newest first) that changed each one."""
    found: dict[str, dict[str, str]] = {}
    for newer, older in zip(history, history[1:] + [None], strict=True):
        old_tree = older.tree if older is not None else {}
        for p in (e["path"] for e in entries if e["path"] not in found):
            under = [q for q in set(newer.tree) | set(old_tree) if q == p or q.startswith(p + "/")]
            if any(newer.tree.get(q) != old_tree.get(q) for q in under):
                found[p] = {"id": newer.id, "title": newer.title, "date": newer.date}
    return [{**e, "lastCommit": found[e["path"]]} if e["path"] in found else e for e in entries]


# ---- wire formats -----------------------------------------------------------------------------------------
WHOAMI = {"type": "user", "id": "local-user-id", "name": USER_NAME, "fullname": "Local User", "email": None,
          "emailVerified": False, "isPro": False, "canPay": False, "orgs": [],
          "auth": {"type": "access_token", "accessToken": {"displayName": "local", "role": "write"}}}


def truthy(value: Any) -> bool:
    """Whether a query/form flag ("1", "true", "True") is set."""
    return str(value).lower() in ("1", "true")


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """`body` parsed as a JSON object (empty = {}); a 400 naming `what` otherwise."""
    try:
        data = json.loads(body or b"{}")
    except ValueError as err:
        raise HubError(400, f"{what} is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise HubError(400, f"{what} must be a JSON object, got {type(data).__name__}")
    return data


def yaml_front_matter(text: str) -> tuple[Any, str | None] | None:
    """(parsed YAML front matter, error message) of a README, or None without front matter or PyYAML."""
    match = _YAML_BLOCK.match(text)
    try:
        import yaml
    except ImportError:
        return None
    if not match:
        return None
    try:
        data = yaml.safe_load(match.group(2))
    except yaml.YAMLError as err:
        return None, f"Invalid YAML in README.md metadata: {err}"
    if data is not None and not isinstance(data, dict):
        return None, f"README.md metadata must be a YAML mapping, got {type(data).__name__}"
    return data, None


def repo_info_payload(storage: HubStorage, repo_type: str, repo_id: str, commit: Commit) -> dict[str, Any]:
    """The `/api/{type}s/{repo}[/revision/{rev}]` answer: id, sha, siblings, cardData from README.md."""
    meta = storage.meta(repo_type, repo_id)
    siblings = [{"rfilename": p, "size": v["size"], "blobId": v["oid"]}
                for p, v in sorted(commit.tree.items())]
    info: dict[str, Any] = {
        "id": repo_id, "author": repo_id.split("/")[0], "sha": commit.id, "lastModified": commit.date,
        "createdAt": meta["createdAt"], "private": meta["private"], "gated": False, "disabled": False,
        "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
    }
    if repo_type == "model":
        info["modelId"] = repo_id
    readme = commit.tree.get("README.md")
    parsed = readme and yaml_front_matter(storage.blob_path(readme["oid"]).read_text("utf-8", "replace"))
    if parsed and isinstance(parsed[0], dict):
        card = info["cardData"] = parsed[0]
        info["tags"] = [str(t) for t in card["tags"]] if isinstance(card.get("tags"), list) else []
        info.update({k: card[k] for k in ("library_name", "pipeline_tag") if isinstance(card.get(k), str)})
    return info


def commit_payload(commit: Commit) -> dict[str, Any]:
    """One entry of the `/commits/{rev}` listing."""
    return {"id": commit.id, "title": commit.title, "message": commit.message, "date": commit.date,
            "authors": [{"user": a} for a in commit.authors],
            "formatted": {"title": commit.title, "message": commit.message}}


def parse_commit_payload(body: bytes) -> tuple[dict[str, Any], list[tuple]]:
    """(header, ops) from the client's NDJSON commit body; any malformed line is a 400 naming it."""
    header, ops = None, []
    for n, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                raw, b64 = value["content"], value.get("encoding") == "base64"
                ops.append(("add", check_repo_path(value["path"]),
                            base64.b64decode(raw, validate=True) if b64 else raw.encode()))
            elif key in ("deletedFile", "deletedFolder"):
                ops.append(("delete_file" if key == "deletedFile" else "delete_folder", value["path"]))
            elif key == "lfsFile":
                raise HubError(400, f"LocalHub stores no LFS files (preupload said regular): {value['path']}")
            else:
                raise HubError(400, f"unknown commit payload key {key!r} on line {n}")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise HubError(400, f"commit payload line {n} is malformed: {err!r}") from err
    if not isinstance(header, dict) or not header.get("summary"):
        raise HubError(400, "commit payload needs a header line with a non-empty 'summary'")
    return header, ops


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """Inclusive (start, end) of a single `bytes=` Range over `size` bytes; None to serve it all (RFC 9110:
    an absent or unparseable Range is ignored); a 416 `HubError` when it cannot be satisfied."""
    wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", (value or "").strip())
    if wanted is None or wanted.groups() == ("", ""):
        return None
    first, last = wanted.groups()
    start = int(first) if first else max(0, size - int(last))
    end = min(int(last), size - 1) if first and last else size - 1
    if start >= size or start > end or (not first and int(last) == 0):
        raise HubError(416, f"range {wanted.group(0)!r} not satisfiable for {size} bytes")
    return start, end
