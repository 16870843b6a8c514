"""Publishing to the Hub and loading back by name, against the local Hub server with the real huggingface_hub
client: train → push → from_pretrained in a fresh process, revisions, the model card, refusal of malicious
repos, a Hub that is down, and a token that never leaks."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi, ModelCard, hf_hub_download, snapshot_download, try_to_load_from_cache
from support.local_hub import LocalHub, patch_client

from framework.hub import (
    HubPushError,
    UnsafeConfigError,
    UnsafeWeightsError,
    build_model,
    check_repo_id,
    from_pretrained,
    load_config,
    main,
    push_to_hub,
    validate_config,
)
from framework.models.transformer import TransformerLM
from framework.plots import plot_training_curves, read_metrics_csv
from framework.registry import MODELS

TINY = ["threads=1", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
        "trainer.enable_progress_bar=false", "data.max_bytes=60000", "model.dim=32", "model.depth=1",
        "model.heads=2", "data.seq_len=32", "data.batch_size=8"]
REPO_ID = "local-user/char-lm"
SECRET = "hf_secret_test_token"
PNG = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[1]


def hub_env(url: str, cache: Path, token: str = "dummy") -> dict[str, str]:
    """What a subprocess needs to talk to the local Hub (huggingface_hub reads HF_ENDPOINT at import)."""
    return {"HF_ENDPOINT": url, "HF_TOKEN": token, "HF_HUB_CACHE": str(cache), "HF_XET_CACHE": str(cache / "xet"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python ARGS` in a fresh process, as a user would run it, with `env` on top of ours."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env})


@pytest.fixture(scope="module")
def trained(hub, tmp_path_factory):
    """One `char_lm` run that pushes after every validation and at the end; the token is a recognisable secret."""
    run_dir = tmp_path_factory.mktemp("run")
    proc = run("-m", "framework.train", "recipe=char_lm", *TINY, f"hydra.run.dir={run_dir}", f"hub.repo_id={REPO_ID}",
               "hub.every_n_validations=1", env=hub_env(hub.url, hub.root / "cache-train", token=SECRET))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    return SimpleNamespace(run_dir=run_dir, proc=proc, results=results)


def local_model(run_dir: Path) -> TransformerLM:
    """The model as the run left it on disk: model_config.json + checkpoints/last.ckpt (weights only)."""
    spec = json.loads((run_dir / "model_config.json").read_text())
    model = TransformerLM(**spec["config"])
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    return model.eval()


def evil_pickle(marker: Path) -> bytes:
    """A pickle that creates `marker` when unpickled (Path.touch via __reduce__)."""

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    return pickle.dumps({"state_dict": Evil()})


# ---- train → push → load ---------------------------------------------------------------------------------
def test_training_with_hub_repo_id_pushes_the_run_and_records_the_commit(hub, trained):
    head = hub.api.model_info(REPO_ID).sha
    assert trained.results["hub"] == {"repo_id": REPO_ID, "revision": "main", "commit": head,
                                      "url": f"{hub.url}/{REPO_ID}/commit/{head}"}
    files = set(hub.api.list_repo_files(REPO_ID))
    assert {"model.safetensors", "config.json", "README.md", "training_curves.png", "train_config.yaml"} <= files
    assert not any(f.endswith((".bin", ".pt", ".ckpt", ".pkl")) for f in files)
    config = json.loads(Path(hf_hub_download(REPO_ID, "config.json")).read_text())
    assert config["name"] == "transformer_lm" and config["config"]["dim"] == 32 and config["recipe"] == "char_lm"
    assert config["framework_version"] and f"hub.repo_id={REPO_ID}" in config["command"]
    assert "_target_" not in json.dumps(config)
    # hub.every_n_validations=1: one commit per validation during fit (2), then the run dir: one commit each
    messages = [c.title for c in hub.api.list_repo_commits(REPO_ID)]
    assert len(messages) == 4 and messages[0].startswith("framework") and messages[-1] == "initial commit"
    assert [m.split(",")[0] for m in messages[1:3]] == ["HubPush: validation 2", "HubPush: validation 1"]


@pytest.mark.slow  # a fresh process (10 s); make test imports every component without hydra or the catalog
# (tests/test_catalog.py) and pushes and loads a run (above)
def test_a_plain_project_pushes_and_loads_without_importing_the_catalog_or_hydra(hub, tmp_path):
    code = (  # a fresh process: what a Lightning project that never heard of the catalog does
        "import sys, torch\n"
        "from framework.callbacks.hub_push import HubPush\n"
        "from framework.hub import from_pretrained, push_to_hub\n"
        "from framework.models.transformer import TransformerLM\n"
        "HubPush('local-user/plain', info={'model_name': 'transformer_lm'})\n"
        "model = TransformerLM(vocab_size=256, dim=16, depth=1, heads=2)\n"
        "push_to_hub(model, 'local-user/plain', info={'model_name': 'transformer_lm'})\n"
        "back = from_pretrained('local-user/plain', model_cls=TransformerLM)\n"
        "assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())\n"
        "print(sorted(m for m in ('hydra', 'hydra_zen', 'framework.catalog', 'framework.recipes') if m in sys.modules))"
    )
    proc = run("-c", code, env=hub_env(hub.url, tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert json.loads(Path(hf_hub_download("local-user/plain", "config.json")).read_text())["name"] == "transformer_lm"


@pytest.mark.slow  # a fresh process (11 s); make test loads pushed runs by name in process (below)
def test_pull_then_from_pretrained_in_a_fresh_process_print_where_and_give_identical_logits(hub, trained, tmp_path):
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    torch.save(x, tmp_path / "x.pt")
    code = (  # one fresh process (imports cost seconds): `python -m framework.hub pull`, then from_pretrained
        "import runpy, sys, torch\n"
        f"sys.argv = ['framework.hub', 'pull', {REPO_ID!r}]\n"
        "try:\n    runpy.run_module('framework.hub', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        f"from framework.hub import from_pretrained\nmodel = from_pretrained({REPO_ID!r})\nassert not model.training\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r}, weights_only=True)\n"
        f"with torch.no_grad():\n    torch.save(model(x), {str(tmp_path / 'logits.pt')!r})\n"
    )
    proc = run("-c", code, env=hub_env(hub.url, tmp_path / "fresh-cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]

    where, summary = proc.stdout.strip().splitlines()[-2:]
    commit = trained.results["hub"]["commit"]
    match = re.fullmatch(rf"downloaded {REPO_ID}@{commit} to (.+)", where)
    assert match and Path(match[1]).is_relative_to(tmp_path / "fresh-cache"), where
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in Path(match[1]).iterdir()}
    expected_model = local_model(trained.run_dir)
    params = sum(p.numel() for p in expected_model.parameters())
    assert summary.startswith(f"transformer_lm (TransformerLM, {params:,} parameters): vocab_size=256, dim=32")

    got = torch.load(tmp_path / "logits.pt", weights_only=True)
    with torch.no_grad():
        expected = expected_model(x)
    assert got.shape == (2, 24, 256)
    assert torch.equal(got, expected), (got - expected).abs().max()
    assert torch.load(trained.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_two_pushes_make_two_revisions_and_the_first_stays_downloadable(hub, trained):
    repo = "local-user/two-revisions"
    first = push_to_hub(trained.run_dir, repo)
    model = from_pretrained(repo)
    with torch.no_grad():
        model.head.weight.add_(1.0)
    second = push_to_hub(model, repo)  # a plain RecordsConfig model: its name comes from the registry
    assert first.commit != second.commit
    assert [c.commit_id for c in hub.api.list_repo_commits(repo)][:2] == [second.commit, first.commit]
    old, new = from_pretrained(repo, revision=first.commit), from_pretrained(repo)
    for key, tensor in local_model(trained.run_dir).state_dict().items():
        assert torch.equal(old.state_dict()[key], tensor), key
    assert torch.equal(new.head.weight, model.head.weight)
    assert not torch.equal(new.head.weight, old.head.weight)
    assert load_config(repo)["name"] == "transformer_lm"


def test_tied_weights_round_trip_and_stay_tied(hub):
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=64, dim=16, depth=1, heads=2, max_seq_len=32, tie_embeddings=True)
    push_to_hub(model, "local-user/tied")
    pulled = from_pretrained("local-user/tied")
    assert pulled.head.weight is pulled.embed.weight
    x = torch.arange(12).reshape(1, 12)
    with torch.no_grad():
        assert torch.equal(pulled(x), model.eval()(x))


def test_push_to_a_revision_makes_a_branch_and_leaves_main_alone(hub, trained):
    repo = "local-user/branches"
    main_push = push_to_hub(trained.run_dir, repo)
    branch_push = push_to_hub(trained.run_dir, repo, revision="experiment")
    assert branch_push.revision == "experiment"
    refs = {b.name: b.target_commit for b in hub.api.list_repo_refs(repo).branches}
    assert refs == {"main": main_push.commit, "experiment": branch_push.commit}
    assert from_pretrained(repo, revision="experiment").init_config == from_pretrained(repo).init_config


def test_model_card_parses_with_modelcard_load_and_has_the_metrics(hub, trained):
    card = ModelCard.load(REPO_ID)
    assert card.data.library_name == "framework"
    assert {"framework", "transformer_lm", "char_lm"} <= set(card.data.tags)
    assert card.data.datasets == ["byte_corpus"]
    metrics = trained.results["metrics"]
    assert set(card.data.metrics) == set(metrics)
    assert {r.metric_type: r.metric_value for r in card.data.eval_results} == metrics
    for name, value in metrics.items():
        assert f"| {name} | {value:.6g} |" in card.text
    assert "![training curves](training_curves.png)" in card.text
    assert "after step 4" in card.text and trained.results["command"] in card.text
    assert Path(hf_hub_download(REPO_ID, "training_curves.png")).read_bytes().startswith(PNG)


def test_the_token_never_appears_in_output_logs_results_or_the_repo(hub, trained, tmp_path):
    assert SECRET not in trained.proc.stdout + trained.proc.stderr
    for path in trained.run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    for path in Path(snapshot_download(REPO_ID, cache_dir=tmp_path)).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


# ---- what is refused ----------------------------------------------------------------------------------------
GOOD = {"name": "transformer_lm", "config": {"vocab_size": 256, "dim": 32, "depth": 1, "heads": 2}}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**GOOD, "_target_": "os.system"}, "'_target_'"),
        ({**GOOD, "config": {"dim": {"_target_": "builtins.eval", "_args_": ["1"]}}}, "'_target_'"),
        ({**GOOD, "config": {**GOOD["config"], "_partial_": True}}, "'_partial_'"),
        ({**GOOD, "config": {"_recursive_": False}}, "'_recursive_'"),
        ({**GOOD, "_convert_": "all"}, "'_convert_'"),
        ({**GOOD, "name": "os.system"}, "'os.system' looks like an import path"),
        ({**GOOD, "config": {"dim": "framework.models.transformer.TransformerLM"}}, "looks like an import path"),
        ({**GOOD, "config": {"dim": ["subprocess:call"]}}, "'subprocess:call' looks like an import path"),
        ({"config": {}}, "'name' must be a registered model name"),
        (["transformer_lm"], "must be a JSON object"),
    ],
)
def test_validate_config_refuses_anything_but_a_registry_name_and_plain_values(config, message):
    with pytest.raises(UnsafeConfigError, match=re.escape(message)):
        validate_config(config)
    with pytest.raises(UnsafeConfigError, match=re.escape(message)):
        build_model(config, build=lambda name, values: pytest.fail("built a refused config"))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**GOOD, "name": "transformer_lmm"}, "Unknown model 'transformer_lmm'. Did you mean 'transformer_lm'"),
        ({**GOOD, "config": {"evil": 1}}, "sets evil, which model 'transformer_lm' does not take"),
    ],
)
def test_building_refuses_an_unregistered_name_or_a_value_the_model_does_not_take(config, message):
    with pytest.raises(UnsafeConfigError, match=re.escape(message)):
        build_model(config)  # the catalog's build, the default
    if config["name"] == "transformer_lm":
        with pytest.raises(UnsafeConfigError, match=re.escape(message)):
            validate_config(config, model_cls=TransformerLM)


def test_from_pretrained_builds_through_a_given_build_or_model_class_without_the_catalog(hub, trained):
    calls = []

    def build(name, values):
        calls.append(name)
        return TransformerLM(**values)

    reference = from_pretrained(REPO_ID)
    for model in (from_pretrained(REPO_ID, build=build), from_pretrained(REPO_ID, model_cls=TransformerLM)):
        assert type(model) is TransformerLM and not model.training
        expected = reference.state_dict()
        assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert calls == ["transformer_lm"]


def test_validate_config_accepts_what_a_run_pushes(hub, trained):
    config = json.loads(Path(hf_hub_download(REPO_ID, "config.json")).read_text())
    assert validate_config(config) is config


@pytest.mark.parametrize("bad", ["_target_", "import_path", "unknown_name"])
def test_from_pretrained_refuses_malicious_configs_before_downloading_or_building(hub, tmp_path, monkeypatch, bad):
    config = {"_target_": {**GOOD, "_target_": "builtins.exec"},
              "import_path": {**GOOD, "config": {**GOOD["config"], "dropout": "os.system"}},
              "unknown_name": {**GOOD, "name": "evil_model"}}[bad]
    repo = f"local-user/evil-{bad.strip('_').replace('_', '-')}"
    hub.api.create_repo(repo)
    marker = tmp_path / "pwned"
    hub.api.upload_file(path_or_fileobj=json.dumps(config).encode(), path_in_repo="config.json", repo_id=repo)
    hub.api.upload_file(path_or_fileobj=evil_pickle(marker), path_in_repo="model.safetensors", repo_id=repo)
    built = []
    monkeypatch.setattr(MODELS, "build", lambda *a, **k: built.append(a))
    with pytest.raises(UnsafeConfigError) as err:
        from_pretrained(repo)
    assert {"_target_": "'_target_'", "import_path": "'os.system'", "unknown_name": "'evil_model'"}[bad] in str(err)
    assert built == [] and not marker.exists()
    assert try_to_load_from_cache(repo, "model.safetensors") is None  # the weights were never even downloaded


def test_a_pickle_in_place_of_safetensors_is_refused_and_never_unpickled(hub, tmp_path):
    marker = tmp_path / "pwned"
    payload = evil_pickle(marker)
    pickle.loads(payload)  # the payload is live: unpickling it really creates the marker ...
    assert marker.exists()
    marker.unlink()
    for repo, name in [("local-user/pickle-as-safetensors", "model.safetensors"),
                       ("local-user/only-a-bin", "pytorch_model.bin")]:
        hub.api.create_repo(repo)
        hub.api.upload_file(path_or_fileobj=json.dumps(GOOD).encode(), path_in_repo="config.json", repo_id=repo)
        hub.api.upload_file(path_or_fileobj=payload, path_in_repo=name, repo_id=repo)
        with pytest.raises(UnsafeWeightsError, match="safetensors"):
            from_pretrained(repo)
    assert not marker.exists()  # ... and from_pretrained never did


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pushing_a_run_loads_its_checkpoint_with_weights_only(hub, trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained.run_dir, run_dir)
    marker = tmp_path / "pwned"
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(evil_pickle(marker))
    with pytest.raises(UnsafeWeightsError, match="weights_only=True"):
        push_to_hub(run_dir, "local-user/evil-checkpoint")
    assert not marker.exists() and not hub.api.repo_exists("local-user/evil-checkpoint")


def test_bad_repo_ids_and_run_dirs_are_refused_with_the_reason(tmp_path, capsys):
    for repo_id in ("no-namespace", "a/b/c", "has space/x"):
        with pytest.raises(ValueError, match=re.escape(repr(repo_id))):
            check_repo_id(repo_id)
    assert main(["push", str(tmp_path), REPO_ID]) == 2
    assert "has no model_config.json" in capsys.readouterr().err


# ---- failure: the Hub is down --------------------------------------------------------------------------------
# make test-slow: make test checks the push error and its retry command in-process (next test)
@pytest.mark.slow
def test_hub_down_keeps_the_run_and_the_printed_retry_command_works(tmp_path):
    root = tmp_path / "hub"
    server = LocalHub(root).start()
    dead_url = server.url
    server.stop()
    run_dir = tmp_path / "run"
    proc = run("-m", "framework.train", "recipe=char_lm", *TINY, f"hydra.run.dir={run_dir}", f"hub.repo_id={REPO_ID}",
               "hub.revision=exp", "hub.every_n_validations=2", env=hub_env(dead_url, tmp_path / "cache", token=SECRET))
    assert proc.returncode == 3, proc.stderr[-3000:]
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: training finished and everything is in {run_dir}")
    assert f"'{REPO_ID}' (revision exp)" in error and dead_url in error and "ConnectError" in error
    retry = re.search(r"Retry with: (python -m framework\.hub push .+)$", error)[1]
    assert shlex.split(retry)[4:] == [str(run_dir.resolve()), REPO_ID, "--revision", "exp"]
    assert f"once the run has finished, retry with: {retry}" in proc.stdout  # HubPush's warning, mid-training
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 4 and "hub" not in results and results["metrics"]["val/loss"] > 0
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()

    with LocalHub(root) as back:  # the same repos, a new port
        assert not HfApi(endpoint=back.url).repo_exists(REPO_ID)  # nothing half-written
        assert shlex.split(retry)[:3] == ["python", "-m", "framework.hub"]
        again = run(*shlex.split(retry)[1:], env=hub_env(back.url, tmp_path / "cache2", token=SECRET))
        assert again.returncode == 0, again.stderr[-3000:]
        head = HfApi(endpoint=back.url).model_info(REPO_ID, revision="exp").sha
        assert json.loads((run_dir / "results.json").read_text())["hub"] == {
            "repo_id": REPO_ID, "revision": "exp", "commit": head, "url": f"{back.url}/{REPO_ID}/commit/{head}"}
        with patch_client(back.url, tmp_path / "cache3"):
            model = from_pretrained(REPO_ID, revision="exp")
        x = torch.arange(16).reshape(1, 16)
        with torch.no_grad():
            assert torch.equal(model(x), local_model(run_dir)(x))
    for text in (proc.stdout, proc.stderr, again.stdout, again.stderr,
                 *(p.read_text(errors="replace") for p in run_dir.rglob("*.log"))):
        assert SECRET not in text


def test_push_error_names_the_endpoint_and_carries_the_retry_command(trained, tmp_path):
    server = LocalHub(tmp_path / "hub").start()
    url = server.url
    server.stop()
    with patch_client(url, tmp_path / "cache"), pytest.raises(HubPushError) as err:
        push_to_hub(trained.run_dir, REPO_ID, revision="v2", private=True)
    assert url in str(err.value) and "No partial commit was made" in str(err.value)
    assert err.value.retry_command.endswith(f"{trained.run_dir.resolve()} {REPO_ID} --revision v2 --private")


# ---- the callback, in-process -------------------------------------------------------------------------------
def _fit(tmp_path: Path, callback) -> object:
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from framework.data.text import ByteCorpus
    from framework.modules.causal_lm import CausalLM

    torch.manual_seed(0)
    lm = CausalLM(TransformerLM(vocab_size=256, dim=16, depth=1, heads=2, max_seq_len=32))
    trainer = L.Trainer(max_steps=4, val_check_interval=2, limit_val_batches=1, log_every_n_steps=1,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        logger=CSVLogger(tmp_path, name="csv", version=""), default_root_dir=tmp_path,
                        callbacks=[callback], num_sanity_val_steps=0)
    trainer.fit(lm, datamodule=ByteCorpus(seq_len=16, batch_size=4, max_bytes=20000))
    assert trainer.global_step == 4
    return lm


def test_hub_push_callback_pushes_every_n_validations_and_at_the_end(hub, tmp_path):
    from framework.callbacks.hub_push import HubPush

    callback = HubPush("local-user/callback", every_n_validations=1, info={"datasets": ["byte_corpus"]})
    lm = _fit(tmp_path, callback)
    assert callback.failures == [] and len(callback.pushes) == 3  # validations at steps 2 and 4, then fit end
    assert hub.api.model_info("local-user/callback").sha == callback.pushes[-1].commit
    pulled = from_pretrained("local-user/callback")
    for key, tensor in lm.model.state_dict().items():
        assert torch.equal(pulled.state_dict()[key], tensor), key
    card = ModelCard.load("local-user/callback")
    assert "train/loss" in card.data.metrics and "![training curves](training_curves.png)" in card.text


def test_hub_push_failure_warns_with_the_retry_command_and_training_goes_on(tmp_path, caplog):
    from framework.callbacks.hub_push import HubPush

    server = LocalHub(tmp_path / "hub").start()
    url = server.url
    server.stop()
    callback = HubPush("local-user/down", every_n_validations=2)
    with patch_client(url, tmp_path / "cache"), caplog.at_level(logging.WARNING):
        _fit(tmp_path, callback)
    assert callback.pushes == [] and len(callback.failures) == 2  # validation 2 and the end of fit
    retry = f"python -m framework.hub push {tmp_path.resolve()} local-user/down"
    assert retry in caplog.text and "Training goes on" in caplog.text


def test_hub_push_needs_a_repo_id_before_training_starts():
    from framework.callbacks.hub_push import HubPush

    with pytest.raises(ValueError, match="repo_id"):
        HubPush().setup(None, None, "fit")
    with pytest.raises(ValueError, match="every_n_validations=-1"):
        HubPush("a/b", every_n_validations=-1)


# ---- the plot -------------------------------------------------------------------------------------------------
def test_plot_training_curves_plots_every_train_and_val_column(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,lr-AdamW,train/loss,val/loss,val/bpb\n0,0,0.001,5.5,,\n0,1,0.001,5.1,,\n"
                   "0,1,,,5.2,7.5\n0,3,,4.9,nan,\n")
    assert read_metrics_csv(csv) == {"train/loss": [(0, 5.5), (1, 5.1), (3, 4.9)], "val/loss": [(1, 5.2)],
                                     "val/bpb": [(1, 7.5)]}
    out = plot_training_curves(csv, tmp_path / "plots" / "curves.png")
    assert out.read_bytes().startswith(PNG)
    (tmp_path / "empty.csv").write_text("epoch,step,lr-AdamW\n0,0,0.001\n")
    with pytest.raises(ValueError, match="no train/\\* or val/\\* values"):
        plot_training_curves(tmp_path / "empty.csv", tmp_path / "none.png")
