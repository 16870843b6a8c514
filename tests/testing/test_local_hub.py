"""The local Hub server driven by the real `huggingface_hub` client: uploads, downloads, revisions, cards,
the PyTorch mixin, typed errors, persistence across restarts, and the loopback-only guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")

from huggingface_hub import HfApi, ModelCard, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from framework.local_hub import LocalHub, patch_client  # noqa: E402
from framework.local_hub.storage import git_blob_sha  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Hub:
    server: LocalHub
    api: HfApi
    root: Path

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A running LocalHub with the in-process client pointed at it and its cache in tmp_path."""
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    server = LocalHub(tmp_path / "hub").start()
    try:
        with patch_client(server.url, tmp_path / "cache", token="dummy"):
            yield Hub(server, HfApi(endpoint=server.url), tmp_path / "hub")
    finally:
        server.stop()


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "upload"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"width": 4}))
    (folder / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 40)
    (folder / "sub" / "empty.txt").write_bytes(b"")
    return folder


def test_create_upload_list_download_and_snapshot(hub: Hub, tmp_path: Path) -> None:
    url = hub.api.create_repo("alice/tiny")
    assert url.repo_id == "alice/tiny" and url.endpoint == hub.url
    assert hub.api.create_repo("alice/tiny", exist_ok=True).repo_id == "alice/tiny"
    folder = _folder(tmp_path)
    info = hub.api.upload_folder(repo_id="alice/tiny", folder_path=folder, commit_message="add files")
    assert len(info.oid) == 40 and info.repo_url.repo_id == "alice/tiny"

    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(hub.api.list_repo_files("alice/tiny")) == files | {".gitattributes"}
    top = {(e.path, type(e).__name__) for e in hub.api.list_repo_tree("alice/tiny")}
    assert ("sub", "RepoFolder") in top and ("config.json", "RepoFile") in top
    (paths_info,) = hub.api.get_paths_info("alice/tiny", ["sub/weights.bin", "missing.txt"])
    assert paths_info.blob_id == git_blob_sha((folder / "sub" / "weights.bin").read_bytes())

    local = hf_hub_download("alice/tiny", "sub/weights.bin")
    assert Path(local).read_bytes() == (folder / "sub" / "weights.bin").read_bytes()
    snapshot = Path(snapshot_download("alice/tiny"))
    for rel in files:
        assert (snapshot / rel).read_bytes() == (folder / rel).read_bytes(), rel
    assert hub.api.model_info("alice/tiny").sha == info.oid


def test_two_commits_are_two_revisions(hub: Hub) -> None:
    hub.api.create_repo("alice/rev")
    first = hub.api.upload_file(path_or_fileobj=b"v1", path_in_repo="w.txt", repo_id="alice/rev")
    second = hub.api.upload_file(path_or_fileobj=b"v2", path_in_repo="w.txt", repo_id="alice/rev")
    commits = hub.api.list_repo_commits("alice/rev")
    assert [c.commit_id for c in commits[:2]] == [second.oid, first.oid] and len(commits) == 3  # + initial
    assert Path(hf_hub_download("alice/rev", "w.txt")).read_bytes() == b"v2"
    assert Path(hf_hub_download("alice/rev", "w.txt", revision=first.oid)).read_bytes() == b"v1"
    assert hub.api.model_info("alice/rev", revision=first.oid).sha == first.oid
    (branch,) = hub.api.list_repo_refs("alice/rev").branches
    assert (branch.name, branch.target_commit) == ("main", second.oid)


def test_failed_commit_leaves_main_unchanged(hub: Hub) -> None:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    hub.api.create_repo("alice/atomic")
    before = hub.api.model_info("alice/atomic").sha
    ops = [CommitOperationAdd("new.txt", b"x"), CommitOperationDelete("does-not-exist.txt")]
    with pytest.raises(EntryNotFoundError):
        hub.api.create_commit("alice/atomic", ops, commit_message="half")
    assert hub.api.model_info("alice/atomic").sha == before
    assert "new.txt" not in hub.api.list_repo_files("alice/atomic")


def test_model_card_push_and_load(hub: Hub) -> None:
    hub.api.create_repo("alice/card")
    card = ModelCard("---\nlicense: mit\ntags:\n- local-hub\n---\n\n# Tiny\n\nA test card.\n")
    card.push_to_hub("alice/card")
    loaded = ModelCard.load("alice/card")
    assert loaded.data.license == "mit" and loaded.data.tags == ["local-hub"]
    assert "A test card." in loaded.text
    info = hub.api.model_info("alice/card")
    assert info.card_data.license == "mit" and info.tags == ["local-hub"]
    pytest.importorskip("yaml")
    with pytest.raises(ValueError, match="Invalid metadata"):  # rejected by the server's validate-yaml
        hub.api.upload_file(path_or_fileobj=b"---\nlicense: [mit\n---\nbroken\n", path_in_repo="README.md",
                            repo_id="alice/card")


def test_pytorch_model_hub_mixin_round_trip(hub: Hub) -> None:
    torch = pytest.importorskip("torch")
    from huggingface_hub import PyTorchModelHubMixin

    class Tiny(torch.nn.Module, PyTorchModelHubMixin):
        def __init__(self, width: int = 3) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(width, 2)

    torch.manual_seed(0)
    model = Tiny(width=5)
    model.push_to_hub("alice/mixin")
    loaded = Tiny.from_pretrained("alice/mixin")
    assert loaded.linear.in_features == 5
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_typed_errors(hub: Hub) -> None:
    hub.api.create_repo("alice/errs")
    hub.api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="alice/errs")
    with pytest.raises(RepositoryNotFoundError):
        hub.api.model_info("alice/nope")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("alice/nope", "x.txt")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("alice/errs", "missing.txt")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("alice/errs", "x.txt", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hub.api.list_repo_files("alice/errs", revision="f" * 40)


def test_delete_repo(hub: Hub) -> None:
    hub.api.create_repo("alice/gone")
    assert hub.api.repo_exists("alice/gone")
    hub.api.delete_repo("alice/gone")
    assert not hub.api.repo_exists("alice/gone")
    with pytest.raises(RepositoryNotFoundError):
        hub.api.delete_repo("alice/gone")
    hub.api.delete_repo("alice/gone", missing_ok=True)


def test_resolve_headers_and_ranges(hub: Hub) -> None:
    hub.api.create_repo("alice/raw")
    data = bytes(range(200))
    commit = hub.api.upload_file(path_or_fileobj=data, path_in_repo="d/x.bin", repo_id="alice/raw")
    file_url = f"{hub.url}/alice/raw/resolve/main/d/x.bin"
    with urllib.request.urlopen(urllib.request.Request(file_url, headers={"Range": "bytes=10-19"})) as resp:
        assert resp.status == 206 and resp.read() == data[10:20]
        assert resp.headers["X-Repo-Commit"] == commit.oid
        assert resp.headers["ETag"] == f'"{git_blob_sha(data)}"' and "X-Xet-Hash" not in resp.headers
        assert resp.headers["Content-Range"] == "bytes 10-19/200"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(file_url, headers={"Range": "bytes=500-"}))
    assert err.value.code == 416
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{hub.url}/api/nonsense/route")
    assert err.value.code == 404 and "no route for GET /api/nonsense/route" in err.value.read().decode()


def test_repos_survive_a_restart(tmp_path: Path) -> None:
    with LocalHub(tmp_path / "hub") as first, patch_client(first.url, tmp_path / "cache1"):
        HfApi(endpoint=first.url).create_repo("alice/keep")
        commit = HfApi(endpoint=first.url).upload_file(path_or_fileobj=b"kept", path_in_repo="k.txt",
                                                       repo_id="alice/keep")
    with LocalHub(tmp_path / "hub") as second, patch_client(second.url, tmp_path / "cache2"):
        assert Path(hf_hub_download("alice/keep", "k.txt")).read_bytes() == b"kept"
        assert HfApi(endpoint=second.url).model_info("alice/keep").sha == commit.oid
        assert HfApi(endpoint=second.url).create_repo("alice/keep", exist_ok=True).repo_id == "alice/keep"


def test_stopped_server_gives_connection_error(hub: Hub) -> None:
    hub.api.create_repo("alice/down")
    cached = hf_hub_download("alice/down", ".gitattributes")  # also leaves a keep-alive connection open
    hub.server.stop()
    connect_errors: list[type[BaseException]] = [ConnectionError]
    for module in ("httpx2", "httpx", "requests"):
        mod = sys.modules.get(module)
        connect_errors += [getattr(mod, n) for n in ("ConnectError", "ConnectionError") if hasattr(mod, n)]
    with pytest.raises(tuple(connect_errors)):
        hub.api.model_info("alice/down")
    # Downloads fall back to the cache (the client retries for ~20 s only when nothing is cached).
    assert hf_hub_download("alice/down", ".gitattributes") == cached


def test_refuses_non_loopback_hosts(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "192.168.1.10", "example.com", "::"):
        with pytest.raises(ValueError, match="loopback"):
            LocalHub(tmp_path, host=host)
    assert LocalHub(tmp_path, host="localhost").host == "127.0.0.1"
    assert LocalHub(tmp_path, host="127.0.0.2").host == "127.0.0.2"


def test_patch_client_restores_the_client(tmp_path: Path) -> None:
    from huggingface_hub import constants

    before = (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE)
    with patch_client("http://127.0.0.1:1/", tmp_path):
        assert constants.ENDPOINT == "http://127.0.0.1:1" and constants.HF_HUB_CACHE == str(tmp_path)
    assert (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE) == before


def test_cli_help() -> None:
    result = subprocess.run([sys.executable, "-m", "framework.local_hub", "--help"],
                            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert "--root" in result.stdout and "--port" in result.stdout


def test_support_is_the_tests_folder_and_nothing_installed_shadows_it() -> None:
    """`support` resolves to tests/support under pytest, and to nothing outside it (no installed package clashes)."""
    import support

    assert Path(support.__file__).parent == REPO_ROOT / "tests" / "support"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", "import support"], capture_output=True, text=True, timeout=60,
                            cwd=REPO_ROOT, env=env)
    assert result.returncode == 1 and "No module named 'support'" in result.stderr, result.stderr
