"""`open_images`: an ImageFolder tree, a flat folder, split folders, a class map, parquet, webdataset shards, a local
imagefolder with metadata and a Hub image dataset by name; bad files skipped and counted (or refused, strict),
and the refusals a user meets, each naming the value. Real PNG / JPEG files written here (scikit-learn's digits)."""

from __future__ import annotations

import io
import json
import logging
import tarfile

import datasets  # noqa: F401 - imported before the `hub` fixture starts, as in a user's session: the patch repoints it
import numpy as np
import pytest
from PIL import Image
from support.digit_images import digits_pngs

from framework.data.image_files import BadImage
from framework.data.image_sources import open_images
from framework.errors import InputError


def _png_bytes(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (value, 255 - value, 0)).save(out, format="PNG")
    return out.getvalue()


def test_a_tree_gives_labels_from_leaf_folders_in_sorted_class_order(tmp_path):
    root = digits_pngs(tmp_path / "digits", n=12, classes=(2, 7))
    (root / "7" / "nested").mkdir()
    Image.new("L", (8, 8), 9).save(root / "7" / "nested" / "x.png")
    src = open_images(str(root))
    assert src.kind == "folder" and src.classes == ["2", "7", "7/nested"] and len(src) == 13
    names = [src.name(i).split("/digits/")[1] for i in range(len(src))]
    assert [src.classes[src.label(i)] for i in range(len(src))] == [n.rsplit("/", 1)[0] for n in names]
    assert src.channels == 1 and src.image(0).mode == "L" and src.image(0).size == (16, 16)  # grey digits
    again = open_images(str(root))
    assert again.identity() == src.identity()
    (root / "2" / "extra.png").write_bytes(_png_bytes(3))
    assert open_images(str(root)).identity() != src.identity()  # a file added: another fingerprint


def test_bad_files_are_skipped_and_counted_or_refused_naming_the_file_with_strict(tmp_path, caplog):
    root = digits_pngs(tmp_path / "d", n=10, classes=(0, 1))
    good = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(good, "JPEG")
    (root / "0" / "cut.jpg").write_bytes(good.getvalue()[:600])
    (root / "1" / "notes.png").write_text("a text file named .png")
    with caplog.at_level(logging.WARNING):
        src = open_images(str(root))
    assert len(src) == 10 and src.describe()["skipped"] == 2
    assert sorted(s.split(":")[0] for s in src.describe()["skipped_examples"]) == ["cut.jpg", "notes.png"]
    assert "2 of 12 files skipped" in caplog.text
    with pytest.raises(BadImage, match=r"0/cut\.jpg: truncated .*data\.strict=true"):
        open_images(str(root), strict=True)


def test_split_folders_a_class_map_and_a_flat_folder(tmp_path):
    digits_pngs(tmp_path / "s" / "train", n=12, classes=(3, 4))
    digits_pngs(tmp_path / "s" / "validation", n=4, classes=(4,))
    train = open_images(str(tmp_path / "s"))
    assert train.splits == ["train", "validation"] and train.classes == ["3", "4"]
    val = open_images(str(tmp_path / "s"), split="validation", classes=train.classes)
    assert set(val.labels) == {1}  # the training split's index of class "4"
    with pytest.raises(InputError, match="data.split='test': .* its split folders: train, validation"):
        open_images(str(tmp_path / "s"), split="test")
    mapped = open_images(str(tmp_path / "s"), class_map={"4": 0, "3": 1})
    assert mapped.classes == ["4", "3"] and [mapped.classes[x] for x in mapped.labels] == \
        [train.classes[x] for x in train.labels]
    (tmp_path / "map.json").write_text(json.dumps({"3": "three"}))
    only = open_images(str(tmp_path / "s"), class_map=str(tmp_path / "map.json"))
    assert only.classes == ["three"] and only.left_out == len(train) - len(only) > 0
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        (flat / f"{i}.png").write_bytes(_png_bytes(i))
    src = open_images(str(flat))
    assert src.kind == "flat" and src.labels is None and src.classes is None and len(src) == 3


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "holds no image"),
    (lambda p: digits_pngs(p, n=5, classes=(1,)), "holds images of 1 class .* at least 2"),
    (lambda p: None, "no such file or folder"),
    (lambda p: (p.mkdir(), (p / "a.png").write_text("x")), "none of its 1 files .* is an image"),
])
def test_an_empty_missing_single_class_or_all_bad_source_is_refused_naming_it(tmp_path, make, message):
    make(tmp_path / "src")
    with pytest.raises(InputError, match=message):
        open_images(str(tmp_path / "src"), min_classes=2)


def test_parquet_with_string_labels_and_webdataset_shards_with_cls(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"img": {"bytes": _png_bytes(10 * i), "path": None}, "kind": "ab"[i % 2]} for i in range(6)]
    rows[4]["img"]["bytes"] = b"not a png"
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "train-00000.parquet")
    src = open_images(str(tmp_path / "pq"), image_column="img", label_column="kind", cache_dir=str(tmp_path / "c"))
    assert src.kind == "parquet" and src.classes == ["a", "b"] and src.labels == [0, 1, 0, 1, 1]
    assert len(src.skipped) == 1 and "row 4" in src.skipped[0][0] and src.image(2).getpixel((0, 0))[0] == 20
    with pytest.raises(InputError, match="data.label_column='label_x' is not a column .* img, kind"):
        open_images(str(tmp_path / "pq"), image_column="img", label_column="label_x", cache_dir=str(tmp_path / "c"))
    for s in range(2):
        with tarfile.open(tmp_path / f"shard-{s}.tar", "w") as tar:
            for i in range(3):
                for ext, data in (("png", _png_bytes(40 * i + s)), ("cls", str(i % 2).encode())):
                    info = tarfile.TarInfo(f"s{s}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    shards = open_images(str(tmp_path / "shard-*.tar"), cache_dir=str(tmp_path / "c"))
    assert shards.kind == "webdataset" and len(shards) == 6 and shards.labels == [0, 1, 0, 0, 1, 0]
    assert shards.image(4).getpixel((0, 0))[0] == 41


def test_a_local_imagefolder_with_metadata_takes_its_label_column(tmp_path):
    root = tmp_path / "meta"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.png").write_bytes(_png_bytes(i))
    (root / "metadata.csv").write_text("file_name,label\n0.png,dog\n1.png,cat\n2.png,dog\n3.png,cat\n")
    src = open_images(str(root), cache_dir=str(tmp_path / "c"))
    assert src.kind == "imagefolder" and src.classes == ["cat", "dog"] and src.labels == [1, 0, 1, 0]


def test_a_hub_image_dataset_is_read_by_name_at_its_commit(tmp_path, hub):
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature

    repo = "me/shapes"
    hub.api.create_repo(repo, repo_type="dataset")
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=["round", "square"])})
    up = tmp_path / "up" / "data"
    up.mkdir(parents=True)
    for split, n in (("train", 6), ("test", 2)):
        rows = {"image": [{"bytes": _png_bytes(30 * i), "path": None} for i in range(n)], "label": [i % 2 for i in
                                                                                                    range(n)]}
        Dataset.from_dict(rows, features=features).to_parquet(up / f"{split}-00000-of-00001.parquet")
    sha = hub.api.upload_folder(folder_path=up.parent, repo_id=repo, repo_type="dataset").oid
    src = open_images(repo, cache_dir=str(tmp_path / "c"))
    assert src.kind == "hub" and src.splits == ["train", "test"] and src.classes == ["round", "square"]
    assert src.labels == [0, 1, 0, 1, 0, 1] and src.image(1).getpixel((0, 0)) == (30, 225, 0)
    assert src.describe()["sha"] == sha and src.ident == {"hub": repo, "sha": sha}
    test = open_images(repo, split="test", classes=src.classes, cache_dir=str(tmp_path / "c"))
    assert len(test) == 2
    with pytest.raises(InputError, match="has no dataset repo 'me/absent'"):
        open_images("me/absent", cache_dir=str(tmp_path / "c"))
