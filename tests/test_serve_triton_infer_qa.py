"""NVIDIA Triton's inference QA tests, ported to `zoo serve`.

Source: the GitHub repository triton-inference-server/server, `qa/L0_infer/infer_test.py`
(class InferTest) and the helpers it calls in `qa/common/infer_util.py` (`infer_exact`,
`inferAndCheckResults`) and `qa/common/shm_util.py`. Triton's tests are © NVIDIA
CORPORATION & AFFILIATES under the BSD-3-Clause license; this is our own code. Triton's
tests run "add/sub" models of many datatypes (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 -
INPUT1, or the two swapped) with batch 1 and 8 and without a batch axis ("_nobatch"),
over HTTP with binary and with JSON tensors, over gRPC and over a gRPC stream, and check
every output element exactly. Here the same models are zoo specs defined below and
exported to ONNX (as tests/test_padding.py defines its own), served from their manifests;
inputs are drawn as Triton draws them (half the narrowest type's range, so nothing
overflows), and each answer is compared exactly with numpy's. Each test gives its Triton
name; the names of its cases say the datatypes in Triton's letters (u UINT8, b INT8, i
INT32, l INT64, h FP16, f FP32), and each ends by checking that the server is still live.
Past infer_exact's own draws, the same models are sent what its helpers allow but L0_infer
does not send: non-integer floats as JSON, outputs named in reverse order, gRPC typed
contents, concurrent requests the batcher merges, many requests on one stream, unaligned
and oversized shared-memory regions, and classification into shared memory (refused, as
Triton refuses it).

Not ported, and why:
- the INT16 cases (test_raw_sss, test_raw_ibs, test_raw_ihs, test_class_sss, test_mix_sss):
  zoo has no int16 datatype (spec.DTYPES).
- the BYTES cases (test_raw_ooo, test_raw_oii, test_raw_oio, test_raw_ooi, test_raw_ioo,
  test_raw_iio, test_raw_ioi): Triton's string add/sub runs in its Python backend; an ONNX
  export of a torch module has no string arithmetic.
- the ensemble prefixes (simple_, sequence_, fan_) and test_ensemble_*: ensembles are
  Triton-only; the labels test_ensemble_label_lookup checks are OUTPUT0's labels here.
- test_raw_version_latest_*, test_raw_version_all, test_raw_version_specific_1_3: an
  artifact has one version, 1; version 1 by name (test_raw_version_specific_1) and an
  unknown version are checked here.
- infer_shape_tensor (L0_infer's TensorRT shape tensors), the plan/libtorch/python backends:
  no shape tensors in zoo; one ONNX Runtime model per case stands for every backend.
- CUDA shared memory (TEST_CUDA_SHARED_MEMORY): no region can be registered (docs/serving.md).
"""

from __future__ import annotations

import asyncio
import queue
import uuid
import zlib
from typing import Any, Iterator

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as http_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec

pytest.register_assert_rewrite("serve_support")
from serve_support import ServerProcess  # noqa: E402

pytest_plugins = ["serve_support"]

SIZE, BATCH, CLASSES = 16, 8, 3  # Triton's input_size, batch size and num_classes
LETTERS = {"u": "uint8", "b": "int8", "i": "int32", "l": "int64", "h": "float16", "f": "float32"}
TORCH = {"uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64,
         "float16": torch.float16, "float32": torch.float32}
LABELS = tuple(f"label{k}" for k in range(SIZE))  # Triton's output0_labels.txt
#: Triton's test_raw_* cases and whether their models swap the outputs (swap=True there)
RAW = {"uuu": True, "bbb": True, "iii": True, "lll": False, "hhh": False, "fff": True, "hff": False,
       "bii": False, "ibb": False, "fuu": False, "uff": False, "fuh": False, "iff": False, "fii": False}
CLASS = ("bbb", "iii", "lll", "fff", "iff")  # test_class_*, test_mix_*
PROTOCOLS = ("http-binary", "http-json", "grpc", "grpc-stream")  # infer_util.py's configs


class AddSub(torch.nn.Module):
    """Triton's add/sub model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (swapped
    when `swap`), each cast to its output's type."""

    def __init__(self, out0: str, out1: str, swap: bool) -> None:
        super().__init__()
        self.out0, self.out1, self.swap = TORCH[out0], TORCH[out1], swap

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: N803
        total, difference = INPUT0 + INPUT1, INPUT0 - INPUT1
        first, second = (difference, total) if self.swap else (total, difference)
        return {"OUTPUT0": first.to(self.out0), "OUTPUT1": second.to(self.out1)}


def model_name(case: str, batched: bool = True) -> str:
    return f"addsub.{case}" + ("" if batched else "-nobatch")


def artifact(case: str, batched: bool = True) -> str:
    return f"{model_name(case, batched)}.onnxruntime.fp32"


def addsub_spec(case: str, batched: bool) -> ModelSpec:
    dtype, out0, out1 = (LETTERS[c] for c in case)
    shape = ("batch", SIZE) if batched else (SIZE,)

    def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        a, b = (rng.integers(0, 50, (batch, SIZE) if batched else (SIZE,)) for _ in range(2))
        return {"INPUT0": np.maximum(a, b).astype(dtype), "INPUT1": np.minimum(a, b).astype(dtype)}

    return ModelSpec(
        name=model_name(case, batched), domain="test", task="add-sub",
        inputs=(TensorSpec("INPUT0", dtype, shape), TensorSpec("INPUT1", dtype, shape)),
        outputs=(TensorSpec("OUTPUT0", out0, shape, labels=LABELS), TensorSpec("OUTPUT1", out1, shape)),
        build=lambda: AddSub(out0, out1, RAW.get(case, False)), sample=sample,
        axes={"batch": AxisRange(1, BATCH, BATCH)})


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    """Every add/sub model batched, fff, iii and hhh also without a batch axis; shared memory on."""
    repo = tmp_path_factory.mktemp("infer_qa") / "exports"
    for case in RAW:
        zoo.export(addsub_spec(case, True), "onnxruntime", repository=repo, random_init=True)
    for case in ("fff", "iii", "hhh"):
        zoo.export(addsub_spec(case, False), "onnxruntime", repository=repo, random_init=True)
    proc = ServerProcess(repo, "--shared-memory", "system", log=repo.parent / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def clients(server: ServerProcess) -> Iterator[dict[str, Any]]:
    http = triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)
    grpc = triton_grpc.InferenceServerClient(server.grpc_url)
    yield {"http": http, "grpc": grpc, "grpc_url": server.grpc_url}
    http.close()
    grpc.close()


def assert_live(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200


# ---------------------------------------------------------------- infer_util.py's infer_exact


def range_dtype(dtype: str) -> np.dtype:
    """infer_util.py's _range_repr_dtype: floats drawn from an integer range they hold exactly."""
    return np.dtype({"float32": np.int16, "float16": np.int8}.get(dtype, dtype))


def draw(case: str, shape: tuple[int, ...], raw0: bool = True, raw1: bool = True,
         seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """INPUT0, INPUT1 and the exact OUTPUT0, OUTPUT1, as infer_exact draws them: half the
    narrowest range of the input and outputs (an output asked for as classes counts as FP32),
    and INPUT0 >= INPUT1 where that range starts at 0 (unsigned)."""
    dtype, out0, out1 = (LETTERS[c] for c in case)
    ranges = [np.iinfo(range_dtype(t)) for t in (dtype, out0 if raw0 else "float32", out1 if raw1 else "float32")]
    low, high = max(r.min for r in ranges) // 2, min(r.max for r in ranges) // 2
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(low, high, shape, dtype=np.int64) for _ in range(2))
    if low == 0:
        a, b = np.maximum(a, b), np.minimum(a, b)
    total, difference = a + b, a - b
    first, second = (difference, total) if RAW[case] else (total, difference)
    return a.astype(dtype), b.astype(dtype), first.astype(out0), second.astype(out1)


def classes(expected: np.ndarray, batched: bool, labels: tuple[str, ...] | None) -> np.ndarray:
    """The top CLASSES of each row as Triton's classification extension writes them:
    "value:index[:label]", the value as C++ std::to_string, ties in ascending index order."""
    rows = expected.reshape(len(expected) if batched else 1, -1)
    out = []
    for row in rows:
        order = sorted(range(row.size), key=lambda k: (-float(row[k]), k))[:CLASSES]
        value = (lambda v: "%f" % float(v)) if row.dtype.kind == "f" else (lambda v: str(int(v)))
        out.append([f"{value(row[k])}:{k}" + (f":{labels[k]}" if labels else "") for k in order])
    return np.array(out, dtype=object).reshape((len(rows), CLASSES) if batched else (CLASSES,))


def as_bytes(array: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda x: x.decode() if isinstance(x, bytes) else str(x), otypes=[object])(array)


def infer(clients: dict[str, Any], protocol: str, model: str, arrays: list[np.ndarray],
          outputs: list[tuple[str, int]] | None, version: str = "", request_id: str = "") -> tuple[Any, Any]:
    """One request as inferAndCheckResults sends it over `protocol`: the inputs, and the
    outputs named (name, class_count; 0: the raw tensor). The result and its response."""
    kind = "http" if protocol.startswith("http") else "grpc"
    module = triton_http if kind == "http" else triton_grpc
    inputs = []
    for name, array in zip(("INPUT0", "INPUT1"), arrays):
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        if kind == "http":
            tensor.set_data_from_numpy(array, binary_data=protocol == "http-binary")
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = None
    if outputs is not None:
        if kind == "http":
            requested = [triton_http.InferRequestedOutput(n, binary_data=protocol == "http-binary", class_count=k)
                         for n, k in outputs]
        else:
            requested = [triton_grpc.InferRequestedOutput(n, class_count=k) for n, k in outputs]
    args = dict(model_version=version, outputs=requested, request_id=request_id)
    if protocol != "grpc-stream":
        result = clients[kind].infer(model, inputs, **args)
    else:
        answers: queue.Queue = queue.Queue()
        stream = triton_grpc.InferenceServerClient(clients["grpc_url"])
        stream.start_stream(lambda result, error: answers.put((result, error)))
        try:
            stream.async_stream_infer(model, inputs, **args)
            result, error = answers.get(timeout=60)
        finally:
            stream.stop_stream()
            stream.close()
        if error is not None:
            raise error
    return result, result.get_response()


def field(response: Any, name: str) -> Any:
    return response[name] if isinstance(response, dict) else getattr(response, name)


def infer_exact(clients: dict[str, Any], protocol: str, case: str, batch: int | None,
                outputs: tuple[str, ...] = ("OUTPUT0", "OUTPUT1"), raw: tuple[bool, bool] = (True, True),
                version: str = "") -> None:
    """infer_util.py's infer_exact for one config: `batch` rows (None: the _nobatch model),
    each named output exact, or its top classes exactly as Triton writes them."""
    shape = (batch, SIZE) if batch else (SIZE,)
    model = artifact(case, batched=batch is not None)
    a, b, out0, out1 = draw(case, shape, *raw, seed=zlib.crc32(f"{case}{protocol}{batch}".encode()))
    expected = {"OUTPUT0": out0, "OUTPUT1": out1}
    asked = [(n, 0 if raw[int(n[-1])] else CLASSES) for n in outputs]
    request_id = uuid.uuid4().hex
    result, response = infer(clients, protocol, model, [a, b], asked, version, request_id)
    assert field(response, "model_name") == model
    assert field(response, "id") == request_id
    if version:
        assert str(field(response, "model_version")) == version
    got = [field(o, "name") for o in field(response, "outputs")]
    assert sorted(got) == sorted(outputs), got
    for name, count in asked:
        data = result.as_numpy(name)
        if count:
            want = classes(expected[name], batch is not None, LABELS if name == "OUTPUT0" else None)
            assert data.shape == want.shape and (as_bytes(data) == want).all(), (name, data, want)
        else:
            assert data.dtype == expected[name].dtype and data.shape == shape, (name, data.dtype, data.shape)
            np.testing.assert_array_equal(data, expected[name], err_msg=f"{model} {name} over {protocol}")


def protocols_for(case: str, raw: tuple[bool, bool] = (True, True)) -> list[str]:
    """infer_util.py's configs: JSON tensors only where both outputs are alike and no FP16."""
    return [p for p in PROTOCOLS if p != "http-json" or (raw[0] == raw[1] and "h" not in case)]


# ---------------------------------------------------------------- test_raw_*, test_class_*, test_mix_*


@pytest.mark.parametrize("case,protocol", [(c, p) for c in RAW for p in protocols_for(c)])
def test_raw(server, clients, case, protocol):
    # Triton: test_raw_<case> (_full_exact with both outputs raw): batch 1 and 8.
    for batch in (1, BATCH):
        infer_exact(clients, protocol, case, batch)
    assert_live(server)


@pytest.mark.parametrize("case,protocol", [(c, p) for c in ("fff", "iii", "hhh") for p in protocols_for(c)])
def test_raw_nobatch(server, clients, case, protocol):
    # Triton: test_raw_<case> on the <backend>_nobatch_<types> models: shape [16], no batch axis.
    infer_exact(clients, protocol, case, None)
    assert_live(server)


@pytest.mark.parametrize("case,protocol", [(c, p) for c in CLASS for p in protocols_for(c, (False, False))])
def test_class(server, clients, case, protocol):
    # Triton: test_class_<case>: both outputs as their top 3 classes; OUTPUT0 has labels.
    for batch in (1, BATCH):
        infer_exact(clients, protocol, case, batch, raw=(False, False))
    assert_live(server)


@pytest.mark.parametrize("case,raw,protocol", [(c, r, p) for c, r in zip(CLASS, [(True, False), (True, False),
                                                                                  (False, True), (True, False),
                                                                                  (False, True)])
                                                for p in protocols_for(c, r)])
def test_mix(server, clients, case, raw, protocol):
    # Triton: test_mix_<case>: one output raw, the other as its top 3 classes.
    for batch in (1, BATCH):
        infer_exact(clients, protocol, case, batch, raw=raw)
    assert_live(server)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_class_nobatch(server, clients, protocol):
    # Triton: test_class_fff on onnx_nobatch_float32_float32_float32: the whole tensor is one
    # row, so the classes come back shape [3].
    infer_exact(clients, protocol, "fff", None, raw=(False, False))
    assert_live(server)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("outputs", [("OUTPUT0",), ("OUTPUT1",)], ids=["OUTPUT0", "OUTPUT1"])
def test_requested_output_subset(server, clients, protocol, outputs):
    # Triton: infer_exact(outputs=...), as the ensemble tests call it: only the outputs named
    # come back, each exact.
    infer_exact(clients, protocol, "fff", BATCH, outputs=outputs)
    infer_exact(clients, protocol, "iii", 1, outputs=outputs, raw=(False, False))
    assert_live(server)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_outputs_named_returns_every_output(server, clients, protocol):
    # Triton: infer_exact with outputs=None in the clients (every output, raw; binary over HTTP
    # where the request-wide binary_data_output is set, which tritonclient sets when the
    # inputs are binary).
    case, batch = "lll", 2
    a, b, out0, out1 = draw(case, (batch, SIZE))
    result, response = infer(clients, protocol, artifact(case), [a, b], None)
    assert sorted(field(o, "name") for o in field(response, "outputs")) == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), out0)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), out1)
    assert_live(server)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_raw_version_specific_1(server, clients, protocol):
    # Triton: test_raw_version_specific_1: version 1 named, answered as version "1".
    infer_exact(clients, protocol, "bbb", 1, version="1")
    assert_live(server)


@pytest.mark.parametrize("protocol", ("http-binary", "grpc"))
def test_raw_version_unknown(server, clients, protocol):
    # Triton: test_raw_version_latest_1 (version 2 of a model that has 3 only): "Request for
    # unknown model" there, NOT_FOUND; ours names the versions there are.
    with pytest.raises(InferenceServerException) as info:
        infer_exact(clients, protocol, "bbb", 1, version="2")
    assert f"model {artifact('bbb')} has no version '2' (versions: 1)" in info.value.message()
    assert_live(server)


@pytest.mark.parametrize("protocol", ("http-binary", "grpc"))
def test_class_of_fp16_is_refused(server, clients, protocol):
    # Triton: L0_infer has no test_class_hhh: its classification refuses FP16 ("class result
    # not available for output due to unsupported type"), INVALID_ARGUMENT.
    with pytest.raises(InferenceServerException) as info:
        infer_exact(clients, protocol, "hhh", 1, raw=(False, True))
    assert "FP16" in info.value.message()
    assert_live(server)


def test_metadata_datatypes(server, clients):
    # Triton: inferAndCheckResults reads each model's metadata first (its platform); here its
    # inputs' and outputs' datatypes and shapes, which tritonclient takes from it.
    names = {"u": "UINT8", "b": "INT8", "i": "INT32", "l": "INT64", "h": "FP16", "f": "FP32"}
    for case in RAW:
        meta = clients["http"].get_model_metadata(artifact(case))
        assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"] + meta["outputs"]] == [
            ("INPUT0", names[case[0]], [-1, SIZE]), ("INPUT1", names[case[0]], [-1, SIZE]),
            ("OUTPUT0", names[case[1]], [-1, SIZE]), ("OUTPUT1", names[case[2]], [-1, SIZE])]
    meta = clients["grpc"].get_model_metadata(artifact("fff", batched=False))
    assert [list(t.shape) for t in meta.inputs] == [[SIZE], [SIZE]]


# ---------------------------------------------------------------- asyncio clients


def test_raw_fff_and_class_over_aio_clients(server):
    # Triton: infer_exact's configs through tritonclient.http.aio and tritonclient.grpc.aio
    # (L0_infer runs the sync clients; the aio ones build the same requests).
    a, b, out0, out1 = draw("fff", (BATCH, SIZE), raw1=False)

    async def run() -> None:
        for module, client in ((http_aio, http_aio.InferenceServerClient(server.url.removeprefix("http://"))),
                               (grpc_aio, grpc_aio.InferenceServerClient(server.grpc_url))):
            try:
                inputs = []
                for name, array in (("INPUT0", a), ("INPUT1", b)):
                    inputs.append(module.InferInput(name, [BATCH, SIZE], "FP32"))
                    inputs[-1].set_data_from_numpy(array)
                outputs = [module.InferRequestedOutput("OUTPUT0"),
                           module.InferRequestedOutput("OUTPUT1", class_count=CLASSES)]
                result = await client.infer(artifact("fff"), inputs, outputs=outputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), out0)
                assert (as_bytes(result.as_numpy("OUTPUT1")) == classes(out1, True, None)).all()
            finally:
                await client.close()

    asyncio.run(run())
    assert_live(server)


# ---------------------------------------------------------------- TEST_SYSTEM_SHARED_MEMORY=1


class Regions:
    """shm_util.py's create_set_shm_regions / register_add_shm_regions /
    unregister_cleanup_shm_regions: POSIX objects the client creates, registered with the
    server, destroyed after."""

    def __init__(self, client: Any) -> None:
        self.client, self.handles = client, {}

    def create(self, byte_size: int, *arrays: np.ndarray, offset: int = 0) -> str:
        name = f"zoo_infer_qa_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, f"/{name}", byte_size, create_only=True)
        self.handles[name] = handle
        if arrays:
            shm.set_shared_memory_region(handle, list(arrays), offset=offset)
        self.client.register_system_shared_memory(name, f"/{name}", byte_size)
        return name

    def read(self, name: str, datatype: str, shape: list[int], offset: int = 0) -> np.ndarray:
        return shm.get_contents_as_numpy(self.handles[name], datatype, shape, offset)

    def close(self) -> None:
        for name, handle in self.handles.items():
            self.client.unregister_system_shared_memory(name)
            shm.destroy_shared_memory_region(handle)


def shm_infer(clients: dict[str, Any], protocol: str, case: str, batch: int | None, *,
              one_region: bool = False, room: int = 1) -> None:
    """infer_exact with use_system_shared_memory: both inputs and both outputs in registered
    regions (one region each, or all four at offsets of one region), none on the wire; the
    outputs read back from the regions, exact. `room`: output regions that many times the
    output's size (Triton needs them "at least" as large)."""
    kind = "http" if protocol.startswith("http") else "grpc"
    module = triton_http if kind == "http" else triton_grpc
    shape = (batch, SIZE) if batch else (SIZE,)
    a, b, out0, out1 = draw(case, shape, seed=7)
    regions = Regions(clients[kind])
    try:
        if one_region:  # from an odd offset on, each tensor after the one before: unaligned
            offsets = np.cumsum([3, a.nbytes, b.nbytes, out0.nbytes]).tolist()
            name = regions.create(int(offsets[-1] + out1.nbytes), a, b, offset=3)
            places = [(name, o) for o in offsets]
        else:
            places = [(regions.create(a.nbytes, a), 0), (regions.create(b.nbytes, b), 0),
                      (regions.create(out0.nbytes * room), 0), (regions.create(out1.nbytes * room), 0)]
        inputs, outputs = [], []
        for (region, offset), (name, array) in zip(places[:2], (("INPUT0", a), ("INPUT1", b))):
            inputs.append(module.InferInput(name, list(shape), np_to_triton_dtype(array.dtype)))
            inputs[-1].set_shared_memory(region, array.nbytes, offset)
        for (region, offset), (name, array) in zip(places[2:], (("OUTPUT0", out0), ("OUTPUT1", out1))):
            outputs.append(triton_http.InferRequestedOutput(name, binary_data=protocol == "http-binary")
                           if kind == "http" else triton_grpc.InferRequestedOutput(name))
            outputs[-1].set_shared_memory(region, array.nbytes * (1 if one_region else room), offset)
        result = clients[kind].infer(artifact(case, batched=batch is not None), inputs, outputs=outputs)
        for (region, offset), (name, want) in zip(places[2:], (("OUTPUT0", out0), ("OUTPUT1", out1))):
            meta = result.get_output(name)
            datatype, got_shape = field(meta, "datatype"), list(field(meta, "shape"))
            assert (datatype, got_shape) == (np_to_triton_dtype(want.dtype), list(shape))
            np.testing.assert_array_equal(regions.read(region, want.dtype, got_shape, offset), want,
                                          err_msg=f"{case} {name} in shared memory over {protocol}")
        if kind == "http":  # nothing but the JSON header: no output travelled on the wire
            assert all("data" not in o for o in result.get_response()["outputs"])
        else:  # Triton adds an empty raw_output_contents per output (grpc/infer_handler.cc)
            assert list(result.get_response().raw_output_contents) == [b"", b""]
    finally:
        regions.close()


SHM_PROTOCOLS = ("http-binary", "http-json", "grpc")


@pytest.mark.parametrize("protocol", SHM_PROTOCOLS)
@pytest.mark.parametrize("case", ["fff", "iii", "lll", "uuu", "hhh", "bii", "fuh"])
def test_raw_in_system_shared_memory(server, clients, case, protocol):
    # Triton: test_raw_<case> with TEST_SYSTEM_SHARED_MEMORY=1 (L0_infer's test.sh runs the
    # whole file so): batch 1 and 8, inputs and outputs in regions of their own.
    for batch in (1, BATCH):
        shm_infer(clients, protocol, case, batch)
    assert_live(server)


@pytest.mark.parametrize("protocol", SHM_PROTOCOLS)
def test_raw_nobatch_in_system_shared_memory(server, clients, protocol):
    # Triton: test_raw_fff on the _nobatch model with TEST_SYSTEM_SHARED_MEMORY=1.
    shm_infer(clients, protocol, "fff", None)
    assert_live(server)


@pytest.mark.parametrize("protocol", SHM_PROTOCOLS)
def test_raw_in_one_region_at_offsets(server, clients, protocol):
    # Triton: shm_util.py with precreated regions: every tensor in one region, at its offset
    # (odd ones here: Triton copies bytes, so no alignment is needed).
    for case in ("fff", "lll"):
        shm_infer(clients, protocol, case, BATCH, one_region=True)
    assert_live(server)


@pytest.mark.parametrize("protocol", SHM_PROTOCOLS)
def test_raw_output_regions_larger_than_the_outputs(server, clients, protocol):
    # Triton: grpc/infer_handler.cc and http_server.cc take an output region "at least" as
    # large as the output (perf_analyzer sizes them for the largest batch): batch 1 in
    # regions of batch 8's size.
    shm_infer(clients, protocol, "iii", 1, room=BATCH)
    assert_live(server)


@pytest.mark.parametrize("protocol", ("http", "grpc"))
def test_class_in_shared_memory_is_refused(server, clients, protocol):
    # Triton: infer_test.py leaves test_class_* and test_mix_* out with shared memory ("shared
    # memory does not support class output"): the server answers INVALID_ARGUMENT "Output
    # can't set both 'shared_memory_region' and 'classification'" (http_server.cc
    # ValidateOutputParameter; grpc/infer_handler.h). tritonclient refuses it client-side,
    # so the request is built by hand.
    a, b, _, _ = draw("fff", (1, SIZE))
    regions = Regions(clients[protocol])
    try:
        region = regions.create(1024)
        if protocol == "http":
            doc = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, SIZE], "data": x.ravel().tolist()}
                              for n, x in (("INPUT0", a), ("INPUT1", b))],
                   "outputs": [{"name": "OUTPUT0", "parameters": {"classification": CLASSES,
                                                                  "shared_memory_region": region,
                                                                  "shared_memory_byte_size": 1024}}]}
            response = httpx.post(f"{server.url}/v2/models/{artifact('fff')}/infer", json=doc, timeout=60)
            assert response.status_code == 400, response.text
            message = response.json()["error"]
        else:
            request = service_pb2.ModelInferRequest(model_name=artifact("fff"))
            for name, x in (("INPUT0", a), ("INPUT1", b)):
                request.inputs.add(name=name, datatype="FP32", shape=[1, SIZE]).contents.fp32_contents.extend(x.ravel())
            output = request.outputs.add(name="OUTPUT0")
            output.parameters["classification"].int64_param = CLASSES
            output.parameters["shared_memory_region"].string_param = region
            output.parameters["shared_memory_byte_size"].int64_param = 1024
            with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as info:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
            message = info.value.details()
        assert "shared_memory_region" in message and "classification" in message, message
    finally:
        regions.close()
    assert_live(server)


# ---------------------------------------------------------------- beyond infer_exact's draws


def test_raw_fff_json_of_non_integer_values(server, clients):
    # Triton: test_raw_fff over JSON tensors, with values that are not integers: a float32
    # written as JSON and read back must be the same float32, both ways.
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((BATCH, SIZE)).astype(np.float32) * 1000 for _ in range(2))
    result, _ = infer(clients, "http-json", artifact("fff"), [a, b], [("OUTPUT0", 0), ("OUTPUT1", 0)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a - b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a + b)
    assert_live(server)


def test_raw_hhh_as_json(server):
    # Triton refuses FP16 in JSON both ways ("receiving FP16 data via JSON is not supported"),
    # which is why infer_exact leaves http-json out for FP16; ours takes and writes it, so it
    # must be exact (docs/serving.md, "Differences from Triton").
    a, b, out0, out1 = draw("hhh", (2, SIZE))
    doc = {"inputs": [{"name": n, "datatype": "FP16", "shape": [2, SIZE], "data": x.ravel().tolist()}
                      for n, x in (("INPUT0", a), ("INPUT1", b))]}
    response = httpx.post(f"{server.url}/v2/models/{artifact('hhh')}/infer", json=doc, timeout=60)
    assert response.status_code == 200, response.text
    got = {o["name"]: np.array(o["data"], np.float16).reshape(o["shape"]) for o in response.json()["outputs"]}
    np.testing.assert_array_equal(got["OUTPUT0"], out0)
    np.testing.assert_array_equal(got["OUTPUT1"], out1)
    assert_live(server)


def test_a_json_integer_outside_its_datatype_is_refused(server):
    # Triton truncates INT8 200 read from JSON (http_server.cc, a FIXME); ours answers 400
    # naming the input and the range (docs/serving.md, "Differences from Triton").
    a, b, _, _ = draw("bbb", (1, SIZE))
    data = a.ravel().tolist()
    data[3] = 200
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1, SIZE], "data": data},
                      {"name": "INPUT1", "datatype": "INT8", "shape": [1, SIZE], "data": b.ravel().tolist()}]}
    response = httpx.post(f"{server.url}/v2/models/{artifact('bbb')}/infer", json=doc, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "input 'INPUT0': a value is outside the range of INT8 [-128, 127]"
    assert_live(server)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_outputs_named_in_reverse_order(server, clients, protocol):
    # Triton: infer_exact names OUTPUT0 then OUTPUT1; a client may name them the other way,
    # and over HTTP one binary and one JSON: each output still gets its own values.
    a, b, out0, out1 = draw("iii", (3, SIZE))
    result, response = infer(clients, protocol, artifact("iii"), [a, b], [("OUTPUT1", 0), ("OUTPUT0", 0)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), out0)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), out1)
    if protocol.startswith("http"):
        inputs = []
        for name, x in (("INPUT0", a), ("INPUT1", b)):
            inputs.append(triton_http.InferInput(name, [3, SIZE], "INT32"))
            inputs[-1].set_data_from_numpy(x, binary_data=name == "INPUT1")
        outputs = [triton_http.InferRequestedOutput("OUTPUT1", binary_data=protocol == "http-binary"),
                   triton_http.InferRequestedOutput("OUTPUT0", binary_data=protocol != "http-binary")]
        result = clients["http"].infer(artifact("iii"), inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), out0)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), out1)
    assert_live(server)


@pytest.mark.parametrize("case,field_name", [("bbb", "int_contents"), ("uuu", "uint_contents"),
                                             ("iii", "int_contents"), ("lll", "int64_contents"),
                                             ("fff", "fp32_contents")])
def test_raw_over_grpc_typed_contents(server, case, field_name):
    # Triton: test_raw_<case> over gRPC with the inputs in InferTensorContents (the typed
    # fields Triton reads where raw_input_contents is empty) rather than raw bytes.
    a, b, out0, out1 = draw(case, (2, SIZE))
    request = service_pb2.ModelInferRequest(model_name=artifact(case), id="typed")
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        tensor = request.inputs.add(name=name, datatype=np_to_triton_dtype(x.dtype), shape=[2, SIZE])
        getattr(tensor.contents, field_name).extend(x.ravel().tolist())
    with grpc.insecure_channel(server.grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    for output, raw, want in zip(response.outputs, response.raw_output_contents, (out0, out1)):
        assert (output.datatype, list(output.shape)) == (np_to_triton_dtype(want.dtype), [2, SIZE])
        np.testing.assert_array_equal(np.frombuffer(raw, want.dtype).reshape(2, SIZE), want)
    assert_live(server)


def test_concurrent_requests_batched_together(server):
    # Triton: L0_infer sends one request at a time; its dynamic batcher merges concurrent ones
    # (qa/L0_batcher). 32 requests of batch 1 to 3 over four models at once, each exact, each
    # with its own id.
    cases = ("fff", "iii", "lll", "uuu")
    draws = [(cases[k % 4], draw(cases[k % 4], (1 + k % 3, SIZE), seed=k)) for k in range(32)]

    async def run() -> list[Any]:
        client = http_aio.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            async def one(k: int, case: str, a: np.ndarray, b: np.ndarray) -> Any:
                inputs = []
                for name, x in (("INPUT0", a), ("INPUT1", b)):
                    inputs.append(http_aio.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype)))
                    inputs[-1].set_data_from_numpy(x)
                return await client.infer(artifact(case), inputs, request_id=str(k))
            return await asyncio.gather(*(one(k, case, a, b) for k, (case, (a, b, _, _)) in enumerate(draws)))
        finally:
            await client.close()

    for k, (result, (case, (_, _, out0, out1))) in enumerate(zip(asyncio.run(run()), draws)):
        assert result.get_response()["id"] == str(k)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), out0, err_msg=f"request {k} ({case})")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), out1, err_msg=f"request {k} ({case})")
    assert_live(server)


def test_many_requests_on_one_stream(server):
    # Triton: infer_exact's streaming config sends one request per stream; a stream may carry
    # many, each answered with its own id and values (in any order).
    answers: queue.Queue = queue.Queue()
    want = {}
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        for k in range(12):
            a, b, out0, out1 = draw("lll", (1 + k % BATCH, SIZE), seed=k)
            inputs = []
            for name, x in (("INPUT0", a), ("INPUT1", b)):
                inputs.append(triton_grpc.InferInput(name, list(x.shape), "INT64"))
                inputs[-1].set_data_from_numpy(x)
            client.async_stream_infer(artifact("lll"), inputs, request_id=f"r{k}")
            want[f"r{k}"] = (out0, out1)
        for _ in range(12):
            result, error = answers.get(timeout=60)
            assert error is None, error
            out0, out1 = want.pop(result.get_response().id)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), out0)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), out1)
    finally:
        client.stop_stream()
        client.close()
    assert not want
    assert_live(server)
