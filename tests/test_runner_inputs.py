"""A runner from `zoo.load` refuses bad inputs as the server does, on every backend.

Found by a tester: a runner skipped the server's checks, and each backend then did
something else with a bad input, some silently wrong. Float ids were truncated to
integers everywhere; an id outside the embedding table was garbage on OpenVINO, a raw
library error on ONNX Runtime and torch, and -1 quietly read the last row; a batch
beyond the exported range ran on ONNX Runtime and OpenVINO. Each bad input here must
raise `InputError` with one message on every backend, the message `zoo serve` answers
the same tensors with, while the inputs a runner casts without loss (float64 features,
int32 ids, torch tensors, Fortran-order and big-endian arrays) keep giving the results
of the exact types. Tiny models defined here: token ids with a vocabulary, features of
a fixed size with a second input sharing the batch axis, and one float input of float16,
bfloat16 or float32 (a float its type cannot hold, numpy bfloat16 arrays, and a backend
plugin's runner given exactly the declared types).
"""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest
import torch

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec
from zoo.artifact import Artifact
from zoo.errors import InputError
from zoo.serve import datatypes as dt
from zoo.serve.protocol import InferRequest, Tensor
from zoo.serve.repository import ServeOptions, open_model


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 3)

    def forward(self, ids):
        return self.table(ids).sum(1)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, scale):
        return self.fc(x) * scale


IDS = ModelSpec(name="ids.inputs-test", domain="nlp", task="embedding",
                inputs=(TensorSpec("ids", "int64", ("batch", "seq"), value_range=(0, 9)),),
                outputs=(TensorSpec("out", "float32", ("batch", 3)),),
                axes={"batch": AxisRange(1, 4, 8), "seq": AxisRange(1, 4, 8)},
                build=Embed, sample=lambda b, rng: {"ids": rng.integers(0, 10, (b, 4))})
FEATURES = ModelSpec(name="features.inputs-test", domain="tabular", task="regression",
                     inputs=(TensorSpec("x", "float32", ("batch", 4)),
                             TensorSpec("scale", "float32", ("batch", 1), value_range=(0.0, 10.0))),
                     outputs=(TensorSpec("y", "float32", ("batch", 4)),),
                     axes={"batch": AxisRange(1, 4, 32)}, build=Scaled,
                     sample=lambda b, rng: {"x": rng.standard_normal((b, 4)).astype(np.float32),
                                            "scale": rng.random((b, 1)).astype(np.float32)})


class Widened(torch.nn.Module):
    """Computes in float32 whatever float type its input has (float16, bfloat16)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x.float())


def narrow(name: str, dtype: str, **fields) -> ModelSpec:
    """A model taking one float input of `dtype` (its sample float32 for bfloat16, which numpy lacks)."""
    return ModelSpec(name=name, domain="tabular", task="regression", inputs=(TensorSpec("x", dtype, ("batch", 4)),),
                     outputs=(TensorSpec("y", "float32", ("batch", 2)),), axes={"batch": AxisRange(1, 2, 4)},
                     build=Widened, sample=lambda b, rng: {
                         "x": rng.standard_normal((b, 4)).astype("float32" if dtype == "bfloat16" else dtype)},
                     **fields)


HALF = narrow("half.inputs-test", "float16")
BF16 = narrow("bf16.inputs-test", "bfloat16")
#: scored on a dataset of float64 rows, which its float32 input takes (`zoo.inputs.check_split`)
SCORED = narrow("scored.inputs-test", "float32",
                dataset=zoo.Dataset("float64 rows", lambda split: ({"x": np.linspace(-1, 1, 24).reshape(6, 4)},
                                                                   np.zeros(6))),
                metric=zoo.Metric("mean", compute=lambda outputs, targets: float(outputs["y"].mean())))
BACKENDS = ("onnxruntime", "openvino", "torch")


def rows(n: int) -> dict[str, np.ndarray]:
    return {"x": np.ones((n, 4), np.float32), "scale": np.ones((n, 1), np.float32)}


#: (case, model, inputs, the message; "{model}" is the artifact's name). Every one of these
#: tensors can be sent to the server, which must answer with the same message.
BAD = [
    ("float-ids", IDS, {"ids": np.array([[1.9, 2.9, 3.9]])},
     "input 'ids' has datatype FP64; model {model} takes INT64"),
    ("id-past-int32", IDS, {"ids": np.array([[2**32 + 1, 2, 3]])},
     "model {model}: input 'ids' has value 4294967297 at index [0, 0]; it takes values from 0 to 9"),
    ("id-past-vocabulary", IDS, {"ids": np.array([[1, 2], [3, 10]])},
     "model {model}: input 'ids' has value 10 at index [1, 1]; it takes values from 0 to 9"),
    ("negative-id", IDS, {"ids": np.array([[-1, 2, 3]])},
     "model {model}: input 'ids' has value -1 at index [0, 0]; it takes values from 0 to 9"),
    ("scale-below-range", FEATURES, {**rows(2), "scale": np.full((2, 1), -0.1, np.float32)},  # not -0.10000000149...
     "model {model}: input 'scale' has value -0.1 at index [0, 0]; it takes values from 0 to 10"),
    ("wrong-rank", IDS, {"ids": np.array([1, 2, 3])}, "input 'ids' has shape [3]; model {model} takes [-1, -1]"),
    ("seq-too-long", IDS, {"ids": np.zeros((1, 9), np.int64)},
     "input 'ids': axis 'seq' (dimension 1) is 9; model {model} takes 1 to 8"),
    ("zero-rows", FEATURES, rows(0), "input 'x': axis 'batch' (dimension 0) is 0; model {model} takes 1 to 32"),
    ("33-rows", FEATURES, rows(33), "input 'x': axis 'batch' (dimension 0) is 33; model {model} takes 1 to 32"),
    ("1000-rows", FEATURES, rows(1000), "input 'x': axis 'batch' (dimension 0) is 1000; model {model} takes 1 to 32"),
    ("wrong-fixed-size", FEATURES, {**rows(2), "x": np.ones((2, 5), np.float32)},
     "input 'x' has shape [2, 5]; model {model} takes [-1, 4] (dimension 1 must be 4)"),
    ("axes-disagree", FEATURES, {**rows(2), "scale": np.ones((3, 1), np.float32)},
     "inputs disagree on axis 'batch': 2 and 3 (input 'scale')"),
    ("missing-input", FEATURES, {"x": rows(2)["x"]},
     "model {model} takes inputs ['x', 'scale']; missing ['scale'], unexpected []"),
    ("unexpected-input", FEATURES, {**rows(2), "bias": np.ones((2, 4), np.float32)},
     "model {model} takes inputs ['x', 'scale']; missing [], unexpected ['bias']"),
]
#: what only a Python caller can pass: no wire request carries it
NOT_AN_ARRAY = "not an array; model {model} takes a numpy array or a torch tensor"
BAD_IN_PYTHON = [
    ("none", IDS, {"ids": None}, f"input 'ids' is None, {NOT_AN_ARRAY}"),
    ("text", IDS, {"ids": "1 2 3"}, f"input 'ids' is a str, {NOT_AN_ARRAY}"),
    ("float-tensor", IDS, {"ids": torch.tensor([[1.0, 2.0]])},
     "input 'ids' has datatype FP32; model {model} takes INT64"),
    ("past-int64", IDS, {"ids": np.array([[2**63, 1]], np.uint64)},
     "input 'ids' has value 9223372036854775808 at index [0, 0], which INT64 cannot hold; model {model} takes INT64"),
    ("not-a-dict", FEATURES, [rows(1)["x"], rows(1)["scale"]],
     "model {model} takes a dict of its inputs ['x', 'scale'], not a list"),
]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """`path(model, backend)`: the model exported through the backend (once), skipped where
    the backend cannot run here."""
    for spec in (IDS, FEATURES, HALF, BF16):
        zoo.register(spec)
    repository, paths = tmp_path_factory.mktemp("exports"), {}

    def path(spec: ModelSpec, backend: str):
        if importlib.util.find_spec(backend) is None or importlib.util.find_spec(f"zoo_{backend}") is None:
            pytest.skip(f"{backend} (or its zoo backend plugin) is not installed")
        if (spec.name, backend) not in paths:
            paths[spec.name, backend] = zoo.export(spec.name, backend=backend, random_init=True,
                                                   repository=repository).path
        return paths[spec.name, backend]

    yield path
    for spec in (IDS, FEATURES, HALF, BF16):
        zoo.unregister(spec.name)


def served_error(path, inputs: dict[str, np.ndarray]) -> str:
    """The message `zoo serve` answers these tensors with (400), from its own request path."""
    model, _ = open_model(path, ServeOptions())
    wire = {t.newbyteorder("="): name for name, t in dt.NUMPY_TYPES.items() if t is not None and name != "BF16"}
    request = InferRequest([Tensor(name, wire[a.dtype], a.shape, a) for name, a in inputs.items()])
    with pytest.raises(InputError) as refused:
        asyncio.run(model.infer(request, timeout=10.0))
    return str(refused.value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, spec, inputs, message", BAD, ids=[c[0] for c in BAD])
def test_a_bad_input_is_refused_as_the_server_refuses_it(artifacts, backend, case, spec, inputs, message):
    path = artifacts(spec, backend)
    expected = message.format(model=path.name)
    with pytest.raises(InputError) as refused:
        zoo.load(path)(inputs)
    assert str(refused.value) == expected
    assert served_error(path, inputs) == expected


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, spec, inputs, message", BAD_IN_PYTHON, ids=[c[0] for c in BAD_IN_PYTHON])
def test_what_only_python_can_pass_is_refused_by_name(artifacts, backend, case, spec, inputs, message):
    path = artifacts(spec, backend)
    with pytest.raises(InputError) as refused:
        zoo.load(path)(inputs)
    assert str(refused.value) == message.format(model=path.name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_casts_without_loss_gives_the_exact_types_result(artifacts, backend):
    ids = zoo.load(artifacts(IDS, backend))
    exact = np.array([[1, 2, 3, 4], [5, 6, 7, 9]])
    want = ids({"ids": exact})["out"]
    for same in (exact.astype(np.int32), exact.astype(np.uint8), exact.astype(">i8"), np.asfortranarray(exact),
                 np.repeat(exact, 2, axis=1)[:, ::2], torch.from_numpy(exact), exact.tolist()):
        np.testing.assert_array_equal(ids({"ids": same})["out"], want)

    features = zoo.load(artifacts(FEATURES, backend))
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 4  # exact in float16 too
    scale = np.array([[1.0], [0.5], [2.0]], np.float32)
    want = features({"x": x, "scale": scale})["y"]
    for same in ({"x": x.astype(np.float64), "scale": scale.astype(np.float64)},
                 {"x": x.astype(np.float16), "scale": scale},
                 {"x": np.asfortranarray(x), "scale": scale.astype(">f4")},
                 {"x": torch.from_numpy(x).requires_grad_(), "scale": torch.from_numpy(scale)}):
        np.testing.assert_array_equal(features(same)["y"], want)


def test_a_backend_plugin_gets_the_check_without_doing_anything(artifacts, tmp_path):
    """A third-party backend whose runner casts whatever it is given, as the built-in
    ones did: `zoo.load` checks the inputs for it."""
    TorchBackend = pytest.importorskip("zoo_torch").TorchBackend

    class Trusting(TorchBackend):
        name = "trusting-test"

        def load(self, path, spec, precision, device, threads=None, info=None):
            module = self.load_module(path, device, threads)

            def run(inputs):  # float ids truncated, any id looked up
                return {"out": module(torch.as_tensor(np.asarray(inputs["ids"])).long())[0].detach().numpy()}
            return run

    zoo.register_backend(Trusting())
    try:
        runner = zoo.load(zoo.export(IDS.name, backend="trusting-test", random_init=True, repository=tmp_path).path)
        assert runner({"ids": np.array([[1, 2]])})["out"].shape == (1, 3)
        with pytest.raises(InputError, match="has datatype FP64; model ids.inputs-test.trusting-test.fp32 takes INT64"):
            runner({"ids": np.array([[1.5, 2.0]])})
    finally:
        zoo.unregister("trusting-test")


def test_the_server_checks_a_request_once(artifacts, monkeypatch):
    """The server checks each request itself; its runners are the backend's, unchecked."""
    import zoo.inputs

    calls, check = [], zoo.inputs.check_arrays

    def counted(*args, **kwargs):
        calls.append(args[2])
        return check(*args, **kwargs)

    monkeypatch.setattr(zoo.inputs, "check_arrays", counted)  # what the checked runners call
    monkeypatch.setattr("zoo.serve.model.check_arrays", counted)
    model, runners = open_model(artifacts(FEATURES, "torch"), ServeOptions())
    calls.clear()  # the load's own probes (rows independent, padding) ran the runner on stored rows

    async def serve_one():
        model.start(runners)
        try:
            return await model.infer(InferRequest([Tensor(k, "FP32", v.shape, v) for k, v in rows(2).items()]), 10.0)
        finally:
            await model.stop(10.0)

    outputs, _ = asyncio.run(serve_one())
    assert outputs[0].data.shape == (2, 4) and calls == [model.name]


def test_load_from_inside_the_artifact(artifacts, monkeypatch):
    path = artifacts(IDS, "onnxruntime")
    monkeypatch.chdir(path)
    for here in (".", ""):
        assert Artifact.open(here).name == path.name
        assert zoo.load(here)({"ids": np.array([[1, 2]])})["out"].shape == (1, 3)
    monkeypatch.chdir(path / "1")
    assert Artifact.open("..").name == path.name


def test_a_checked_runner_copies_and_keeps_the_runners_attributes():
    """copy and pickle make the object without __init__ and then look up dunders: the
    passthrough to the runner used to recurse without end."""
    import copy

    from zoo.inputs import CheckedRunner

    class Runner:
        device = "cpu"

        def __call__(self, inputs):
            return inputs

    checked = CheckedRunner(Runner(), zoo.get_model("resnet8.digits"), "m")
    copied = copy.copy(checked)
    assert copied.unchecked is checked.unchecked and copied.device == "cpu"
    with pytest.raises(AttributeError):
        checked.no_such_attribute


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float_its_type_cannot_hold_is_refused_not_made_infinite(artifacts, backend):
    """Found by a tester: 1e5 for a float16 input became infinity on every backend and the
    outputs NaN, with numpy's "overflow encountered in cast" the only sign. A float is held
    to its type's range as an integer is; rounding within it is the runner's, as float64
    to float32 always was, and an infinity or a NaN given goes through as it is."""
    path = artifacts(HALF, backend)
    runner = zoo.load(path)
    for given, shown, at in ((np.full((1, 4), 1e5), "100000.0", [0, 0]),
                             (torch.full((2, 4), -7e4), "-70000.0", [0, 0]),
                             (np.array([[1, 2, 3, 4], [5, 6, 65520, 7]], np.float32), "65520.0", [1, 2])):
        with pytest.raises(InputError) as refused:
            runner({"x": given})
        assert str(refused.value) == (f"input 'x' has value {shown} at index {at}, which FP16 cannot hold (its "
                                      f"largest is 65504; it would be infinity); model {path.name} takes FP16")
    within = np.array([[65519.0, -65519.0, 1e-9, 0.1]])  # 65504, -65504, 0 and 0.0999755859375 in float16
    np.testing.assert_array_equal(runner({"x": within})["y"], runner({"x": within.astype(np.float16)})["y"])
    assert np.isnan(runner({"x": np.array([[np.inf, np.nan, 0.0, 0.0]])})["y"]).all()


@pytest.mark.parametrize("dtype, value, refused", [
    ("float16", np.float32(65519), False), ("float16", np.float32(65520), True),
    ("float16", torch.tensor(1e5, dtype=torch.bfloat16), True), ("float16", np.float64(-np.inf), False),
    ("float16", np.int32(65519), False), ("float16", np.int32(-70000), True), ("float16", torch.tensor(70000), True),
    ("float32", np.float64(3.4e38), False), ("float32", np.float64(-1e39), True),
    ("float32", torch.tensor(1e39, dtype=torch.float64), True),
    # bfloat16 has float32's range but for its last 0.2 %: float32's largest values round past it
    ("bfloat16", np.float32(1e5), False), ("bfloat16", np.float32(3.38e38), False),
    ("bfloat16", np.float32(3.4e38), True), ("bfloat16", torch.tensor(-3.4e38), True)])
def test_a_float_is_held_to_its_types_range_and_rounded_within_it(dtype, value, refused):
    """What `zoo.load`'s runners and `zoo.client` refuse (`check_type`): the values a cast
    would make infinite; precision lost in rounding is the runner's, as it always was."""
    from zoo.inputs import check_type

    array = value.reshape(1, 1).repeat(1, 2) if isinstance(value, torch.Tensor) else np.full((1, 2), value)
    if refused:
        with pytest.raises(InputError, match=rf"at index \[0, 0\], which {dt.v2_name(dtype)} cannot hold"):
            check_type("x", dtype, array, "m")
    else:
        check_type("x", dtype, array, "m")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bfloat16_array_is_taken_as_the_bfloat16_it_is(artifacts, backend):
    """tritonclient's (and onnx's) numpy bfloat16, ml_dtypes', which `zoo serve` takes over
    the wire: `zoo.load` refused it for a BF16 input with "has datatype bfloat16; model ...
    takes BF16", and took float32 instead. It widens to any float input without loss."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 4  # exact in bfloat16
    features = zoo.load(artifacts(FEATURES, backend))
    scale = np.ones((3, 1), np.float32)
    np.testing.assert_array_equal(features({"x": x.astype(ml_dtypes.bfloat16), "scale": scale})["y"],
                                  features({"x": x, "scale": scale})["y"])
    ids = artifacts(IDS, backend)
    with pytest.raises(InputError) as refused:
        zoo.load(ids)({"ids": np.ones((1, 2), ml_dtypes.bfloat16)})
    assert str(refused.value) == f"input 'ids' has datatype BF16; model {ids.name} takes INT64"
    with pytest.raises(InputError, match="has value 99840.0 at index \\[0, 0\\], which FP16 cannot hold"):
        zoo.load(artifacts(HALF, backend))({"x": np.full((1, 4), 1e5, ml_dtypes.bfloat16)})
    if backend == "torch":  # the one backend that exports a bfloat16 input (ONNX Runtime refuses it: numpy has none)
        bf16 = zoo.load(artifacts(BF16, backend))
        np.testing.assert_array_equal(bf16({"x": x.astype(ml_dtypes.bfloat16)})["y"], bf16({"x": x})["y"])


def test_a_backend_plugin_gets_inputs_in_their_declared_types(artifacts, tmp_path):
    """Found by a tester whose backend, written as the README shows, hands its inputs
    straight to its own ONNX Runtime session: the export's test vectors gave it a float16
    input as float32, and the session refused them. Every runner is given the types the
    spec declares (bfloat16 as float32 in numpy, which has none): by the export's parity,
    test vectors and metric, and by `zoo.load`'s runner, which casts what it takes."""
    TorchBackend = pytest.importorskip("zoo_torch").TorchBackend

    class Strict(TorchBackend):
        name = "strict-test"

        def load(self, path, spec, precision, device, threads=None, info=None):
            runner = super().load(path, spec, precision, device, threads, info)
            declared = {t.name: np.dtype("float32" if t.dtype == "bfloat16" else t.dtype) for t in spec.inputs}

            def run(inputs):
                given = {name: value.dtype for name, value in inputs.items()}
                if given != declared:
                    raise TypeError(f"inputs of types {given}; the model declares {declared}")
                return runner(inputs)
            return run

    zoo.register_backend(Strict())
    zoo.register(SCORED)  # the others by `artifacts`
    try:
        for spec, given in ((IDS, np.array([[1, 2]], np.int32)), (HALF, np.ones((1, 4), np.float32)),
                            (BF16, np.ones((1, 4))), (SCORED, np.ones((1, 4)))):
            runner = zoo.load(zoo.export(spec.name, backend="strict-test", random_init=True, repository=tmp_path).path)
            assert next(iter(runner({spec.inputs[0].name: given}).values())).shape[0] == 1
    finally:
        zoo.unregister("strict-test")
        zoo.unregister(SCORED.name)
