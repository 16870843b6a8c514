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


# ---- decoded as a viewer shows it --------------------------------------------------------------------------------
def test_a_16_bit_ramp_and_a_float_image_are_rescaled_not_clipped(tmp_path):
    import numpy as np

    from framework.data.image_files import check_image

    ramp = np.tile(np.linspace(0, 65535, 64).round().astype(np.uint16), (4, 1))
    Image.fromarray(ramp).save(tmp_path / "deep.png")  # mode I;16, a 16-bit grey PNG
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    grey = np.asarray(load_image(tmp_path / "deep.png", channels=1))
    assert grey[0].tolist() == np.round(ramp[0] / 257).astype(int).tolist()  # not 63 of 64 columns at 255
    rgb = np.asarray(load_image(tmp_path / "deep.png"))
    assert rgb.shape == (4, 64, 3) and (rgb[..., 0] == grey).all()
    unit = np.tile(np.linspace(0, 1, 32, dtype=np.float32), (3, 1))
    Image.fromarray(unit, mode="F").save(tmp_path / "float.tif")
    assert np.asarray(load_image(tmp_path / "float.tif", channels=1))[0].tolist() == \
        np.round(unit[0] * 255).astype(int).tolist()  # a float TIFF in [0, 1], not all black
    assert check_image(tmp_path / "deep.png") == check_image(tmp_path / "float.tif") == 1
    assert check_image(_jpeg(tmp_path / "colour.jpg")) == 3


def test_exif_orientation_is_applied(tmp_path):
    img = Image.new("RGB", (60, 20), (10, 20, 30))
    img.paste((250, 0, 0), (0, 0, 10, 20))  # a red band on the stored image's left
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show
    img.save(tmp_path / "turned.jpg", exif=exif, quality=95)
    shown = load_image(tmp_path / "turned.jpg")
    assert shown.size == (20, 60)  # as a viewer shows it
    top = shown.getpixel((10, 2))
    assert top[0] > 200 and top[2] < 60  # the band is on top after the turn


def test_a_symlink_loop_lists_every_image_once_naming_the_link(tmp_path, caplog):
    import os

    for label in ("cat", "dog"):
        (tmp_path / "pets" / label).mkdir(parents=True)
        _jpeg(tmp_path / "pets" / label / f"{label}.jpg")
    os.symlink(tmp_path / "pets", tmp_path / "pets" / "cat" / "back")
    with caplog.at_level("WARNING"):
        found = list_images(tmp_path / "pets")
    assert found == [tmp_path / "pets" / "cat" / "cat.jpg", tmp_path / "pets" / "dog" / "dog.jpg"]
    assert "cat/back: a link to the folder" in caplog.text and "listed once" in caplog.text
