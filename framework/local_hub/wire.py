"""The Hub's wire formats for `LocalHub`: the pure helpers that turn stored commits and trees into the Hub's JSON
payloads, and parse its NDJSON commits, JSON bodies, `Range` headers and model-card front matter."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from framework.local_hub.storage import USER_NAME, Commit, HubError, HubStorage, check_repo_path

_YAML_BLOCK = re.compile(r"^(\s*---[\r\n]+)([\S\s]*?)([\r\n]+---(\r\n|\n|$))")  # the client's own regex


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
