"""The server behind `LocalHub`: a loopback-only Hugging Face Hub-compatible HTTP API, so tests and offline users
can drive the real `huggingface_hub` client (create/upload/download/snapshot/ModelCard/HubMixin) without the internet.

    with LocalHub(tmp_path / "hub") as hub, patch_client(hub.url, tmp_path / "cache"):
        HfApi(endpoint=hub.url).create_repo("me/model")

Repos persist under `root` (see `framework.local_hub.storage`; the payloads are `framework.local_hub.wire`), so
a restarted server on the same root serves the same revisions. Files are always plain git blobs: no LFS, no Xet, no
pull requests, no auth checks.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import mimetypes
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from framework.local_hub.routes import RepoRoutes
from framework.local_hub.storage import REPO_TYPES, URL_PREFIX, USER_NAME, HubError, HubStorage
from framework.local_hub.wire import WHOAMI, json_object, parse_range, yaml_front_matter

__all__ = ["LocalHub", "main"]

log = logging.getLogger(__name__)


def _loopback_host(host: str) -> str:
    """`host` as a loopback IP literal; raises ValueError for anything that is not loopback."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if ip is None or not ip.is_loopback:
        raise ValueError(f"LocalHub binds only loopback hosts (127.0.0.0/8, ::1, localhost), not {host!r}")
    return str(ip)


class _Handler(RepoRoutes, BaseHTTPRequestHandler):
    """Routes one request to the Hub endpoint it imitates (the per-repo ones in `framework.local_hub.routes`); every
    error becomes a Hub-style JSON 4xx/5xx."""

    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1.0"
    timeout = 60  # idle keep-alive connections are dropped after this
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.verbose:
            super().log_message(format, *args)

    # ---- plumbing ----------------------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        self._method, self._responded = method, False
        try:
            self._route(method, self._read_body())
        except HubError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # a server bug: report it to the client and the log, then hang up
            log.exception("LocalHub failed on %s %s", method, self.path)
            self._error(HubError(500, f"LocalHub internal error on {method} {self.path}: {err!r}"))
            self.close_connection = True

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length") or "0"
        if self.headers.get("Transfer-Encoding") or not length.isdigit():
            self.close_connection = True  # the body's extent is unknown, so the connection cannot be reused
            raise HubError(411, f"{self.command} {self.path}: send the body with a Content-Length, unchunked")
        return self.rfile.read(int(length))

    def _json(self, payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._responded = True
        if self._method != "HEAD":
            self.wfile.write(body)

    def _error(self, err: HubError) -> None:
        if self._responded:  # failed mid-body: the only honest signal left is dropping the connection
            self.close_connection = True
            return
        message = " ".join(err.message.encode("ascii", "backslashreplace").decode().split())[:500]
        headers = {"X-Error-Message": message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._json({"error": err.message}, err.status, headers)

    def _body_json(self, body: bytes) -> dict[str, Any]:
        return json_object(body, f"body of {self._method} {self.path}")

    def _base(self) -> str:
        """The URL the client reached us by, so returned URLs parse back against its endpoint."""
        return f"http://{self.headers.get('Host') or self.server.host_port}"

    # ---- routing -----------------------------------------------------------------------------------------
    def _route(self, method: str, body: bytes) -> None:
        split = urlsplit(self.path)
        segs = [unquote(s) for s in split.path.split("/")[1:]]  # split before unquoting: revs may hold %2F
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        if segs[:1] == ["api"]:
            done = self._api(method, segs[1:], query, body)
        else:
            done = self._resolve(method, segs)
        if not done:
            raise HubError(404, f"LocalHub has no route for {method} {split.path}")

    def _api(self, method: str, segs: list[str], query: dict[str, str], body: bytes) -> bool:
        st = self.server.storage
        if (method, segs) == ("GET", ["whoami-v2"]):
            self._json(WHOAMI)
        elif (method, segs) == ("POST", ["validate-yaml"]):
            parsed = yaml_front_matter(self._body_json(body).get("content", ""))
            if parsed and parsed[1]:
                self._json({"error": parsed[1], "errors": [{"message": parsed[1]}], "warnings": []}, 400)
            else:
                self._json({"errors": [], "warnings": []})
        elif (method, segs) in (("POST", ["repos", "create"]), ("DELETE", ["repos", "delete"])):
            data = self._body_json(body)
            if not data.get("name"):
                raise HubError(400, f"{method} /api/{'/'.join(segs)} needs a 'name', got {data!r}")
            repo_type = data.get("type") or "model"
            repo_id = f"{data.get('organization') or USER_NAME}/{data['name']}"
            url = f"{self._base()}/{URL_PREFIX.get(repo_type, '')}{repo_id}"
            private = bool(data.get("private")) or data.get("visibility") == "private"
            if method == "DELETE":
                st.delete_repo(repo_type, repo_id)
                self._json({})
            elif st.create_repo(repo_type, repo_id, private):
                self._json({"url": url, "name": repo_id, "id": repo_id})
            else:
                self._json({"error": f"You already created this {repo_type} repo {repo_id}", "url": url}, 409)
        elif segs and segs[0].endswith("s") and segs[0][:-1] in REPO_TYPES:
            return self._repo_api(method, segs[0][:-1], segs[1:], query, body)
        else:
            return False
        return True

    def _resolve(self, method: str, segs: list[str]) -> bool:
        """`HEAD`/`GET /[datasets/|spaces/]{ns}/{name}/resolve/{rev}/{path}` with Range support; never Xet."""
        repo_type = "model"
        if segs[:1] in (["datasets"], ["spaces"]) and segs[3:4] == ["resolve"]:
            repo_type, segs = segs[0][:-1], segs[1:]
        legacy_id = len(segs) >= 4 and segs[1] == "resolve" and segs[2] != "resolve"  # e.g. /gpt2/resolve/..
        if method in ("GET", "HEAD") and legacy_id:
            raise HubError(404, f"Repository {segs[0]!r} not found (ids are 'ns/name')", "RepoNotFound")
        if method not in ("GET", "HEAD") or len(segs) < 5 or segs[2] != "resolve":
            return False
        repo_id, rev, path = f"{segs[0]}/{segs[1]}", segs[3], "/".join(segs[4:])
        st = self.server.storage
        commit = st.resolve(repo_type, repo_id, rev)
        entry = commit.tree.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path!r} in {repo_id} at {rev}", "EntryNotFound",
                           {"X-Repo-Commit": commit.id})
        size = entry["size"]
        headers = {"X-Repo-Commit": commit.id, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes",
                   "Content-Type": mimetypes.guess_type(path)[0] or "application/octet-stream"}
        try:
            span = parse_range(self.headers.get("Range"), size) if method == "GET" else None
        except HubError as err:
            err.headers["Content-Range"] = f"bytes */{size}"
            raise
        start, end = span or (0, size - 1)
        if span:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send_response(206 if span else 200)
        for key, value in {**headers, "Content-Length": str(end - start + 1)}.items():
            self.send_header(key, value)
        self.end_headers()
        self._responded = True
        if method == "GET":
            with open(st.blob_path(entry["oid"]), "rb") as f:
                f.seek(start)
                remaining = end - start + 1
                while remaining > 0 and (chunk := f.read(min(remaining, 1 << 20))):
                    self.wfile.write(chunk)
                    remaining -= len(chunk)
        return True


for _verb in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):  # every verb routes (unknown ones → 404)
    setattr(_Handler, f"do_{_verb}", lambda self, _verb=_verb: self._dispatch(_verb))


class _Server(ThreadingHTTPServer):
    """A threading HTTP server that tracks open connections so `stop()` can cut keep-alive clients off."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], storage: HubStorage, verbose: bool) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.storage, self.verbose = storage, verbose
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        """Bind without HTTPServer's getfqdn(): a DNS lookup that can stall on offline machines."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])
        host = f"[{self.server_name}]" if ":" in self.server_name else self.server_name
        self.host_port = f"{host}:{self.server_port}"

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conns_lock:
                self._conns.discard(request)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class LocalHub:
    """A Hub-compatible server over the repos under `root`, on a loopback `host`:`port` (0 = a free port)."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0,
                 verbose: bool = False) -> None:
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"port={port} must be in [0, 65535] (0 picks a free port)")
        self.host, self.verbose, self._port = _loopback_host(host), verbose, int(port)
        self.root = Path(root).expanduser().resolve()
        self.storage = HubStorage(self.root)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> LocalHub:
        """Bind and serve in a daemon thread; returns self so `hub = LocalHub(root).start()` reads well."""
        if self._server is not None:
            raise RuntimeError(f"LocalHub is already serving {self.url}")
        self._server = _Server((self.host, self._port), self.storage, self.verbose)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"LocalHub-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, drop open connections and release the port; repos stay on disk. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def port(self) -> int:
        """The bound port while serving, else the requested one."""
        return int(self._server.server_address[1]) if self._server is not None else self._port

    @property
    def url(self) -> str:
        """Base URL to use as `HF_ENDPOINT`, e.g. `http://127.0.0.1:8765`."""
        if self._server is None:
            raise RuntimeError("LocalHub is not serving: call start() (or use it as a context manager) first")
        return f"http://{self._server.host_port}"

    def __enter__(self) -> LocalHub:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: serve `--root` on loopback `--host`:`--port` until Ctrl-C; prints the HF_ENDPOINT to export."""
    parser = argparse.ArgumentParser(
        prog="python -m framework.local_hub", description="Serve a loopback-only Hugging Face Hub-compatible API "
        "from --root, for offline tests and users; then `export HF_ENDPOINT=<printed url>`.")
    parser.add_argument("--root", required=True, help="directory holding the repos (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address: 127.0.0.0/8, ::1 or localhost")
    parser.add_argument("--port", type=int, default=8765, help="port to bind (0 picks a free one)")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    try:
        hub = LocalHub(args.root, host=args.host, port=args.port, verbose=args.verbose).start()
    except ValueError as err:
        parser.error(str(err))
    except OSError as err:
        parser.exit(1, f"framework.local_hub: cannot bind {args.host}:{args.port}: {err}\n")
    print(f"LocalHub serving {hub.root} at {hub.url}", flush=True)
    print(f"export HF_ENDPOINT={hub.url}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops as cleanly as Ctrl-C
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        hub.stop()
    return 0
