"""Other clients are users too, against the local Hub server: a timm model goes up in timm's own format
(`timm.create_model("hf-hub:...")` loads it), what timm pushes loads back through `from_pretrained` and
`python -m framework.hub pull`, a plain LightningModule's card snippet (huggingface_hub + safetensors) rebuilds it,
and a module that could not be pushed stops the fit before step 1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import timm
import torch
from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from framework.callbacks.hub_push import HubPush
from framework.hub import NotPushableError, UnsafeConfigError, from_pretrained, load_config, push_to_hub

REPO = Path(__file__).resolve().parents[1]
IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def online(monkeypatch):
    """timm and huggingface_hub download from the local Hub (HF_ENDPOINT), so the client must not be offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def fit(module: L.LightningModule, callback: L.Callback, root: Path, x: torch.Tensor, y: torch.Tensor) -> L.Trainer:
    """Two CPU steps of a plain `L.Trainer` with `callback`."""
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                        default_root_dir=root)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=2))
    return trainer


class LitTimm(L.LightningModule):
    """A LightningModule around a timm model (`.model`), as users write it."""

    def __init__(self, num_classes: int = 5):
        super().__init__()
        self.model = timm.create_model("test_resnet", pretrained=False, num_classes=num_classes)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.model(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class LitRegressor(L.LightningModule):
    """A plain LightningModule that saved its constructor arguments."""

    def __init__(self, in_dim: int = 4, hidden: int = 8, widths: tuple[int, ...] = (3, 2), lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, widths[0]))
        self.steps = 0

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Unsaved(LitRegressor):
    """The same module without save_hyperparameters(): nothing records how to rebuild it."""

    def save_hyperparameters(self, *args, **kwargs):
        pass


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def pull(repo_id: str, hub) -> subprocess.CompletedProcess:
    """`python -m framework.hub pull REPO_ID` in a fresh process against the local Hub."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HUB_CACHE": str(hub.root / "cache-pull"),
           "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "framework.hub", "pull", repo_id], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)


# ---- timm → our push → timm.create_model("hf-hub:...") ----------------------------------------------------------
def test_a_timm_model_in_a_fit_is_pushed_in_timms_format_and_timm_loads_the_same_model(hub, tmp_path):
    module = LitTimm()
    callback = HubPush("local-user/timm-ours")
    fit(module, callback, tmp_path, IMAGES, torch.tensor([0, 3]))
    assert len(callback.pushes) == 1 and not callback.failures
    config = json.loads(Path(hf_hub_download("local-user/timm-ours", "config.json")).read_text())
    assert config["architecture"] == "test_resnet" and config["num_classes"] == 5 and "name" not in config
    assert {"num_features", "pretrained_cfg", "model_args"} <= set(config) and config["pretrained_cfg"]["mean"]
    ours = module.model.eval()
    theirs = timm.create_model("hf-hub:local-user/timm-ours", pretrained=True).eval()
    with torch.no_grad():
        assert torch.equal(theirs(IMAGES), ours(IMAGES))
    assert torch.equal(from_pretrained("local-user/timm-ours")(IMAGES), ours(IMAGES))
    readme = Path(hf_hub_download("local-user/timm-ours", "README.md")).read_text()
    assert "library_name: timm" in readme and "timm.create_model('hf-hub:local-user/timm-ours'" in readme


def test_push_to_hub_takes_a_bare_timm_vit_and_timm_loads_it(hub):
    model = timm.create_model("test_vit", pretrained=False, num_classes=3).eval()  # pretrained_cfg: "patch_embed.proj"
    push_to_hub(model, "local-user/vit-ours")
    theirs = timm.create_model("hf-hub:local-user/vit-ours", pretrained=True).eval()
    x = torch.randn(1, 3, 160, 160, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(theirs(x), model(x))
    assert load_config("local-user/vit-ours")["pretrained_cfg"]["first_conv"] == "patch_embed.proj"


#: what timm's default pretrained_cfg says of the ImageNet checkpoint, which a push of the user's weights must not
SOURCE_FACTS = ("tag", "hf_hub_id", "hf_hub_filename", "url", "file", "source", "license", "origin_url", "paper_ids",
                "paper_name", "notes", "description", "test_input_size", "test_crop_pct", "test_pool_size")
CLASSES = ["cat", "dog", "fox"]


def images_run(root: Path) -> tuple[Path, nn.Module]:
    """A finished `model=timm model.name=resnet10t data=images` run dir on a 3-class folder at 32x32, as
    `framework.train` leaves it (model_config.json, results.json with the data's record, checkpoints/last.ckpt)."""
    from framework.models.timm_models import timm_model

    torch.manual_seed(0)
    model = timm_model("resnet10t", num_classes=3, input_shape=[3, 32, 32]).eval()
    (root / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}},
               root / "checkpoints" / "last.ckpt")
    (root / "model_config.json").write_text(json.dumps({"name": "timm", "config": model.init_config}))
    record = {"dataset": "my_images/", "format": "folder", "num_classes": 3, "class_names": CLASSES,
              "input_size": [3, 32, 32]}
    (root / "results.json").write_text(json.dumps({
        "command": "python -m framework.train model=timm model.name=resnet10t data=images data.source=my_images/",
        "choices": {"model": "timm", "data": "images", "module": "classifier"}, "metrics": {"val/acc": 0.5},
        "global_step": 2, "data": record}))
    return root, model


def test_a_timm_run_on_the_users_images_pushes_a_config_of_its_own_weights_not_imagenets(hub, tmp_path):
    run, ours = images_run(tmp_path / "run")
    push_to_hub(run, "local-user/my-classifier")
    text = Path(hf_hub_download("local-user/my-classifier", "config.json")).read_text()
    config = json.loads(text)
    cfg = config["pretrained_cfg"]
    assert not set(SOURCE_FACTS) & (set(cfg) | set(config)), config
    assert "in1k" not in text and "apache-2.0" not in text and "http" not in text
    assert config["architecture"] == "resnet10t" and config["num_classes"] == cfg["num_classes"] == 3
    assert config["label_names"] == CLASSES and config["model_args"]["in_chans"] == 3
    assert cfg["input_size"] == [3, 32, 32] and cfg["interpolation"] == "bicubic" and cfg["crop_pct"] == 0.875
    assert cfg["mean"] and cfg["std"] and cfg["crop_mode"] == "center" and cfg["first_conv"] == "conv1.0"
    theirs = timm.create_model("hf-hub:local-user/my-classifier", pretrained=True).eval()
    loaded = from_pretrained("local-user/my-classifier")
    x = IMAGES
    with torch.no_grad():
        assert torch.equal(theirs(x), ours(x)) and torch.equal(loaded(x), ours(x))
    for model in (theirs, loaded):
        assert model.pretrained_cfg["label_names"] == CLASSES and model.pretrained_cfg["num_classes"] == 3
        assert not model.pretrained_cfg.get("license") and not model.pretrained_cfg.get("tag")
    readme = Path(hf_hub_download("local-user/my-classifier", "README.md")).read_text()
    meta = readme.split("\n---\n", 1)[0]
    assert "library_name: timm" in meta and "license" not in meta and "imagenet" not in readme.lower()
    assert "in1k" not in readme


class ImageFolderData(L.LightningDataModule):
    """A user's image data as `data=images` states it: its `classes`, one per output."""

    classes = ["ant", "bee", "cow", "dog", "elk"]

    def train_dataloader(self):
        return DataLoader(TensorDataset(IMAGES, torch.tensor([0, 3])), batch_size=2)


def test_a_fit_on_the_users_classes_pushes_them_as_label_names_and_no_imagenet_facts(hub, tmp_path):
    module, callback = LitTimm(), HubPush("local-user/timm-labels")
    L.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
              default_root_dir=tmp_path).fit(module, datamodule=ImageFolderData())
    assert len(callback.pushes) == 1 and not callback.failures
    config = load_config("local-user/timm-labels")
    assert config["label_names"] == ImageFolderData.classes and config["num_classes"] == 5
    assert not set(SOURCE_FACTS) & (set(config["pretrained_cfg"]) | set(config)), config
    theirs = timm.create_model("hf-hub:local-user/timm-labels", pretrained=True)
    assert theirs.pretrained_cfg["label_names"] == ImageFolderData.classes


# ---- timm's own push → from_pretrained / pull -------------------------------------------------------------------
def test_what_timm_pushes_loads_through_from_pretrained_load_config_and_pull(hub, capsys):
    from timm.models import push_to_hf_hub

    model = timm.create_model("test_resnet", pretrained=False, num_classes=7).eval()
    push_to_hf_hub(model, "local-user/timm-theirs")  # safetensors and pytorch_model.bin: only the first is read
    assert load_config("local-user/timm-theirs")["architecture"] == "test_resnet"
    loaded = from_pretrained("local-user/timm-theirs")
    assert type(loaded) is type(model) and not loaded.training and same_weights(loaded, model)
    with torch.no_grad():
        assert torch.equal(loaded(IMAGES), model(IMAGES))
    built = []
    via_build = from_pretrained("local-user/timm-theirs",
                                build=lambda name, values: built.append(name) or timm.create_model(name, **values))
    assert built == ["test_resnet"] and same_weights(via_build, model)
    from framework.hub.cli import main as hub_main  # in process; in a fresh process: the slow test below

    capsys.readouterr()
    assert hub_main(["pull", "local-user/timm-theirs"]) == 0
    out = capsys.readouterr().out
    assert "test_resnet (ResNet, " in out and "num_classes=7" in out


@pytest.mark.slow  # a fresh process (about 9 s, nearly all imports); make test runs the same main() in process above
def test_a_timm_push_pulls_in_a_fresh_process(hub):
    from timm.models import push_to_hf_hub

    push_to_hf_hub(timm.create_model("test_resnet", pretrained=False, num_classes=7), "local-user/timm-fresh")
    proc = pull("local-user/timm-fresh", hub)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test_resnet (ResNet, " in proc.stdout and "num_classes=7" in proc.stdout


@pytest.mark.parametrize("architecture", ["os.system", "framework.models.transformer:TransformerLM", "no_such_net",
                                          "test_resnet.evil_tag"])
def test_a_timm_config_naming_anything_but_a_timm_model_is_refused_before_the_weights(hub, architecture):
    repo = f"local-user/evil-timm-{abs(hash(architecture)) % 10**6}"
    hub.api.create_repo(repo, exist_ok=True)
    config = {"architecture": architecture, "num_classes": 2, "pretrained_cfg": {}}
    hub.api.upload_file(path_or_fileobj=json.dumps(config).encode(), path_in_repo="config.json", repo_id=repo)
    hub.api.upload_file(path_or_fileobj=b"not safetensors", path_in_repo="model.safetensors", repo_id=repo)
    with pytest.raises(UnsafeConfigError, match=re.escape(repr(architecture))):
        from_pretrained(repo)
    assert try_to_load_from_cache(repo, "model.safetensors") is None


# ---- a plain LightningModule → HubPush → the card's snippet --------------------------------------------------------
def test_a_plain_lightning_module_pushes_and_the_cards_snippet_rebuilds_it(hub, tmp_path):
    module = LitRegressor(in_dim=4, hidden=6)
    callback = HubPush("local-user/plain-lit")
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    fit(module, callback, tmp_path, x, torch.randn(8, 3))
    assert module.steps == 2 and len(callback.pushes) == 1 and not callback.failures
    config = load_config("local-user/plain-lit")
    assert config["format"] == "plain" and config["name"] == "LitRegressor"
    assert config["config"] == {"in_dim": 4, "hidden": 6, "widths": [3, 2], "lr": 0.1}
    readme = Path(hf_hub_download("local-user/plain-lit", "README.md")).read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert "framework" not in snippet and len([line for line in snippet.splitlines() if line.strip()]) <= 7
    scope = {"LitRegressor": LitRegressor}
    exec(snippet, scope)  # as a huggingface_hub + safetensors user runs it, with their class in scope
    rebuilt = scope["model"]
    assert type(rebuilt) is LitRegressor and not rebuilt.training and same_weights(rebuilt, module)
    assert same_weights(from_pretrained("local-user/plain-lit", model_cls=LitRegressor), module)
    with pytest.raises(UnsafeConfigError, match=re.escape("model_cls=LitRegressor")):
        from_pretrained("local-user/plain-lit")


# ---- what cannot be pushed: refused before step 1 -----------------------------------------------------------------
def test_an_unpushable_module_stops_the_fit_before_step_1_with_one_line(hub, tmp_path):
    module = Unsaved()
    with pytest.raises(ValueError, match="Unsaved") as err:
        fit(module, HubPush("local-user/never"), tmp_path, torch.randn(4, 4), torch.randn(4, 3))
    message = str(err.value)
    assert isinstance(err.value, NotPushableError) and "\n" not in message
    assert "save_hyperparameters()" in message and "timm" in message and "init_config" in message
    assert module.steps == 0
    with pytest.raises(NotPushableError, match="Linear cannot be pushed"):
        push_to_hub(nn.Linear(2, 2), "local-user/never")
    assert not hub.api.repo_exists("local-user/never")
