"""A model with two dynamic input axes besides the batch (an image of any height and
width) is recorded and verified with the two at different sizes, not only together.

Found by a user: the test vectors moved every axis to its smallest, typical and largest
size at once (h = w in each), so a forward that relates the axes (`if h != w`: pad to a
square) exported to ONNX Runtime as if they were always equal (torch.export gave h and w
one symbol at a square example) and passed parity, then answered 16x40 images 0.5 off.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.errors import ZooError
from zoo.vectors import mixed_sizes

AXES = {"batch": zoo.AxisRange(1, 2, 4), "h": zoo.AxisRange(16, 32, 48), "w": zoo.AxisRange(16, 32, 48)}


class FullyConvolutional(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, image):
        return self.conv(image)


class Letterbox(FullyConvolutional):
    def forward(self, image):
        h, w = image.shape[-2:]
        if h != w:  # pad to a square, run, crop back
            s = max(h, w)
            image = F.pad(image, (0, s - w, 0, s - h), value=1.0)
        return self.conv(image)[..., :h, :w]


def spec_of(name: str, build) -> zoo.ModelSpec:
    return zoo.ModelSpec(name=name, domain="vision", task="segmentation",
                         inputs=(zoo.TensorSpec("image", "float32", ("batch", 3, "h", "w")),),
                         outputs=(zoo.TensorSpec("mask", "float32", ("batch", 2, "h", "w")),), build=build,
                         sample=lambda b, rng: {"image": rng.standard_normal((b, 3, 32, 32)).astype(np.float32)},
                         axes=AXES)


def test_the_fourth_set_puts_the_axes_at_different_ends(tmp_path):
    spec = spec_of("fcn.mixed", FullyConvolutional)
    assert mixed_sizes(spec) == {"batch": 2, "h": 16, "w": 48}
    art = zoo.export(spec, "onnxruntime", repository=tmp_path, random_init=True)
    assert [s["axes"] for s in art.manifest["test_data"]["sets"]] == [
        {"batch": 1, "h": 16, "w": 16}, {"batch": 2, "h": 32, "w": 32}, {"batch": 4, "h": 48, "w": 48},
        {"batch": 2, "h": 16, "w": 48}]
    zoo.verify(art.path)  # the runner holds to all four
    one_axis = spec_of("fcn.one", FullyConvolutional)
    assert mixed_sizes(zoo.ModelSpec(**{**{k: getattr(one_axis, k) for k in one_axis.__dataclass_fields__
                                           if k != "plugin"},
                                        "axes": {**AXES, "w": zoo.AxisRange(32, 32, 32)}})) is None


def test_the_fourth_set_breaks_the_proportion_the_other_sets_keep():
    # a review found it: h in [8, 16] and w in [4, 8] spread to (8, 8), equal, and no set was
    # added, while every set kept h = 2w
    spec = spec_of("fcn.ratio", FullyConvolutional)
    ratio = zoo.ModelSpec(**{**{k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "plugin"},
                             "axes": {**AXES, "h": zoo.AxisRange(8, 12, 16), "w": zoo.AxisRange(4, 6, 8)}})
    assert mixed_sizes(ratio) == {"batch": 2, "h": 16, "w": 4}


def test_a_forward_relating_two_axes_is_refused_not_exported_as_if_they_were_equal(tmp_path):
    spec = spec_of("letterbox.mixed", Letterbox)
    module = spec.build().eval()
    image = torch.randn(1, 3, 16, 40)
    with pytest.raises(ZooError, match=r"test vectors test_data/set_3.safetensors \(h=16, w=48\): .* output mask "
                                       r"at batch 2 differs from PyTorch fp32 by up to"):
        art = zoo.export(spec, "onnxruntime", repository=tmp_path, random_init=True)
        # what the export wrote, had it been allowed: wrong on a non-square image
        got = zoo.load(art.path)({"image": image.numpy()})["mask"]
        print("max error on 16x40:", float(np.abs(got - module(image).detach().numpy()).max()))
    assert not (tmp_path / "letterbox.mixed.onnxruntime.fp32").exists()


def test_bench_lengths_on_a_model_with_two_axes_is_refused(tmp_path):
    # before: --lengths 16,48 set h alone, w staying at its typical 32, and said nothing
    with pytest.raises(zoo.errors.UsageError, match=r"--lengths sets one dynamic axis besides the batch, and "
                                                   r"fcn.lengths has 2 \(h, w\)"):
        zoo.benchmark(spec_of("fcn.lengths", FullyConvolutional), "onnxruntime", 1, lengths=[16, 48],
                      repository=tmp_path, random_init=True)
    assert not any(tmp_path.iterdir())
