"""`data=images`: the DataModule on real PNG files (scikit-learn's digits written here), its transforms (the model's
data config, seeded augmentation), decoding in workers, and the CLI as a user runs it: a run with its record, the
selection samplers on its stable index, a timm model by name, refusals in one line, and a resume after SIGKILL."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import datasets  # noqa: F401 - imported before the `hub` fixture starts, as in a user's session: the patch repoints it
import numpy as np
import pytest
import torch
from helpers import KILL, finish, start_cli, train_state
from helpers import assert_same_state as assert_same
from PIL import Image
from support.digit_images import digits_pngs
from torch.utils.data import DataLoader

from framework.data.images import ImageData
from framework.errors import InputError


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return digits_pngs(tmp_path_factory.mktemp("images") / "digits", n=60)


def test_the_module_states_classes_and_shape_and_holds_out_every_tenth_image(digits):
    data = ImageData(str(digits), batch_size=8, val_fraction=0.1)
    assert data.num_classes == 3 and data.classes == ["0", "1", "2"] and data.input_shape == [1, 32, 32]  # grey
    assert data.val_rows == list(range(0, 60, 10)) and len(data.train_rows) == 54
    data.setup()
    item = data.train_set[5]
    assert item["x"].shape == (1, 32, 32) and item["index"] == 5 and item["y"] == data.source.label(6)
    val = data.val_set[1]
    assert val["y"] == data.source.label(10) and torch.equal(val["x"], data.val_set[1]["x"])
    assert ImageData(str(digits), batch_size=8, val_fraction=0.1).fingerprint == data.fingerprint


def test_the_models_data_config_sets_size_interpolation_and_normalisation(digits):
    data = ImageData(str(digits), batch_size=8, train_transform="none")
    data.use_data_config({"input_size": (3, 24, 24), "interpolation": "bicubic", "mean": (0.5, 0.5, 0.5),
                          "std": (0.25, 0.25, 0.25), "crop_pct": 1.0, "crop_mode": "center", "num_classes": 7})
    assert data.input_shape == [1, 24, 24]  # the digits are grey: one channel, the mean and std averaged
    data.setup()
    x = data.val_set[0]["x"]
    pixels = np.asarray(data.val_source.image(0).resize((24, 24), Image.BICUBIC), dtype=np.float32) / 255
    assert x.shape == (1, 24, 24)
    assert torch.allclose(x, (torch.from_numpy(pixels)[None] - 0.5) / 0.25, atol=0.02)
    sized = ImageData(str(digits), batch_size=8, image_size=20)
    sized.use_data_config({"input_size": (3, 224, 224)})
    assert sized.input_shape == [1, 20, 20]  # an explicit data.image_size still sets the size


def test_augmentation_is_seeded_by_seed_epoch_and_index_and_leaves_the_callers_generators_alone(digits):
    data = ImageData(str(digits), batch_size=8, seed=3)
    data.setup()
    torch.manual_seed(0)
    random.seed(0)
    first = data.train_set[4]["x"]
    assert torch.equal(first, data.train_set[4]["x"])  # the same draws for (seed, epoch, index)
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    data.train_set[4]
    assert torch.equal(torch.rand(1), expected)  # the training process's own stream is not consumed
    data.clock.frozen = 1
    assert not torch.equal(first, data.train_set[4]["x"])  # another epoch: other crops
    other = ImageData(str(digits), batch_size=8, seed=4)
    other.setup()
    assert not torch.equal(first, other.train_set[4]["x"])


def test_workers_decode_the_same_batches_as_the_main_process(digits):
    data = ImageData(str(digits), batch_size=8, seed=1)
    data.setup()
    data.clock.frozen = 2
    here = list(DataLoader(data.train_set, batch_size=8))
    there = list(DataLoader(data.train_set, batch_size=8, num_workers=2))
    assert all(torch.equal(a["x"], b["x"]) and torch.equal(a["index"], b["index"]) for a, b in zip(here, there,
                                                                                                     strict=True))


def test_bad_values_are_refused_naming_them(digits, tmp_path):
    digits_pngs(tmp_path / "one", n=10, classes=(4,))
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(flat / f"{i}.png")
    for kwargs, message in [({"source": None}, "data.source= is required"),
                            ({"source": str(tmp_path / "one")}, "1 class .* at least 2"),
                            ({"source": str(flat)}, "have no labels"),
                            ({"source": str(digits), "batch_size": 64}, "54 training images, fewer than one batch"),
                            ({"source": str(digits), "train_transform": "strong"}, "not one of timm, flip, none"),
                            ({"source": str(digits), "val_split": "dev"}, "data.val_split='dev' is not a split")]:
        with pytest.raises(InputError, match=message):
            ImageData(**kwargs)


# ---- the CLI, as a user runs it ---------------------------------------------------------------------------------
TINY = ["data=images", "model=convnet", "model.channels=4", "model.hidden=16", "module=classifier", "optimizer=adamw",
        "data.batch_size=8", "data.image_size=16", "threads=1"]


def _error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_a_run_on_a_folder_records_what_it_read_and_skipped(digits, tmp_path, cli):
    source = tmp_path / "d"
    digits_pngs(source, n=40, classes=(0, 1))
    (source / "1" / "notes.png").write_text("not an image")
    run = tmp_path / "run"
    proc = cli(*TINY, f"data.source={source}", "trainer.max_epochs=2", f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    data = results["data"]
    assert data["dataset"] == str(source) and data["format"] == "folder" and data["class_names"] == ["0", "1"]
    assert data["images"] == 40 and data["train_images"] == 36 and data["val_images"] == 4
    assert data["skipped"] == 1 and data["skipped_examples"] == ["notes.png: not an image (PIL cannot identify its "
                                                                 "format)"]
    said = proc.stdout + proc.stderr
    assert said.count("files skipped, not images") == 1, said[-3000:]  # once (not by the preflight too)
    assert data["input_size"] == [1, 16, 16] and results["global_step"] == 2 * (36 // 8)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["ImageData"]
    assert state["fingerprint"] == data["fingerprint"]


@pytest.mark.parametrize("case", ["empty", "single", "strict"])
def test_bad_input_is_one_error_line_exit_2_and_nothing_written(tmp_path, cli, case):
    source = tmp_path / "src"
    if case == "empty":
        source.mkdir()
    else:
        digits_pngs(source, n=20, classes=(5,) if case == "single" else (5, 6))
    if case == "strict":
        (source / "6" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    run = tmp_path / "run"
    proc = cli(*TINY, f"data.source={source}", *(["data.strict=true"] if case == "strict" else []),
               f"hydra.run.dir={run}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = _error_lines(proc)
    assert {"empty": "holds no image", "single": "holds images of 1 class (5)",
            "strict": "6/broken.jpg: "}[case] in line
    assert "Traceback" not in proc.stderr and not run.exists()


@pytest.mark.parametrize("sampler", ["infobatch", "data_agent"])
def test_selection_samplers_select_among_the_images_by_their_index(digits, tmp_path, cli, sampler):
    run = tmp_path / "run"
    proc = cli(*TINY, f"data.source={digits}", f"sampler={sampler}", "trainer.max_epochs=3",
               "+callbacks.batches._target_=support.batch_log.BatchLog", f"+callbacks.batches.path={tmp_path}/b.jsonl",
               f"hydra.run.dir={run}", env={"PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    seen = [i for s in steps for i in s["index"]]
    assert set(seen) <= set(range(54)) and len(set(seen)) > 27
    metrics = json.loads((run / "results.json").read_text())["metrics"]
    assert 0 < metrics["selection/cost"] <= 1.0 + 1e-9


def test_a_timm_model_by_name_takes_its_classes_and_its_own_normalisation(digits, tmp_path, cli):
    run = tmp_path / "run"
    proc = cli("data=images", f"data.source={digits}", "model=timm", "model.name=resnet10t", "module=classifier",
               "optimizer=adamw", "data.batch_size=8", "data.image_size=32", "trainer.max_steps=2", "threads=1",
               f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((run / "results.json").read_text())["data"]
    assert data["input_size"] == [1, 32, 32] and data["num_classes"] == 3  # grey digits: in_chans 1
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert next(v for k, v in state.items() if k.endswith("fc.weight")).shape[0] == 3


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resumed_loader_with_workers_continues_the_epoch_it_was_stopped_in(digits):
    """The small variant of the SIGKILL test below: a loader made for a fit resumed at step 6 (epoch 1 of 4-step
    epochs), decoding in a worker and iterated before anyone sets its epoch, gives epoch 1's last two batches."""
    from types import SimpleNamespace

    def batches(step: int, epoch: int) -> list[dict]:
        data = ImageData(str(digits), batch_size=12, num_workers=1, image_size=16)
        data.trainer = SimpleNamespace(global_rank=0, world_size=1, global_step=step, accumulate_grad_batches=1,
                                       current_epoch=epoch)
        data.setup()
        loader = data.train_dataloader()
        if step == 0:
            loader.sampler.set_epoch(epoch)
        return list(loader)

    whole, rest = batches(0, 1), batches(6, 1)
    assert len(whole) == 4 and len(rest) == 2
    for a, b in zip(whole[2:], rest, strict=True):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["x"], b["x"])


@pytest.mark.slow  # three CLI runs (~10 s); the loader's part of it is the test above (and the stream's, below)
@pytest.mark.parametrize("streamed", [False, True])
def test_a_run_killed_mid_epoch_resumes_to_the_same_next_batches(digits, tmp_path, streamed):
    """Augmented batches decoded in a worker process (a thread pool, streamed): the run killed at step 6 (epoch 1
    of 4-step epochs) and resumed from its last checkpoint takes the uninterrupted run's batches bit for bit, and
    ends with its weights."""
    source = ["data.streaming=true", f"data.source={webdataset_shards(tmp_path / 'wds', per=12, bad=None)}",
              "data.class_map={0:0,1:1,2:2}", "data.batch_size=8", "data.val_split=null"] if streamed else \
        [f"data.source={digits}", "data.batch_size=12"]
    args = [*TINY, *source, "data.num_workers=1", "trainer.max_steps=10",
            "callbacks.checkpoint.every_n_train_steps=1", "+callbacks.batches._target_=support.batch_log.BatchLog"]
    full, cut, resumed = (tmp_path / name for name in ("full", "cut", "resumed"))
    ref = start_cli([*args, f"+callbacks.batches.path={full}.jsonl", f"hydra.run.dir={full}"])
    killed = start_cli([*args, *KILL, "+callbacks.kill.step=6", f"+callbacks.batches.path={cut}.jsonl",
                        f"hydra.run.dir={cut}"])
    (code, err), (kcode, kerr) = finish(ref), finish(killed)
    assert code == 0, err[-3000:]
    assert kcode == -9, kerr[-3000:]
    ckpt = cut / "checkpoints" / "last.ckpt"
    step = train_state(ckpt)["global_step"]
    assert step == 6
    code, err = finish(start_cli([*args, f"ckpt_path={ckpt}", f"+callbacks.batches.path={resumed}.jsonl",
                                  f"hydra.run.dir={resumed}"]))
    assert code == 0, err[-3000:]
    want, got = _log(tmp_path / "full.jsonl"), _log(tmp_path / "resumed.jsonl")
    assert [b["step"] for b in want] == list(range(10)) and [b["step"] for b in got] == list(range(step, 10))
    assert got == want[step:] and _log(tmp_path / "cut.jsonl")[:step] == want[:step]
    assert [b["epoch"] for b in want][5:7] == [1, 1]  # killed mid-epoch
    assert_same(train_state(full / "checkpoints" / "last.ckpt"), train_state(resumed / "checkpoints" / "last.ckpt"))


# ---- data.streaming=true: webdataset shards read as a stream ----------------------------------------------------
def webdataset_shards(folder: Path, shards: int = 3, per: int = 10, bad: tuple[int, int] | None = (1, 3)) -> Path:
    """`shards` tar files of `per` PNG + .cls samples each (3 classes); sample `bad` holds bytes that are no image."""
    import io
    import tarfile

    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with tarfile.open(folder / f"train-{s}.tar", "w") as tar:
            for i in range(per):
                png = io.BytesIO()
                Image.new("RGB", (8, 8), (i * 20, s * 50, 7)).save(png, format="PNG")
                image = b"this is not a png at all" if (s, i) == bad else png.getvalue()
                for ext, payload in (("png", image), ("cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(f"s{s}_{i:03d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    return folder


def test_a_stream_resumed_after_any_batch_gives_the_same_batches_and_counts_what_it_skipped(tmp_path):
    shards = webdataset_shards(tmp_path / "wds")
    data = ImageData(str(shards), streaming=True, class_map={"0": 0, "1": 1, "2": 2}, batch_size=4, image_size=8,
                     val_fraction=0.2, cache_dir=str(tmp_path / "c"))
    assert data.classes == ["0", "1", "2"] and data.val_split is None
    data.setup()
    whole = list(data.train_dataloader())
    record = data.record()
    assert record["skipped"] == 1 and record["streaming"] and record["images_read"] == 4 * len(whole)
    assert record["val_images"] + record["images_read"] - record["repeated_images"] + 1 == 30  # each image once
    for done in (1, 4):
        loader = data.train_dataloader()
        taken = iter(loader)
        for _ in range(done):
            next(taken)
        again = data.train_dataloader()
        again.load_state_dict(loader.state_dict())
        rest = list(again)
        assert len(rest) == len(whole) - done
        pairs = zip(whole[done:], rest, strict=True)
        assert all(torch.equal(a[k], b[k]) for a, b in pairs for k in ("x", "y", "index"))


def test_a_stream_refuses_a_folder_of_images_and_labels_without_class_names(tmp_path, digits):
    with pytest.raises(InputError, match="is a folder of images, read file by file already"):
        ImageData(str(digits), streaming=True)
    with pytest.raises(InputError, match=r"states no class names .* data.class_map="):
        ImageData(str(webdataset_shards(tmp_path / "wds", shards=1)), streaming=True, cache_dir=str(tmp_path / "c"))


def test_a_streamed_run_through_the_cli_and_a_sampler_on_it_refused(tmp_path, cli):
    shards = webdataset_shards(tmp_path / "wds")
    args = [*TINY, f"data.source={shards}", "data.streaming=true", "data.class_map={0:0,1:1,2:2}",
            "data.batch_size=4", "data.image_size=8"]
    run = tmp_path / "run"
    proc = cli(*args, "trainer.max_steps=8", f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((run / "results.json").read_text())["data"]
    assert data["streaming"] and data["skipped"] == 1 and data["files"] == [f"train-{s}.tar" for s in range(3)]
    assert f"data             {shards}: {data['images_read']} training images read (streamed; " in proc.stdout
    proc = cli(*args, "sampler=infobatch", f"hydra.run.dir={tmp_path / 'refused'}")
    assert proc.returncode == 2 and "data.streaming" in _error_lines(proc)[0]
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow  # two-process DDP runs (~40 s)
@pytest.mark.ddp
@pytest.mark.parametrize("streamed", [False, True])
def test_every_rank_takes_the_same_number_of_batches_under_ddp(digits, tmp_path, streamed):
    source = webdataset_shards(tmp_path / "wds", shards=3, per=11) if streamed else digits
    extra = ["data.streaming=true", "data.class_map={0:0,1:1,2:2}", "data.batch_size=4"] if streamed else \
        ["data.batch_size=8"]
    proc = start_cli([*TINY, f"data.source={source}", *extra, "trainer.strategy=ddp", "trainer.devices=2",
                      "trainer.accelerator=cpu", "trainer.max_epochs=2",
                      "+callbacks.batches._target_=support.batch_log.BatchLog",
                      f"+callbacks.batches.path={tmp_path / 'b.jsonl'}", f"hydra.run.dir={tmp_path / 'run'}"])
    code, err = finish(proc, timeout=300)
    assert code == 0, err[-3000:]
    ranks = [_log(tmp_path / "b.jsonl"), _log(tmp_path / "b.rank1.jsonl")]
    assert [b["step"] for b in ranks[0]] == [b["step"] for b in ranks[1]] and len(ranks[0]) > 2
    for epoch in (0, 1):
        seen = [set(i for b in log if b["epoch"] == epoch for i in b["index"]) for log in ranks]
        assert not seen[0] & seen[1]  # disjoint shares (a stream's index: rank + world * its own count)


def test_the_channels_come_from_the_data_and_a_class_that_loses_every_file_is_named(tmp_path, digits, caplog):
    mixed = tmp_path / "mixed"
    shutil.copytree(digits, mixed)
    Image.new("RGB", (16, 16), (200, 10, 10)).save(mixed / "0" / "colour.png")
    data = ImageData(str(mixed), batch_size=8, image_size=16)
    assert data.input_shape == [3, 16, 16] and data.channels == 3  # one colour image: RGB for all
    data.setup()
    assert data.train_set[0]["x"].shape == (3, 16, 16)
    (mixed / "junk").mkdir()
    (mixed / "junk" / "a.png").write_text("not an image")
    (mixed / "junk" / "b.jpg").write_bytes(b"\xff\xd8\xff")
    with caplog.at_level("WARNING"):
        data = ImageData(str(mixed), batch_size=8, image_size=16)
    assert data.classes == ["0", "1", "2"] and "class junk lost every file" in caplog.text


# -- the tests on the module's local Hub last: its fixture points this process's environment at that Hub for the
# rest of the module, and a CLI run started in another environment needs a warm server of its own
def test_a_hub_image_dataset_by_name_validates_on_its_own_test_split(tmp_path, hub):
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature

    repo = "me/digit-images"
    hub.api.create_repo(repo, repo_type="dataset")
    up = tmp_path / "up" / "data"
    up.mkdir(parents=True)
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=["zero", "one", "two"])})
    tree = digits_pngs(tmp_path / "pngs", n=30)
    for split, part in (("train", slice(0, 24)), ("test", slice(24, 30))):
        files = sorted(tree.rglob("*.png"))[part]
        rows = {"image": [str(f) for f in files], "label": [int(f.parent.name) for f in files]}
        Dataset.from_dict(rows, features=features).to_parquet(up / f"{split}-00000-of-00001.parquet")
    sha = hub.api.upload_folder(folder_path=up.parent, repo_id=repo, repo_type="dataset").oid
    data = ImageData(repo, batch_size=8, cache_dir=str(tmp_path / "c"))
    assert data.val_split == "test" and data.classes == ["zero", "one", "two"]
    assert (len(data.train_rows), len(data.val_rows)) == (24, 6)
    data.setup()
    record = data.record()
    assert record["dataset"] == repo and record["sha"] == sha and record["revision"] == "main"
    assert data.val_set[0]["x"].shape == (1, 32, 32) and data.val_set[0]["y"] == data.val_source.label(0)


def test_pretrained_weights_that_cannot_be_had_are_refused_naming_the_repo_and_the_hub(hub):
    from framework.models.timm_models import check_weights

    with pytest.raises(InputError, match=f"timm's weights for resnet10t are in the Hub repo timm/resnet10t.c3_in1k, "
                                         f"which the Hub at {hub.url} does not have; model.pretrained=false"):
        check_weights("resnet10t")
    with pytest.raises(InputError, match=r"model.name=resnet10t.nope: Invalid pretrained tag \(nope\)"):
        check_weights("resnet10t.nope")


@pytest.mark.slow  # 15 s; make test refuses the same weights in process (above)
def test_pretrained_weights_the_hub_lacks_are_one_error_line_exit_2_and_nothing_written(tmp_path, cli, hub, digits):
    run = tmp_path / "run"
    proc = cli("data=images", f"data.source={digits}", "model=timm", "model.name=resnet10t", "model.pretrained=true",
               "module=classifier", "data.batch_size=8", "data.image_size=32", "trainer.max_steps=1", "threads=1",
               f"hydra.run.dir={run}", env={"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
                                            "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = _error_lines(proc)
    assert line.startswith("error: model 'timm': model.pretrained=true: timm's weights for resnet10t are in the Hub "
                           f"repo timm/resnet10t.c3_in1k, which the Hub at {hub.url} does not have"), line
    assert "Traceback" not in proc.stderr and not run.exists()
