"""The per-repo endpoints of `LocalHub`, `/api/{models,datasets,spaces}/{ns}/{name}/...`: a mixin of its
request handler, split into the read side (info, tree, paths-info, refs, commits) and the write side
(preupload, commit, branches). Each returns False for a route it does not serve, so the caller can 404."""

from __future__ import annotations

from urllib.parse import parse_qs

from framework.local_hub.storage import URL_PREFIX, HubError, HubStorage
from framework.local_hub.wire import (
    commit_payload,
    list_tree,
    parse_commit_payload,
    repo_info_payload,
    truthy,
    with_last_commits,
)


class RepoRoutes:
    """Mixed into the handler, whose `_json`, `_body_json`, `_base`, `headers` and `server.storage` it uses."""

    def _repo_api(self, method: str, repo_type: str, segs: list[str], query: dict[str, str], body: bytes) -> bool:
        if len(segs) == 1:  # a namespace-less legacy id such as "gpt2"
            raise HubError(404, f"Repository {segs[0]!r} not found (ids are 'ns/name')", "RepoNotFound")
        if not segs:
            return False
        repo = (repo_type, f"{segs[0]}/{segs[1]}")
        return (self._repo_read(method, repo, segs[2:], query, body)
                or self._repo_write(method, repo, segs[2:], query, body))

    def _repo_read(self, method: str, repo: tuple[str, str], rest: list[str], query: dict[str, str],
                   body: bytes) -> bool:
        st: HubStorage = self.server.storage
        repo_type, repo_id = repo
        match (method, rest):
            case ("GET", []) | ("GET", ["revision", _]):
                commit = st.resolve(repo_type, repo_id, rest[1] if rest else "main")
                self._json(repo_info_payload(st, repo_type, repo_id, commit))
            case ("GET", ["tree", rev, *path]):
                commit = st.resolve(repo_type, repo_id, rev)
                entries = list_tree(commit.tree, "/".join(path), truthy(query.get("recursive")))
                if entries is None:
                    raise HubError(404, f"{'/'.join(path)!r} is not a folder of {repo_id} at {rev}",
                                   "EntryNotFound", {"X-Repo-Commit": commit.id})
                if truthy(query.get("expand")):
                    entries = with_last_commits(st.history(repo_type, repo_id, commit.id), entries)
                self._json(entries)
            case ("POST", ["paths-info", rev]):
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    data = self._body_json(body)
                else:
                    data = {k: v if k == "paths" else v[-1] for k, v in parse_qs(body.decode()).items()}
                paths = data.get("paths") or []
                wanted = {p.strip("/") for p in ([paths] if isinstance(paths, str) else paths)}
                commit = st.resolve(repo_type, repo_id, rev)
                entries = [e for e in list_tree(commit.tree, "", recursive=True) or [] if e["path"] in wanted]
                if truthy(data.get("expand")):
                    entries = with_last_commits(st.history(repo_type, repo_id, commit.id), entries)
                self._json(entries)
            case ("GET", ["refs"]):
                branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c}
                            for n, c in sorted(st.branches(repo_type, repo_id).items())]
                self._json({"branches": branches, "converts": [], "tags": [], "pullRequests": []})
            case ("GET", ["commits", rev]):
                self._json([commit_payload(c) for c in st.history(repo_type, repo_id, rev)])
            case _:
                return False
        return True

    def _repo_write(self, method: str, repo: tuple[str, str], rest: list[str], query: dict[str, str],
                    body: bytes) -> bool:
        st: HubStorage = self.server.storage
        repo_type, repo_id = repo
        match (method, rest):
            case ("POST", ["preupload", rev]):  # always "regular": the client never takes the LFS/Xet path
                commit = st.resolve(repo_type, repo_id, rev)
                files = [{"path": f.get("path"), "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                         for f in self._body_json(body).get("files") or []]
                self._json({"commitOid": commit.id, "files": files})
            case ("POST", ["commit", rev]):
                if truthy(query.get("create_pr")):
                    raise HubError(400, f"LocalHub does not support pull requests (create_pr=1 on {repo_id})")
                header, ops = parse_commit_payload(body)
                commit = st.commit(repo_type, repo_id, rev, ops, header["summary"],
                                   header.get("description") or "", header.get("parentCommit"))
                url = f"{self._base()}/{URL_PREFIX[repo_type]}{repo_id}/commit/{commit.id}"
                self._json({"commitUrl": url, "commitOid": commit.id, "pullRequestUrl": None})
            case ("POST", ["branch", branch]):
                start = self._body_json(body).get("startingPoint") or "main"
                st.create_branch(repo_type, repo_id, branch, start)
                self._json({})
            case ("DELETE", ["branch", branch]):
                st.delete_branch(repo_type, repo_id, branch)
                self._json({})
            case _:
                return False
        return True
