"""MobileNetV2: the standard architecture's size, a short training run on digits, and the
digit classifiers' image inputs (PNG/JPEG bytes in through `zoo.predict`)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from zoo_vision import digits

import zoo
from zoo.errors import InputError
from zoo.train import module_fn


def test_mobilenetv2_has_the_standard_size():
    spec = zoo.get_model("mobilenetv2")
    assert spec.inputs[0].shape == ("batch", 3, 224, 224) and spec.outputs[0].shape == ("batch", 1000)
    # torchvision's mobilenet_v2() and the paper's 3.4M (+ the 1000-way classifier's bias terms)
    assert sum(p.numel() for p in spec.build().parameters()) == 3_504_872
    # width 0.5 rounds channels to multiples of 8, keeping the 1280-wide last layer
    assert sum(p.numel() for p in spec.configure(width_mult=0.5).build().parameters()) == 1_968_680


def test_untrained_mobilenetv2_logits_are_not_vanishing():
    # parity of the random-init benchmark model must compare real numbers, not ~1e-9
    spec = zoo.get_model("mobilenetv2").tiny()
    logits = module_fn(spec.build().eval(), spec)(spec.sample(4, np.random.default_rng(0)))["logits"]
    assert 1e-2 < np.abs(logits).max() < 1e2


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """mobilenetv2.digits at half width, trained for a few epochs."""
    spec = zoo.get_model("mobilenetv2.digits").configure(width_mult=0.5)
    ckpt = zoo.train(spec, out=tmp_path_factory.mktemp("ckpt"), epochs=8, progress=False)
    return spec, ckpt


def test_a_short_training_run_reaches_its_accuracy(trained):
    _, ckpt = trained
    assert ckpt.metrics["test_accuracy"] >= 0.9, ckpt.metrics


def _encode(pixels: np.ndarray, fmt: str = "PNG", scale: int = 1) -> bytes:
    """An (8, 8) image in [0, 1] as encoded bytes, optionally enlarged `scale` times."""
    image = Image.fromarray((pixels * 255).round().astype(np.uint8), mode="L")
    if scale > 1:
        image = image.resize((8 * scale, 8 * scale), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["resnet8.digits", "mobilenetv2.digits"])
def test_digit_pngs_round_trip_to_the_dataset_scale(name):
    spec = zoo.get_model(name)
    x, _ = digits.load("test")
    images = x["image"][:5, 0]
    decoded = spec.preprocess([_encode(im) for im in images])["image"]
    assert decoded.shape == (5, 1, 8, 8) and decoded.dtype == np.float32
    assert np.abs(decoded[:, 0] - images).max() <= 0.5 / 255 + 1e-6
    # a larger scan, dark ink on white paper and in RGB, comes out as the same digit
    scan = Image.fromarray(((1 - images[0]) * 255).round().astype(np.uint8)).resize((32, 32), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    scan.convert("RGB").save(buffer, format="PNG")
    assert np.abs(spec.preprocess([buffer.getvalue()])["image"][0, 0] - images[0]).max() <= 1 / 255 + 1e-6


def test_digit_images_go_through_zoo_predict(trained):
    spec, ckpt = trained
    x, y = digits.load("test")
    images = x["image"][:20]
    fn = module_fn(ckpt.module(spec), spec)
    results = zoo.predict(spec, fn, [_encode(im[0]) for im in images])
    want = fn({"image": images})["logits"].argmax(axis=1)
    assert [r["label"] for r in results] == want.tolist()
    assert np.mean(np.array([r["label"] for r in results]) == y[:20]) >= 0.8
    for r in results:
        assert r["top5"][0] == {"label": r["label"], "score": r["score"]}
        scores = [t["score"] for t in r["top5"]]
        assert len(scores) == 5 and scores == sorted(scores, reverse=True) and sum(scores) <= 1.0 + 1e-9
    # JPEG is lossy, yet a clean digit keeps its label
    jpeg = zoo.predict(spec, fn, [_encode(images[0, 0], "JPEG", scale=4)])
    assert jpeg[0]["label"] == results[0]["label"]


def test_undecodable_digit_image_is_an_input_error_naming_the_item():
    spec = zoo.get_model("mobilenetv2.digits")
    good = _encode(np.zeros((8, 8)))
    with pytest.raises(InputError, match=r"image 3 \(3 bytes\) does not decode"):
        spec.preprocess([good, good, b"GIF"])
    with pytest.raises(InputError, match="give at least one image"):
        zoo.predict(spec, lambda inputs: {}, [])
