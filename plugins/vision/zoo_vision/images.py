"""Domain-native inputs and outputs for the vision models: encoded images (PNG, JPEG, any
format Pillow reads) in, labels or detections as JSON out.

Every image is resized to the model's fixed input size, so a batch of images of mixed
sizes gives each item exactly what it would get alone.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from zoo.errors import InputError

if TYPE_CHECKING:
    from PIL import Image


#: the most pixels an input image may have (a 16-megapixel photo is 4,000 x 4,000): every
#: model here resizes to at most 64 x 64, and without a bound of its own a 62 KB PNG of
#: 8,000 x 8,000 pixels (below Pillow's own 89-megapixel bomb limit) cost 0.35-0.45 s and
#: 306 MB of peak memory to decode, per item of a request; refused from its header instead,
#: before any pixel is decoded: 9-10 ms and 1 MB (tools/image_bound.py, docs/benchmarks.md).
MAX_PIXELS = 4096 * 4096
#: the most pixels all the images of one call to a preprocess may have in all (a server
#: request's BYTES items): MAX_PIXELS bounds one item, not a request of 64 such items, which
#: cost 37 s of the server's CPU (64 RGBA PNGs of 4096 x 4096, 4.8 MB). Checked from the
#: headers before any pixel is decoded, as MAX_PIXELS is.
MAX_CALL_PIXELS = 4 * MAX_PIXELS


class _UnknownScale(Exception):
    """Samples whose scale neither the file says nor their values tell."""


def check_pixels(items: Sequence[bytes]) -> None:
    """InputError when one image has more than MAX_PIXELS or all have more than
    MAX_CALL_PIXELS, read from each header; one that does not open counts nothing here, and
    `decode` names it."""
    from PIL import Image

    total = 0
    for index, item in enumerate(items, 1):
        try:
            with Image.open(io.BytesIO(item)) as image:
                total += _pixels(image, item, index)
        except (InputError, MemoryError, RecursionError):
            raise
        except Exception:  # noqa: BLE001, S112 - what Pillow raises on a malformed header: decode names it
            continue
    if total > MAX_CALL_PIXELS:
        raise InputError(f"the {len(items)} images hold {total:,} pixels in all, more than the {MAX_CALL_PIXELS:,} "
                         f"one call may have: send them in smaller requests")


def _pixels(image: Image.Image, item: bytes, index: int) -> int:
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise InputError(f"image {index} ({len(item)} bytes) is {width} x {height} pixels, more than "
                         f"the {MAX_PIXELS:,} an input may have")
    return width * height


def decode(item: bytes, index: int, mode: str) -> Image.Image:
    """One encoded image as a Pillow image in `mode` ("L" or "RGB"); InputError names the
    item (`index` counts from 1). Pillow is imported here, by the first image decoded, not
    by registering the models."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(item)) as image:
            _pixels(image, item, index)
            image.load()
            sixteen = image.mode in _SIXTEEN_BIT or image.mode == "I" and image.format in _SIXTEEN_BIT_FORMATS
            return _to_mode(ImageOps.exif_transpose(image), mode, sixteen)
    except InputError:
        raise
    except _UnknownScale as exc:
        raise InputError(f"image {index} ({len(item)} bytes) {exc}") from None
    except UnidentifiedImageError:
        raise InputError(f"image {index} ({len(item)} bytes) does not decode: not an image Pillow can decode") from None
    except (MemoryError, RecursionError):
        raise
    except Exception as exc:  # noqa: BLE001 - Pillow's decoders raise OSError, SyntaxError,
        # NotImplementedError, struct.error, IndexError... on malformed files: all the client's input
        reason = str(exc) or type(exc).__name__
        raise InputError(f"image {index} ({len(item)} bytes) does not decode: {reason[:200]}") from None


#: Pillow's modes of 16-bit samples (PNG, TIFF): 0..65535.
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
#: formats whose "I" (32-bit) images hold 16-bit samples: older Pillow opens a 16-bit
#: grayscale PNG so, and a 16-bit PGM comes as "I" scaled to 0..65535.
_SIXTEEN_BIT_FORMATS = ("PNG", "PPM")


def _to_mode(image: Image.Image, mode: str, sixteen: bool) -> Image.Image:
    """`image` in `mode`, as a viewer shows it:
    - 16-bit samples (`sixteen`) scaled to 8 bits (Pillow's own conversion clips them at
      255, so a 16-bit scan came out as white wherever it held any ink at all);
    - float and other 32-bit integer samples scaled as `_eight_bit` says;
    - transparency laid over white, as a browser shows it on a page (Pillow's conversion
      drops the alpha channel, so a drawing exported with a transparent background, black
      ink whose shape is only in the alpha channel, came out as one black square).
    The orientation an EXIF tag gives has been applied by then (ImageOps.exif_transpose)."""
    from PIL import Image

    if sixteen:
        pixels = np.asarray(image).astype(np.float64) / 257.0
        image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "L")
    elif image.mode in ("F", "I"):
        image = _eight_bit(image)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode in ("P", "L", "RGB") and "transparency" in image.info):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return image.convert(mode)


def _eight_bit(image: Image.Image) -> Image.Image:
    """A float ("F") or 32-bit integer ("I") image, whose file gives no scale, as 8 bits: the
    smallest usual scale that holds every sample, 0..1 (numpy's and scikit-image's floats)
    or 0..255 for floats, 0..255 or 0..65535 for integers (an int32 array saved from 8- or
    16-bit data). Pillow's conversion takes both as 0..255 and clips: a float image in 0..1
    came out black. Samples beyond the larger scale (or negative, or NaN) are refused, not
    guessed at: a 32-bit TIFF of 0..255 reads as 8-bit, so a 16-bit one only as dark is too."""
    from PIL import Image

    pixels = np.asarray(image, dtype=np.float64)
    low, high = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
    floats = image.mode == "F"
    for top in (1.0, 255.0) if floats else (255.0, 65535.0):
        if low >= 0.0 and high <= top:
            return Image.fromarray(np.rint(pixels * (255.0 / top)).astype(np.uint8), "L")
    if floats:
        raise _UnknownScale(f"holds floating-point samples from {low:g} to {high:g}: a float image is read as 0 to 1 "
                            f"or 0 to 255; scale it to one of them or save it as 8 or 16 bits")
    raise _UnknownScale(f"holds 32-bit integer samples from {low:.0f} to {high:.0f}: read as 0 to 255 or 0 to 65535; "
                        f"save it as 8 or 16 bits")


def rgb_batch(items: Sequence[bytes], size: int) -> dict[str, np.ndarray]:
    """Images as the detector sees them: RGB, `size` x `size`, float32 in [0, 1], NCHW."""
    from PIL import Image

    check_pixels(items)
    arrays = [np.asarray(decode(item, i, "RGB").resize((size, size), Image.Resampling.BILINEAR))
              for i, item in enumerate(items, 1)]
    return {"image": (np.stack(arrays).astype(np.float32) / 255.0).transpose(0, 3, 1, 2).copy()}


def digit_batch(items: Sequence[bytes], size: int) -> dict[str, np.ndarray]:
    """Images as scikit-learn's digits are: grayscale, `size` x `size`, ink bright on a
    dark ground, float32 in [0, 1] (digits.py divides the 0..16 counts by 16).

    The digits were made by counting inked pixels in 4x4 blocks of 32x32 bitmaps, so the
    resize averages over boxes (Pillow's BOX filter) as that did. A scan with dark ink on
    light paper (its border brighter than mid-grey) is inverted to match.
    """
    from PIL import Image

    check_pixels(items)
    arrays = []
    for i, item in enumerate(items, 1):
        pixels = np.asarray(decode(item, i, "L").resize((size, size), Image.Resampling.BOX), dtype=np.float32) / 255
        border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
        arrays.append(1.0 - pixels if border.mean() > 0.5 else pixels)
    return {"image": np.stack(arrays)[:, None].astype(np.float32)}


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def classifications(outputs: Mapping[str, np.ndarray], top: int = 5) -> list[dict]:
    """logits -> one {"label", "score", "top5"} per image; scores are softmax probabilities."""
    probs = _softmax(np.asarray(outputs["logits"], dtype=np.float64))
    results = []
    for p in probs:
        order = np.argsort(-p, kind="stable")[:top]
        results.append({"label": int(order[0]), "score": float(p[order[0]]),
                        "top5": [{"label": int(j), "score": float(p[j])} for j in order]})
    return results


def detections(outputs: Mapping[str, np.ndarray], classes: Sequence[str], image_size: int,
               threshold: float) -> list[list[dict]]:
    """The detector's fixed-size outputs -> per image, the detections scoring at least
    `threshold`, best first. Boxes are [x1, y1, x2, y2] as fractions of the image's width
    and height (as the TensorFlow Object Detection API reports them), so they hold for
    the original image whatever size it had before the resize."""
    results = []
    for boxes, scores, labels in zip(outputs["boxes"], outputs["scores"], outputs["classes"]):
        keep = [j for j in np.argsort(-scores, kind="stable") if scores[j] >= threshold]
        results.append([{"box": [round(float(v) / image_size, 5) for v in boxes[j]], "score": float(scores[j]),
                         "label": classes[int(labels[j])]} for j in keep])
    return results
