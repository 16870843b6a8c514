"""`model=timm`: a timm model by name or Hub id under `module=classifier` on the digits, its classes and channels
from the data, its data config handed to data that takes one, every optimizer (OLion: stem and classifier to AdamW),
FSDP2 and DDP, bad names refused in one line, and the run's push opened by `timm.create_model("hf-hub:...")` in a
fresh process."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_cli

from framework.assembly import assemble, hand_data_config
from framework.data.digits import DigitsData
from framework.models.timm_models import data_config_for, timm_model
from framework.modules.classifier import Classifier
from framework.registry import OPTIMIZERS

timm = pytest.importorskip("timm")

REPO = Path(__file__).resolve().parents[2]
DIGITS = ["model=timm", "data=digits", "module=classifier", "threads=1", "trainer.enable_progress_bar=false",
          "trainer.max_steps=2", "trainer.limit_val_batches=1", "data.batch_size=16"]


def hub_env(url: str, cache: Path) -> dict[str, str]:
    """What a subprocess needs to talk to the local Hub (huggingface_hub reads HF_ENDPOINT at import)."""
    return {"HF_ENDPOINT": url, "HF_TOKEN": "dummy", "HF_HUB_CACHE": str(cache), "HF_XET_CACHE": str(cache / "xet"),
            "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@pytest.fixture
def online(monkeypatch):
    """timm and huggingface_hub download from the local Hub (HF_ENDPOINT), so the client must not be offline."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def _lm(name: str = "resnet10t", optimizer=None, **kwargs) -> tuple[Classifier, DigitsData]:
    """A classifier module around `model=timm` on the digits, wired as `framework.train` wires it."""
    data = DigitsData(batch_size=32)
    torch.manual_seed(0)
    lm, _ = assemble(data, functools.partial(timm_model, name=name, **kwargs), functools.partial(Classifier),
                     optimizer=optimizer)
    return lm, data


def _batch(data: DigitsData) -> dict[str, torch.Tensor]:
    data.setup("fit")
    return next(iter(data.train_dataloader()))


# ---- the model: classes, channels and image size from the data -----------------------------------------------------
def test_a_timm_model_takes_its_classes_channels_and_fixed_size_from_the_data():
    lm, data = _lm()
    assert lm.model.num_classes == 10 and lm.model.conv1[0].in_channels == 1  # digits: 10 classes, (1, 8, 8)
    assert lm.model.init_config == {"name": "resnet10t", "pretrained": False, "num_classes": 10,
                                    "input_shape": [1, 8, 8]}
    vit, _ = _lm("test_vit", patch_size=2, drop_rate=0.1)  # a ViT takes one size: built for the data's 8x8
    logits = vit.model(_batch(data)["x"])
    assert logits.shape == (32, 10) and vit.model.patch_embed.img_size == (8, 8)
    assert vit.model.init_config["patch_size"] == 2 and vit.model.init_config["drop_rate"] == 0.1


def test_the_models_data_config_goes_to_data_that_takes_one_and_is_timms_own():
    class TakesConfig:
        def use_data_config(self, config):
            self.config = config

    data = TakesConfig()
    handed = hand_data_config(functools.partial(timm_model, name="test_vit"), data)
    built = timm.create_model("test_vit", pretrained=False)
    assert handed == data.config == timm.data.resolve_model_data_config(built)
    assert set(handed) == {"input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode"}
    assert data_config_for(name="resnet10t", input_shape=[1, 8, 8])["input_size"][0] == 1
    assert hand_data_config(functools.partial(timm_model, name="test_vit"), DigitsData()) is None  # digits: no


def test_the_preflights_meta_build_of_a_timm_model_loads_nothing():
    from accelerate import init_empty_weights

    with init_empty_weights():
        lm, _ = _lm("test_resnet")
    assert {p.device.type for p in lm.parameters()} == {"meta"}


# ---- bad names: one line, exit 2, nothing written --------------------------------------------------------------------
def _refusal(capsys, tmp_path, *args: str) -> str:
    from framework.cli import check_command_line
    from framework.errors import report_and_exit

    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        report_and_exit(check_command_line, [*DIGITS, *args, f"hydra.run.dir={run_dir}"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and not run_dir.exists(), err
    return err


def test_an_unknown_timm_name_or_a_patch_size_the_images_do_not_tile_is_refused_in_one_line(capsys, tmp_path):
    err = _refusal(capsys, tmp_path, "model.name=resnt10t")
    assert re.match(r"error: .*model\.name=resnt10t: timm [\d.]+ has no such model\. Did you mean 'resnet10t'",
                    err), err
    err = _refusal(capsys, tmp_path, "model.name=test_vit")  # 16x16 patches, 8x8 digits: timm fails at step 1
    assert "the data's 8x8 images do not tile into its 16x16 patches" in err and "+model.patch_size=2" in err, err


def test_a_hub_id_that_is_not_a_timm_model_is_refused_naming_what_it_is(hub, online, capsys, tmp_path):
    from framework.hub import push_to_hub
    from framework.models.convnet import MLP

    push_to_hub(MLP(input_shape=[1, 8, 8], num_classes=10, hidden=8, depth=1), "local-user/an-mlp")
    hub.api.create_repo("local-user/a-llama")
    hub.api.upload_file(path_or_fileobj=json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
                        .encode(), path_in_repo="config.json", repo_id="local-user/a-llama")
    err = _refusal(capsys, tmp_path, "model.name=hf-hub:local-user/an-mlp")
    assert "hf-hub:local-user/an-mlp is a framework model ('mlp'" in err and "not a timm model" in err, err
    err = _refusal(capsys, tmp_path, "model.name=hf-hub:local-user/a-llama")
    assert "is a transformers model (LlamaForCausalLM; model_type 'llama'" in err and "not a timm model" in err, err
    err = _refusal(capsys, tmp_path, "model.name=hf-hub:local-user/nothing-here")
    assert "hf-hub:local-user/nothing-here: no such Hub repo" in err, err


def test_a_timm_model_on_the_hub_is_opened_by_id_with_its_weights(hub, online):
    from timm.models import push_to_hf_hub

    source = timm.create_model("test_resnet", pretrained=False, num_classes=10, in_chans=1).eval()
    push_to_hf_hub(source, "local-user/timm-source", safe_serialization=True)
    model = timm_model("hf-hub:local-user/timm-source", pretrained=True, num_classes=10, input_shape=[1, 8, 8]).eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(x), source(x))


# ---- optimizers and strategies -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_every_optimizer_trains_a_timm_model_on_the_digits(name):
    lr = {"sgd": 0.05, "lion": 1e-3}.get(name, 3e-3)
    lm, data = _lm("test_resnet", optimizer=functools.partial(OPTIMIZERS.get(name), **{
        **OPTIMIZERS.entry(name).defaults, "lr": lr}))
    opt, batch = lm.configure_optimizers(), _batch(data)
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = lm.training_step(batch, 0)["loss"]
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], (name, losses)
    assert all(not torch.equal(before[n], p.detach()) for n, p in lm.model.named_parameters()), name


@pytest.mark.parametrize(("name", "edges"), [("resnet10t", {"conv1.0.weight", "fc.weight"}),
                                             ("test_convnext", {"stem.0.weight", "head.fc.weight"}),
                                             ("test_vit", {"patch_embed.proj.weight", "head.weight"})])
def test_olion_sends_a_timm_models_stem_and_classifier_to_adamw(name, edges):
    """As for the convnet: the layers that read the image and write the logits are no hidden layers."""
    lm, _ = _lm(name, optimizer=functools.partial(OPTIMIZERS.get("olion"), lr=1e-3),
                **({"patch_size": 2} if name == "test_vit" else {}))
    routed = {n: o for g in lm.configure_optimizers().param_groups
              for n, p, o in zip(g["param_names"], g["params"], g["orthogonal"], strict=True) if p.ndim >= 2}
    adamw = {n for n, o in routed.items() if not o and n not in ("cls_token", "pos_embed")}
    assert adamw == edges and sum(routed.values()) >= 4, (adamw, routed)


def test_fsdp2_shards_a_timm_model_and_olion_steps_it(monkeypatch):
    """One gloo rank's device mesh (FSDP2 shards over it as over many): the model's parameters become DTensors and
    an OLion step on them moves the same weights as on the unsharded model, within float tolerance."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    olion = functools.partial(OPTIMIZERS.get("olion"), lr=1e-2, ns_dtype="float32")
    plain, data = _lm("test_vit", optimizer=olion, patch_size=2)
    sharded, _ = _lm("test_vit", optimizer=olion, patch_size=2)
    batch = _batch(data)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
        sharded._device_mesh = mesh
        sharded.configure_model()
        assert {type(p).__name__ for p in sharded.model.parameters()} == {"DTensor"}
        for lm in (plain, sharded):
            opt = lm.configure_optimizers()
            lm.training_step(batch, 0)["loss"].backward()
            opt.step()
        full = {n: p.full_tensor() for n, p in sharded.model.named_parameters()}
    finally:
        dist.destroy_process_group()
    for n, p in plain.model.named_parameters():
        torch.testing.assert_close(full[n], p.detach(), atol=1e-5, rtol=1e-5, msg=n)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow  # 2 x ~14 s: two CPU processes each (make test runs FSDP2 on one rank's mesh above)
@pytest.mark.ddp
def test_ddp_and_fsdp2_train_a_timm_model_with_olion_to_the_same_weights(tmp_path):
    args = [*DIGITS, "model.name=resnet10t", "optimizer=olion", "optimizer.ns_dtype=float32", "trainer.devices=2",
            "trainer.accelerator=cpu"]
    for strategy in ("ddp", "fsdp2"):
        proc = run_cli(*args, f"trainer.strategy={strategy}", f"hydra.run.dir={tmp_path / strategy}")
        assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = json.loads((tmp_path / "ddp" / "results.json").read_text())["metrics"]
    rank1 = json.loads((tmp_path / "ddp" / "results.rank1.json").read_text())["metrics"]
    assert rank0["val/loss"] == rank1["val/loss"]
    ddp, fsdp = _weights(tmp_path / "ddp"), _weights(tmp_path / "fsdp2")
    assert ddp.keys() == fsdp.keys()
    for key in ddp:
        torch.testing.assert_close(fsdp[key].float(), ddp[key].float(), atol=1e-5, rtol=1e-5, msg=key)


# ---- the CLI run and its push, opened by timm in a fresh process ---------------------------------------------------
FRESH_LOAD = """
import sys, timm, torch
model = timm.create_model(sys.argv[1], pretrained=True).eval()
x = torch.load(sys.argv[2], weights_only=True)
with torch.no_grad():
    torch.save({"logits": model(x), "input_size": list(model.pretrained_cfg["input_size"])}, sys.argv[3])
"""


@pytest.mark.slow  # 10 s; make test: timm loads the model a fit pushed (tests/test_hub_interop.py), model=timm
# trains on an image folder through the CLI (tests/data/test_images.py)
def test_the_cli_trains_a_timm_model_on_the_digits_and_timm_opens_its_push_in_a_fresh_process(hub, online, tmp_path,
                                                                                                monkeypatch):
    """The run dir's push (what `hub.repo_id=` does once the run has finished: `push_to_hub(run_dir)`; the CLI
    round trip with the Hub itself is `test_the_runs_own_push_...` under make test-slow) is in timm's format."""
    from huggingface_hub import hf_hub_download
    from support.warm_cli import BASE_ENV

    from framework.hub import push_to_hub

    run = tmp_path / "run"
    with monkeypatch.context() as env:  # the training talks to no Hub: the tests' own environment, a warm CLI
        for key in [k for k in os.environ if k.startswith("HF_")]:
            if key in BASE_ENV:
                env.setenv(key, BASE_ENV[key])
            else:
                env.delenv(key)
        proc = run_cli(*DIGITS, "model.name=resnet10t", "optimizer=olion", f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    push_to_hub(run, "local-user/timm-digits")
    config = json.loads(Path(hf_hub_download("local-user/timm-digits", "config.json")).read_text())
    assert config["architecture"] == "resnet10t" and config["model_args"]["in_chans"] == 1
    assert "model.name=resnet10t" in config["command"]
    _assert_timm_opens(hub, tmp_path, "local-user/timm-digits", run)


@pytest.mark.slow  # ~12 s: a Hub environment starts the CLI fresh (make test pushes the run dir in-process above)
def test_the_runs_own_push_opens_in_timm(hub, online, tmp_path):
    run = tmp_path / "run"
    proc = run_cli(*DIGITS, "model.name=test_vit", "+model.patch_size=2", "optimizer=olion", f"hydra.run.dir={run}",
                   "hub.repo_id=local-user/timm-vit-digits", env=hub_env(hub.url, tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / "results.json").read_text())["hub"]["repo_id"] == "local-user/timm-vit-digits"
    _assert_timm_opens(hub, tmp_path, "local-user/timm-vit-digits", run)


def _assert_timm_opens(hub, tmp_path: Path, repo_id: str, run: Path) -> None:
    """`timm.create_model("hf-hub:<repo_id>", pretrained=True)` in a fresh process gives the logits of the run's last
    checkpoint (within float tolerance), and states the input size it was trained at."""
    spec = json.loads((run / "model_config.json").read_text())["config"]
    ours = timm_model(**spec).eval()
    ours.load_state_dict({k.removeprefix("model."): v for k, v in _weights(run).items()})
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.save(x, tmp_path / "x.pt")
    fresh = subprocess.run([sys.executable, "-c", FRESH_LOAD, f"hf-hub:{repo_id}", str(tmp_path / "x.pt"),
                            str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300, cwd=REPO,
                           env={**os.environ, "OMP_NUM_THREADS": "1", **hub_env(hub.url, tmp_path / "fresh-cache")})
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out["input_size"] == [1, 8, 8]  # the size it was trained at, from the data
    with torch.no_grad():
        torch.testing.assert_close(out["logits"], ours(x), atol=1e-5, rtol=1e-5)
