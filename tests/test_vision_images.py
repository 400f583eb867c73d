"""Encoded images as the vision models see them: an image stored in any of the forms a
camera, a scanner or a drawing canvas writes gives the pixels a viewer shows, so a model
answers the same for each (16-bit samples, EXIF orientation, transparency)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from zoo_vision import images

SIZE = 8


def _digit() -> Image.Image:
    """A bright, asymmetric "7" on black, 64 x 64 (nearest-neighbour from 8 x 8): every
    rotation and flip of it differs."""
    ink = np.zeros((SIZE, SIZE), np.uint8)
    ink[1, 1:7] = 255
    ink[2:7, 5] = 255
    ink[4, 3:7] = 200
    return Image.fromarray(ink, "L").resize((64, 64), Image.Resampling.NEAREST)


def _encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _digits(data: bytes) -> np.ndarray:
    return images.digit_batch([data], SIZE)["image"][0, 0]


def _rgb(data: bytes) -> np.ndarray:
    return images.rgb_batch([data], SIZE)["image"][0]


REFERENCE = _encode(_digit())


def test_the_reference_digit_is_ink_on_black():
    pixels = _digits(REFERENCE)
    assert pixels.max() == 1.0 and pixels[0, 0] == 0.0


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_16_bit_grayscale_is_scaled_not_clipped(fmt):
    sixteen = Image.fromarray(np.asarray(_digit()).astype(np.uint16) * 257)  # 0..65535, mode I;16
    data = _encode(sixteen, fmt)
    assert Image.open(io.BytesIO(data)).mode in ("I;16", "I;16B", "I")
    np.testing.assert_allclose(_digits(data), _digits(REFERENCE), atol=1e-6)
    np.testing.assert_allclose(_rgb(data), _rgb(REFERENCE), atol=1e-6)


def test_32_bit_integer_grayscale_holding_16_bit_samples_is_scaled():
    # older Pillow opens a 16-bit grayscale PNG as mode "I"
    data = _encode(Image.fromarray(np.asarray(_digit()).astype(np.int32) * 257, "I"), "TIFF")
    np.testing.assert_allclose(_digits(data), _digits(REFERENCE), atol=1e-6)


ORIENTATIONS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
                4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90,
                7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_270}


@pytest.mark.parametrize("orientation", sorted(ORIENTATIONS))
def test_exif_orientation_is_applied_as_a_viewer_does(orientation):
    # a phone stores the sensor's pixels and the turn that shows them upright in EXIF
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored = _digit().transpose(ORIENTATIONS[orientation])
    data = _encode(stored, "PNG", exif=exif)
    np.testing.assert_allclose(_digits(data), _digits(REFERENCE), atol=1e-6)
    jpeg = _encode(stored.convert("RGB"), "JPEG", exif=exif, quality=95)
    np.testing.assert_allclose(_digits(jpeg), _digits(_encode(_digit().convert("RGB"), "JPEG", quality=95)),
                               atol=0.05)


def test_a_transparent_background_is_white_as_a_page_shows_it():
    # a drawing canvas's export: black strokes whose shape is in the alpha channel only
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[..., 3] = np.asarray(_digit())
    drawn = _digits(_encode(Image.fromarray(rgba, "RGBA")))
    np.testing.assert_allclose(drawn, _digits(REFERENCE), atol=1e-6)  # inverted as any dark-on-light scan
    la = _digits(_encode(Image.fromarray(rgba, "RGBA").convert("LA")))
    np.testing.assert_allclose(la, _digits(REFERENCE), atol=1e-6)


def test_opaque_alpha_palette_and_bilevel_images_give_the_reference():
    digit = _digit()
    for image in (digit.convert("RGBA"), digit.convert("P"), digit.convert("LA"), digit.convert("RGB")):
        np.testing.assert_allclose(_digits(_encode(image)), _digits(REFERENCE), atol=1e-6)
    np.testing.assert_allclose(_rgb(_encode(digit.convert("RGBA"))), _rgb(REFERENCE), atol=1e-6)
