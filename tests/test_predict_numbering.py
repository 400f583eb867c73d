"""A refused item is numbered as the caller gave it, and named where the caller names it.

`zoo predict` runs items in batches of the spec's largest batch, and a plugin numbers the
items of the batch it is given, in its own words. A truncated PNG given 41st to
centernet.shapes (batches of 32) was "image 9 (100 bytes) does not decode: image file is
truncated (among inputs 33 to 41 of 41: item 1 is input 33)": the core recognized only
"item N", so it left the input's number to be worked out, and the file was not said.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import zoo
from zoo.errors import InputError, ZooError
from zoo.train import module_fn

pytest.importorskip("zoo_vision")


def _png(seed: int) -> bytes:
    """A 32 x 32 grayscale PNG of noise (some 1100 bytes: its first 100 are a truncated file)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def digits():
    spec = zoo.get_model("resnet8.digits").tiny()
    torch.manual_seed(0)
    return spec, module_fn(spec.build().eval(), spec)


def test_a_bad_image_past_the_first_batch_is_named_by_its_input_number_and_path(digits):
    spec, fn = digits
    step = spec.axes["batch"].max
    items = [_png(k) for k in range(step + 1)] + [_png(7)[:100]]  # the truncated one is input step + 2
    names = [f"many/{k:03d}.png" for k in range(1, step + 2)] + ["many/zz_corrupt.png"]
    with pytest.raises(InputError) as info:
        zoo.predict(spec, fn, items, names=names)
    message = str(info.value)
    assert message.startswith("image 2 (100 bytes) does not decode: image file is truncated (among")
    assert message.endswith(f" (among inputs {step + 1} to {step + 2} of {step + 2}: image 1 is input {step + 1}), "
                            f"so image 2 is input {step + 2} (many/zz_corrupt.png)")
    with pytest.raises(InputError) as info:  # no names: the number alone
        zoo.predict(spec, fn, items)
    assert str(info.value).endswith(f", so image 2 is input {step + 2}")


def test_a_bad_image_in_the_first_batch_keeps_its_number_and_gains_its_name(digits):
    spec, fn = digits
    items = [_png(1), _png(2), b"not an image"]
    with pytest.raises(InputError) as info:
        zoo.predict(spec, fn, items, names=["a.png", "b.png", "notes.txt"])
    assert str(info.value) == ("image 3 (12 bytes) does not decode: not an image Pillow can decode "
                               "(image 3 is notes.txt)")
    with pytest.raises(InputError) as info:
        zoo.predict(spec, fn, items)
    assert str(info.value) == "image 3 (12 bytes) does not decode: not an image Pillow can decode"


def test_names_are_one_per_item(digits):
    spec, fn = digits
    with pytest.raises(ZooError, match=r"^1 names for 2 items: give one name per item, or none$"):
        zoo.predict(spec, fn, [_png(1), _png(2)], names=["a.png"])
