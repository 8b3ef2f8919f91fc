"""Images in: Pillow decodes photos to RGB bytes (EXIF orientation applied, hostile files refused
as FormatError), and our numpy resize agrees with Pillow's BILINEAR resize on float images."""

from __future__ import annotations

import io

import numpy as np
import pytest

from candle_web.core.errors import FormatError, ModelNotFound
from candle_web.io import image as image_io

PIL = pytest.importorskip("PIL.Image", reason="Pillow is not installed (pip install "
                          "'candle-web[vision]'; make test installs it)")


@pytest.mark.parametrize("size, out", [((100, 80), (41, 37)), ((30, 20), (60, 45)),
                                       ((417, 1000), (416, 416)), ((7, 7), (7, 7))])
def test_resize_matches_pillow_bilinear(size, out):
    plane = np.random.default_rng(0).random(size).astype(np.float32) * 255
    expected = np.asarray(PIL.fromarray(plane, mode="F").resize(out[::-1], PIL.BILINEAR))
    got = image_io.resize(np.stack([plane, 255 - plane], axis=-1), *out)
    # Both are weighted means of values in [0, 255] with the same weights; they differ only in
    # float32 rounding of the sums (~255 * 2**-24 per term): 1e-3 is far below one grey level.
    np.testing.assert_allclose(got[..., 0], expected, atol=1e-3)
    np.testing.assert_allclose(got[..., 1], 255 - expected, atol=1e-3)


def test_square_input_pads_below_and_right():
    photo = np.full((20, 40, 3), 200, dtype=np.uint8)
    tensor, factor = image_io.square_input(photo, 20)
    assert tensor.shape == (20, 20, 3) and factor == 2.0
    # Rows 0-9 hold the photo (grey), rows 10-19 the black padding; the row between blends.
    assert np.allclose(tensor[:9], 200) and np.allclose(tensor[11:], 0)


def test_load_rgb_decodes_and_applies_exif_orientation(tmp_path):
    pixels = np.zeros((10, 30, 3), dtype=np.uint8)
    pixels[:, :10] = (255, 0, 0)  # red on the left
    photo = PIL.fromarray(pixels)
    exif = photo.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    path = tmp_path / "rotated.jpg"
    photo.save(path, quality=95, exif=exif)
    rgb = image_io.load_rgb(path)
    assert rgb.shape == (30, 10, 3) and rgb.dtype == np.uint8
    assert rgb[:8, :, 0].mean() > 200 and rgb[-8:, :, 0].mean() < 50  # red now on top
    buffer = io.BytesIO()
    PIL.fromarray(pixels).save(buffer, format="PNG")
    np.testing.assert_array_equal(image_io.load_rgb(buffer.getvalue()), pixels)


def test_hostile_photos_are_refused(tmp_path, monkeypatch):
    with pytest.raises(FormatError, match="not an image"):
        image_io.load_rgb(b"GIF89a but not really")
    with pytest.raises(ModelNotFound, match="absent.jpg"):
        image_io.load_rgb(tmp_path / "absent.jpg")
    buffer = io.BytesIO()
    PIL.new("RGB", (200, 100)).save(buffer, format="PNG")
    # The header's size is checked before any pixel is decoded.
    monkeypatch.setattr(image_io, "MAX_PIXELS", 19_999)
    with pytest.raises(FormatError, match="200x100 is more than the 19999 pixels"):
        image_io.load_rgb(buffer.getvalue())
