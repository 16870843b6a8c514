"""framework.data.image_files: which files are images, decoding to RGB, refusing a file that is not an image or is
truncated (named), and a content hash that follows the bytes."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from framework.data.image_files import BadImage, file_digest, list_images, load_image
from framework.errors import InputError


def _jpeg(path, colour=(200, 40, 10), size=(32, 24)):
    Image.new("RGB", size, colour).save(path, format="JPEG")
    return path


def test_list_images_is_recursive_sorted_and_leaves_out_other_and_hidden_files(tmp_path):
    (tmp_path / "b" / "deep").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    paths = [_jpeg(tmp_path / "b" / "deep" / "z.JPG"), _jpeg(tmp_path / "a.jpeg")]
    Image.new("L", (8, 8), 7).save(tmp_path / "b" / "c.png")
    _jpeg(tmp_path / ".hidden" / "x.jpg")
    (tmp_path / "notes.txt").write_text("not an image")
    assert list_images(tmp_path) == sorted([*paths, tmp_path / "b" / "c.png"])


def test_a_path_that_is_not_a_folder_or_holds_no_image_is_refused_naming_it(tmp_path):
    with pytest.raises(InputError, match="missing' is not a folder"):
        list_images(tmp_path / "missing")
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(InputError, match=f"{tmp_path.name}' holds no image"):
        list_images(tmp_path)


def test_load_image_gives_rgb_from_a_path_or_bytes_with_transparency_on_white(tmp_path):
    grey = tmp_path / "g.png"
    Image.new("L", (5, 3), 100).save(grey)
    img = load_image(grey)
    assert img.mode == "RGB" and img.size == (5, 3) and img.getpixel((0, 0)) == (100, 100, 100)
    clear = io.BytesIO()
    Image.new("RGBA", (4, 4), (0, 0, 0, 0)).save(clear, format="PNG")
    assert load_image(clear.getvalue(), name="clear.png").getpixel((1, 1)) == (255, 255, 255)
    assert load_image(_jpeg(tmp_path / "c.jpg")).getpixel((3, 3))[0] > 150  # JPEG is lossy: red stays red


def test_a_truncated_jpeg_and_a_text_named_png_are_bad_images_naming_the_file(tmp_path):
    raw = _jpeg(tmp_path / "ok.jpg", size=(64, 64)).read_bytes()
    (tmp_path / "cut.jpg").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "text.png").write_text("hello, I am text")
    with pytest.raises(BadImage, match=r"cut\.jpg: truncated"):
        load_image(tmp_path / "cut.jpg")
    with pytest.raises(BadImage, match=r"text\.png: not an image") as err:
        load_image(tmp_path / "text.png")
    assert isinstance(err.value, InputError)
    with pytest.raises(BadImage, match=r"blob: truncated"):
        load_image(raw[: len(raw) // 2], name="blob")


def test_file_digest_follows_the_content_not_the_name(tmp_path):
    a, b = _jpeg(tmp_path / "a.jpg"), tmp_path / "b.jpg"
    b.write_bytes(a.read_bytes())
    assert file_digest(a) == file_digest(b) and len(file_digest(a)) == 32
    _jpeg(b, colour=(0, 0, 255))
    assert file_digest(a) != file_digest(b)


def test_check_image_refuses_what_load_image_refuses_without_decoding_a_jpeg_whole(tmp_path):
    import numpy as np

    from framework.data.image_files import check_image

    noise = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "big.jpg", quality=90)
    raw = (tmp_path / "big.jpg").read_bytes()
    check_image(tmp_path / "big.jpg")
    for cut in (len(raw) // 2, len(raw) - 10):
        with pytest.raises(BadImage, match="cut: truncated"):
            check_image(raw[:cut], name="cut")
    with pytest.raises(BadImage, match="not an image"):
        check_image(b"plain text", name="t.png")
