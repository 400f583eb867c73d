"""Zero-padding and ragged batching: `zoo serve` merges requests of different lengths
only for models whose outputs padding does not change (`zoo.padding`).

Every registered model with a dynamic non-batch axis is held to it here (the serving docs
rely on it); models written the way users write them, without a mask or with PyTorch's
`key_padding_mask` convention (True = padding), are found unsafe and served with batches
of identical shapes only, so that concurrent requests get what each gets alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec
from zoo.export import reference_module
from zoo.padding import padded, padding_safe, ragged_axes, shifted
from zoo.train import module_fn

RAGGED = [name for name in zoo.list_models() if ragged_axes(zoo.get_model(name))]


@pytest.mark.parametrize("name", RAGGED)
def test_every_registered_model_with_a_dynamic_axis_is_unchanged_by_zero_padding(name):
    spec = zoo.get_model(name).tiny()
    module, _ = reference_module(spec, random_init=True)
    safe, why = padding_safe(spec, module_fn(module, spec), spec.sample(2, np.random.default_rng(0)))
    assert safe, why


class LastStep(torch.nn.Module):
    """An LSTM classifier reading its last time step: no mask, so padding is read as data."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = torch.nn.LSTM(4, 8, batch_first=True), torch.nn.Linear(8, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class KeyPadding(torch.nn.Module):
    """Attention with PyTorch's key_padding_mask (True = padding): a zero is a real token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.attn = torch.nn.Embedding(50, 16), torch.nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, input_ids, key_padding_mask):
        h = self.embed(input_ids)
        out, _ = self.attn(h, h, h, key_padding_mask=key_padding_mask, need_weights=False)
        keep = (~key_padding_mask).unsqueeze(-1).float()
        return (out * keep).sum(1) / keep.sum(1).clamp(min=1)


def _key_padding_sample(batch, rng):
    pad = np.arange(8)[None, :] >= rng.integers(2, 9, batch)[:, None]
    return {"input_ids": rng.integers(1, 50, (batch, 8)) * ~pad, "key_padding_mask": pad}


LAST_STEP = ModelSpec(
    name="lstm.last-step", domain="tabular", task="sequence-classification",
    inputs=(TensorSpec("x", "float32", ("batch", "seq", 4)),), outputs=(TensorSpec("logits", "float32", ("batch", 3)),),
    build=LastStep, sample=lambda b, rng: {"x": rng.standard_normal((b, 6, 4)).astype(np.float32)},
    axes={"batch": AxisRange(1, 4, 16), "seq": AxisRange(1, 6, 32)})
KEY_PADDING = ModelSpec(
    name="mha.key-padding", domain="nlp", task="feature-extraction",
    inputs=(TensorSpec("input_ids", "int64", ("batch", "seq"), value_range=(0, 49)),
            TensorSpec("key_padding_mask", "bool", ("batch", "seq"))),
    outputs=(TensorSpec("pooled", "float32", ("batch", 16)),), build=KeyPadding, sample=_key_padding_sample,
    axes={"batch": AxisRange(1, 4, 16), "seq": AxisRange(2, 8, 32)})


@pytest.mark.parametrize("spec", [LAST_STEP, KEY_PADDING], ids=lambda s: s.name)
def test_a_model_that_reads_padding_as_data_is_found_unsafe(spec):
    torch.manual_seed(0)
    fn = module_fn(spec.build().eval(), spec)
    safe, why = padding_safe(spec, fn, spec.sample(2, np.random.default_rng(0)))
    assert not safe and "zero-padding seq by 3 changes output" in why


class TopBoxes(torch.nn.Module):
    """A detection head keeping the best min(4, anchors) boxes: its `dets` axis is in no input,
    so zero-padded anchors change how many boxes a request gets and which."""

    def forward(self, anchors):
        scores = anchors[..., 0]
        k = min(4, anchors.shape[1])
        _, index = scores.topk(k, dim=1)
        return {"boxes": torch.gather(anchors, 1, index.unsqueeze(-1).expand(-1, -1, anchors.shape[2]))}


TOP_BOXES = ModelSpec(
    name="head.top-boxes", domain="vision", task="object-detection",
    inputs=(TensorSpec("anchors", "float32", ("batch", "anchors", 5)),),
    outputs=(TensorSpec("boxes", "float32", ("batch", "dets", 5)),), build=TopBoxes,
    sample=lambda b, rng: {"anchors": rng.uniform(0.5, 1.0, (b, 6, 5)).astype(np.float32)},  # scores above padding's
    axes={"batch": AxisRange(1, 2, 8), "anchors": AxisRange(2, 6, 16), "dets": AxisRange(2, 4, 4)})


def test_an_output_axis_no_input_has_is_never_padded():
    # before: the probe (6 anchors padded to 9 with zeros, scored below every real one) kept
    # the same top 4, so the head was found safe, and `zoo serve` merged requests of 2 to 5 anchors
    # into padded batches: a 2-anchor request got 4 boxes, two of them padding
    fn = module_fn(TOP_BOXES.build().eval(), TOP_BOXES)
    safe, why = padding_safe(TOP_BOXES, fn, TOP_BOXES.sample(2, np.random.default_rng(0)))
    assert not safe and why == ("output boxes has axis 'dets', which no input has, so a padded request's part of "
                                "it cannot be cut back to what the request alone gives")


def test_padding_appends_zeros_on_every_dimension_of_the_axis():
    spec = ModelSpec(
        name="pairs", domain="drug", task="x", inputs=(TensorSpec("bonds", "float32", ("batch", "atoms", "atoms", 2)),
                                                       TensorSpec("mask", "bool", ("batch", "atoms"))),
        outputs=(TensorSpec("y", "float32", ("batch",)),), build=torch.nn.Identity,
        sample=lambda b, rng: {}, axes={"batch": AxisRange(1, 2, 4), "atoms": AxisRange(1, 3, 8)})
    out = padded(spec, {"bonds": np.ones((2, 3, 3, 2), np.float32), "mask": np.ones((2, 3), bool)}, "atoms", 2)
    assert out["bonds"].shape == (2, 5, 5, 2) and out["bonds"][:, 3:].sum() == out["bonds"][:, :, 3:].sum() == 0
    assert out["mask"].shape == (2, 5) and not out["mask"][:, 3:].any()


@pytest.fixture(scope="module")
def last_step_server(tmp_path_factory):
    from serve_support import ServerProcess

    root = tmp_path_factory.mktemp("padding")
    art = zoo.export(LAST_STEP, "onnxruntime", repository=root / "exports", random_init=True)
    server = ServerProcess(root / "exports", "--max-queue-delay-ms", "50", log=root / "server.log")
    try:
        yield server.wait_ready(), art
    finally:
        server.kill()


def test_a_model_that_padding_changes_is_served_without_mixing_lengths(last_step_server):
    """Concurrent requests of lengths 3 to 8 get what each gets alone (zero-padded into one
    batch, the LSTM's last step would read the padding: off by ~0.07 against atol 1e-4)."""
    import asyncio

    import tritonclient.http.aio as aio

    server, art = last_step_server
    runner, tol = zoo.load(art.path), LAST_STEP.tolerance("fp32")
    rng = np.random.default_rng(3)
    requests = [rng.standard_normal((1, 3 + k % 6, 4)).astype(np.float32) for k in range(16)]

    async def send_all():
        client = aio.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            async def one(x):
                tensor = aio.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                return (await client.infer(art.name, [tensor])).as_numpy("logits")
            return await asyncio.gather(*(one(x) for x in requests))
        finally:
            await client.close()

    for x, got in zip(requests, asyncio.run(send_all())):
        np.testing.assert_allclose(got, runner({"x": x})["logits"], atol=tol.atol, rtol=tol.rtol)
    assert f"{art.name}: requests of different lengths are batched only with requests of the same length" in server.log()


def test_zoo_check_warns_that_padding_changes_the_model():
    torch.manual_seed(0)
    report = zoo.check.check(LAST_STEP, LAST_STEP.build().eval())
    assert report.passed and any("zero-padding seq by 3 changes output logits" in w and "same length" in w
                                 for w in report.warnings)
    masked = zoo.get_model("gpt.pydoc").tiny()
    assert not any("zero-padding" in w for w in zoo.check.check(masked, masked.build().eval()).warnings)


class Pooled(torch.nn.Module):
    """A max (or min) over the sequence with no mask: padding's zeros are data to it wherever
    every real value of a column is below (above) zero."""

    def __init__(self, reduce: str):
        super().__init__()
        self.reduce = reduce

    def forward(self, x):
        return getattr(x, self.reduce)(dim=1)


def _pooled(reduce: str) -> ModelSpec:
    return ModelSpec(
        name=f"seq.{reduce}", domain="tabular", task="sequence",
        inputs=(TensorSpec("x", "float32", ("batch", "seq", 4)),),
        outputs=(TensorSpec("pooled", "float32", ("batch", 4)),), build=lambda: Pooled(reduce),
        sample=lambda b, rng: {"x": rng.standard_normal((b, 10, 4)).astype(np.float32)},
        axes={"batch": AxisRange(1, 4, 16), "seq": AxisRange(1, 10, 40)})


@pytest.mark.parametrize("reduce, side", [("amax", "below"), ("amin", "above")])
def test_a_max_over_the_axis_is_found_unsafe_though_its_sample_hides_it(reduce, side):
    # before: the standard-normal sample has a positive maximum in every column (a negative
    # minimum), so padding's zeros changed nothing and `zoo serve` merged lengths 8 and 9 into
    # one batch: a length-8 request of negative values got [0, 0, 0, 0] for its maxima
    spec = _pooled(reduce)
    safe, why = padding_safe(spec, module_fn(spec.build(), spec), spec.sample(2, np.random.default_rng(0)))
    assert not safe and why.startswith("zero-padding seq by 3 changes output pooled by up to")
    assert why.endswith(f"its sample's values shifted {side} zero")


def test_shifted_probes_leave_masks_and_ids_as_they_are():
    spec = ModelSpec(
        name="masked", domain="drug", task="x",
        inputs=(TensorSpec("atoms", "float32", ("batch", "atoms", 2)),
                TensorSpec("mask", "float32", ("batch", "atoms")),
                TensorSpec("ids", "int64", ("batch", "atoms"))),
        outputs=(TensorSpec("y", "float32", ("batch",)),), build=torch.nn.Identity,
        sample=lambda b, rng: {}, axes={"batch": AxisRange(1, 2, 4), "atoms": AxisRange(1, 3, 8)})
    x = {"atoms": np.array([[[-0.5, 2.0]]], np.float32), "mask": np.ones((1, 1), np.float32),
         "ids": np.array([[7]])}
    probes = shifted(spec, x)
    assert probes["shifted below zero"]["atoms"].tolist() == [[[-3.5, -1.0]]]
    assert probes["shifted above zero"]["atoms"].tolist() == [[[1.0, 3.5]]]
    assert all(p["mask"] is x["mask"] or (p["mask"] == x["mask"]).all() for p in probes.values())
    assert all((p["ids"] == x["ids"]).all() for p in probes.values())
    assert shifted(spec, {**x, "atoms": np.ones((1, 1, 2), np.float32)}) == {}  # 0/1 features: left alone
