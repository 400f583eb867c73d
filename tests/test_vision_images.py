"""Encoded images as the vision models see them: an image stored in any of the forms a
camera, a scanner or a drawing canvas writes gives the pixels a viewer shows, so a model
answers the same for each (16-bit, 32-bit and float samples, EXIF orientation,
transparency); the value range the small models declare, and the pixels one call may decode."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from zoo_vision import images

import zoo
from zoo.errors import InputError

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


# --- float and 32-bit integer samples --------------------------------------------------


def test_float_grayscale_in_0_to_1_is_scaled_not_clipped():
    # a float image (numpy's, scikit-image's) holds 0..1; Pillow's conversion read it as
    # 0..255 and clipped it: all black but for pixels of exactly 1
    unit = Image.fromarray(np.asarray(_digit()).astype(np.float32) / 255, "F")
    np.testing.assert_allclose(_digits(_encode(unit, "TIFF")), _digits(REFERENCE), atol=1e-6)
    np.testing.assert_allclose(_rgb(_encode(unit, "TIFF")), _rgb(REFERENCE), atol=1e-6)


def test_float_grayscale_in_0_to_255_is_read_as_8_bit_values():
    wide = Image.fromarray(np.asarray(_digit()).astype(np.float32), "F")
    np.testing.assert_allclose(_digits(_encode(wide, "TIFF")), _digits(REFERENCE), atol=1e-6)


@pytest.mark.parametrize("low, high", [(-0.5, 1.0), (0.0, 300.0)])
def test_float_grayscale_of_no_known_range_is_refused(low, high):
    values = np.linspace(low, high, 64 * 64, dtype=np.float32).reshape(64, 64)
    data = _encode(Image.fromarray(values, "F"), "TIFF")
    with pytest.raises(InputError, match=r"image 1 \(\d+ bytes\) holds floating-point samples from -?[\d.]+ to "
                                         r"[\d.]+: a float image is read as 0 to 1 or 0 to 255"):
        images.digit_batch([data], SIZE)


def test_32_bit_integer_grayscale_holding_8_bit_samples_is_not_black():
    data = _encode(Image.fromarray(np.asarray(_digit()).astype(np.int32), "I"), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    np.testing.assert_allclose(_digits(data), _digits(REFERENCE), atol=1e-6)


def test_32_bit_integer_grayscale_beyond_16_bits_is_refused():
    data = _encode(Image.fromarray(np.asarray(_digit()).astype(np.int32) * 65536, "I"), "TIFF")
    with pytest.raises(InputError, match=r"image 1 \(\d+ bytes\) holds 32-bit integer samples from 0 to "
                                         r"16711680: read as 0 to 255 or 0 to 65535"):
        images.digit_batch([data], SIZE)


def test_16_bit_png_stays_16_bit_however_dark():
    # a 16-bit PNG says its depth: its samples are 0..65535 even when all are below 256
    dark = Image.fromarray((np.asarray(_digit()) // 255).astype(np.uint16))  # 0 or 1 of 65535
    assert _digits(_encode(dark)).max() == 0.0


# --- the per-request budget -------------------------------------------------------------

SMALL_MODELS = ("resnet8.digits", "mobilenetv2.digits", "centernet.shapes")


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_what_the_small_models_are_fed_lies_in_0_to_1(name):
    """Samples, both splits and decoded images: the values the models were trained on."""
    spec = zoo.get_model(name).tiny()
    for split in ("train", "test"):
        image = spec.dataset.load(split)[0]["image"]
        assert 0.0 <= image.min() and image.max() <= 1.0
    sample = spec.sample(8, np.random.default_rng(0))["image"]
    assert 0.0 <= sample.min() and sample.max() <= 1.0
    ramp = np.broadcast_to(np.linspace(0, 255, 64).round().astype(np.uint8), (64, 64))
    white, black = np.full((64, 64), 65535, np.uint16), np.zeros((64, 64, 3), np.uint8)
    decoded = spec.preprocess([_encode(Image.fromarray(a)) for a in (ramp, white, black)])["image"]
    assert 0.0 <= decoded.min() and decoded.max() <= 1.0


def _png_header(width: int, height: int) -> bytes:
    """The first bytes of a PNG of `width` x `height` RGBA pixels: a header, no pixel data."""
    buffer = io.BytesIO()
    Image.new("RGBA", (width, height)).save(buffer, "PNG")
    return buffer.getvalue()[:64]


def test_a_request_of_too_many_pixels_in_all_is_refused_before_any_is_decoded():
    """64 PNGs of 4096 x 4096 pixels each (4.8 MB) cost 37 s of a server's CPU; each is
    within MAX_PIXELS, their sum is refused from the headers (truncated here: decoding
    any would fail with another error)."""
    items = [_png_header(4096, 4096)] * 4 + [_png_header(64, 64)]
    with pytest.raises(InputError, match=r"the 5 images hold 67,112,960 pixels in all, more than the 67,108,864 "
                                         r"one call may have"):
        images.rgb_batch(items, SIZE)
    with pytest.raises(InputError, match=r"image 1 \(64 bytes\) does not decode"):  # within it: decoded
        images.rgb_batch([_png_header(64, 64)] * 4 + [_png_header(4096, 4096)] * 3, SIZE)
