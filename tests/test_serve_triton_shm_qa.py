"""NVIDIA Triton's system shared memory QA tests, ported to `zoo serve`.

Source: the GitHub repository triton-inference-server/server, `qa/L0_shared_memory/shared_memory_test.py`
(classes SharedMemoryTest and TestSharedMemoryUnregister, each run there over HTTP and gRPC),
with the request it sends from `qa/common/infer_util.py` (`shm_basic_infer`) and the error texts
from `src/shared_memory_manager.cc`, `src/http_server.cc` and `src/grpc/infer_handler.cc`.
Triton's tests are © NVIDIA CORPORATION & AFFILIATES under the BSD-3-Clause license; this is
our own code. Triton's model there is `simple` (INPUT0 + INPUT1, INT32 [1, 16], 64 bytes
each); ours is the test plugin's `scaled.test` (y = x * scale; x FP32 [4, 4], 64 bytes, and
scale FP32 [1]), and the `faulty` backend's sentinel input that makes a request take 1.5 s
where Triton's tests wait for a slow model. Every test runs through Triton's own client
library (`tritonclient.http`, `tritonclient.grpc`, `tritonclient.utils.shared_memory`) on
both front ends, names its Triton test in a comment, asserts Triton's status where we
should agree (our text: an error never echoes a region's name or key, docs/serving.md
"System shared memory", where Triton's names both), and then checks that the server is
still live. A test marked xfail is what Triton does and we do not yet: it passes once fixed.

Not ported, and why:
- test_invalid_create_shm, test_python_client_leak: exercise the client library alone, not a server.
- test_register_reserved_names: the reserved key prefix belongs to Triton's Python backend
  (its own regions); we have no such backend, and such a key is refused here only because no
  object has it.
- test_large_shm_register_offset's loop over backends: one backend here (onnxruntime); the
  offset itself is ported.
- test_unregister_shm_during_inference_multiple_req_*: the single-request tests below show
  the same defect; the second request adds nothing until it is fixed.
- CUDA shared memory (qa/L0_cuda_shared_memory): no region can be registered, as in Triton
  built without GPUs (test_serve_triton_grpc_qa.py, test_serve_triton_http.py).
"""

from __future__ import annotations

import os
import queue
import time
import uuid
from typing import Any, Callable, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, SCALED, ServerProcess, export, plugin_registered  # noqa: E402

pytest_plugins = ["serve_support"]
pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="system shared memory needs Linux's /dev/shm")

FAULTY = f"{DIGITS}.faulty.fp32"
SLOW, SLOW_SECONDS = 4321.0, 1.5  # serve_plugin.py: a first element of SLOW makes the faulty runner sleep
PAGE = os.sysconf("SC_PAGE_SIZE")
SIZE = 64  # Triton's DEFAULT_SHM_BYTE_SIZE: x and y are 64 bytes each, as INPUT0 and OUTPUT0 are
X = np.arange(16, dtype=np.float32).reshape(4, 4)
SCALE = np.array([2.0], np.float32)
PROTOCOLS = ("http", "grpc")


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two servers on a small repository (scaled.test and the faulty digits model), started
    together: system shared memory on (Triton's `--allow-client-shm=true`), and off (its
    default since 2.59)."""
    repo = tmp_path_factory.mktemp("shm_qa") / "exports"
    with plugin_registered():
        export(DIGITS, "faulty", repo)
        export("scaled.test", "onnxruntime", repo)
    on = ServerProcess(repo, "--shared-memory", "system", "--max-queue-delay-ms", "0", log=repo.parent / "on.log")
    off = ServerProcess(repo, "--max-queue-delay-ms", "0", log=repo.parent / "off.log")
    try:
        yield on.wait_ready(), off.wait_ready()
    finally:
        on.kill()
        off.kill()


@pytest.fixture(scope="module")
def server(servers) -> ServerProcess:
    return servers[0]


def make_client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60, concurrency=2)
    return triton_grpc.InferenceServerClient(server.grpc_url)


@pytest.fixture(params=PROTOCOLS)
def protocol(request) -> str:
    return request.param


@pytest.fixture
def client(server, protocol) -> Iterator[Any]:
    c = make_client(server, protocol)
    c.unregister_system_shared_memory()
    yield c
    httpx.post(f"{server.url}/v2/systemsharedmemory/unregister", timeout=10)  # whatever the test left registered
    c.close()


@pytest.fixture
def region() -> Iterator[Callable[[int], tuple[str, Any]]]:
    """Create shared memory objects (as Triton's tests do, with the client library) under
    unique keys, destroyed after the test: (key, handle)."""
    handles = []

    def make(byte_size: int) -> tuple[str, Any]:
        key = f"/zoo_qa_{uuid.uuid4().hex}"
        handles.append(shm.create_shared_memory_region(key[1:], key, byte_size, create_only=True))
        return key, handles[-1]

    yield make
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


def api(protocol: str) -> Any:
    return triton_http if protocol == "http" else triton_grpc


def names(c: Any) -> list[str]:
    """The registered regions' names, from either client's status answer."""
    status = c.get_system_shared_memory_status()
    if isinstance(c, triton_http.InferenceServerClient):
        return sorted(r["name"] for r in status)
    return sorted(status.regions)


def refused(call: Callable[[], Any], protocol: str, http: int, grpc: str) -> str:
    """The message of the error `call` raises, after checking its status for the protocol."""
    with pytest.raises(InferenceServerException) as info:
        call()
    want = str(http) if protocol == "http" else f"StatusCode.{grpc}"
    assert str(info.value.status()) == want, (info.value.status(), info.value.message())
    return info.value.message()


def assert_live(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
    assert make_client(server, "grpc").is_server_live()


def configure(c: Any, region, create: int = SIZE, size: int = SIZE, offset: int = 0) -> dict[str, Any]:
    """Triton's `_configure_server`: regions x, scale and y, each `size` bytes at `offset` of
    an object of `create` bytes, registered, with x and scale written. The handles by name."""
    handles = {}
    for name in ("x", "scale", "y"):
        key, handles[name] = region(create)
        c.register_system_shared_memory(name, key, size if name != "scale" else 4, offset=offset)
    shm.set_shared_memory_region(handles["x"], [X], offset=offset)
    shm.set_shared_memory_region(handles["scale"], [SCALE], offset=offset)
    return handles


def basic_infer(c: Any, protocol: str, *, x_size: int = SIZE, raw_scale: bool = False, out_offset: int = 0,
                out_size: int = SIZE, x_shape: tuple[int, ...] = (4, 4)) -> Any:
    """Triton's `shm_basic_infer`: inputs from the regions x and scale (or scale sent in the
    request), output y into its region; the result."""
    m = api(protocol)
    x = m.InferInput("x", list(x_shape), "FP32")
    x.set_shared_memory("x", x_size)
    scale = m.InferInput("scale", [1], "FP32")
    if raw_scale:
        scale.set_data_from_numpy(SCALE)
    else:
        scale.set_shared_memory("scale", 4)
    y = m.InferRequestedOutput("y", binary_data=False) if protocol == "http" else m.InferRequestedOutput("y")
    y.set_shared_memory("y", out_size, offset=out_offset)
    return c.infer(SCALED, [x, scale], outputs=[y])


def output_of(result: Any, handle: Any, offset: int = 0) -> np.ndarray:
    output = result.get_output("y")
    shape = output["shape"] if isinstance(output, dict) else list(output.shape)
    datatype = output["datatype"] if isinstance(output, dict) else output.datatype
    assert datatype == "FP32"
    return shm.get_contents_as_numpy(handle, np.float32, shape, offset=offset)


# ---------------------------------------------------------------- registration (SharedMemoryTest)


def test_valid_create_set_register(server, client, region):
    # Triton: test_valid_create_set_register.
    key, handle = region(8)
    shm.set_shared_memory_region(handle, [np.array([1, 2], dtype=np.float32)])
    client.register_system_shared_memory("dummy_data", key, 8)
    assert names(client) == ["dummy_data"]
    status = client.get_system_shared_memory_status("dummy_data")
    if isinstance(client, triton_http.InferenceServerClient):  # Triton's fields: name, key, offset, byte_size
        assert status == [{"name": "dummy_data", "key": key, "offset": 0, "byte_size": 8}]
    else:
        entry = status.regions["dummy_data"]
        assert (entry.name, entry.key, entry.offset, entry.byte_size) == ("dummy_data", key, 0, 8)
    assert_live(server)


def test_unregister_before_register(server, client, region):
    # Triton: test_unregister_before_register. An unknown name is no error.
    region(8)
    client.unregister_system_shared_memory("dummy_data")
    assert names(client) == []
    assert_live(server)


def test_unregister_after_register(server, client, region):
    # Triton: test_unregister_after_register.
    key, _ = region(8)
    client.register_system_shared_memory("dummy_data", key, 8)
    client.unregister_system_shared_memory("dummy_data")
    assert names(client) == []
    assert_live(server)


def test_reregister_after_register(server, client, protocol, region):
    # Triton: test_reregister_after_register ("shared memory region 'dummy_data' already in
    # manager", 400 over HTTP, ALREADY_EXISTS over gRPC). Ours does not echo the name.
    key, _ = region(8)
    client.register_system_shared_memory("dummy_data", key, 8)
    message = refused(lambda: client.register_system_shared_memory("dummy_data", key, 8), protocol, 400,
                      "ALREADY_EXISTS")
    assert "already registered" in message and "dummy_data" not in message and key not in message
    assert names(client) == ["dummy_data"]
    assert_live(server)


def test_reregister_after_register_grpc_code(server, region):
    # Triton: test_reregister_after_register over gRPC, the status code.
    c = make_client(server, "grpc")
    key, _ = region(8)
    c.register_system_shared_memory("dummy_data", key, 8)
    try:
        refused(lambda: c.register_system_shared_memory("dummy_data", key, 8), "grpc", 400, "ALREADY_EXISTS")
    finally:
        c.unregister_system_shared_memory()


def test_unregisterall(server, client, region):
    # Triton: test_unregisterall (four regions there, three here).
    configure(client, region)
    assert names(client) == ["scale", "x", "y"]
    client.unregister_system_shared_memory()
    assert names(client) == []
    assert_live(server)


@pytest.mark.parametrize("create, size, offset", [(SIZE, SIZE + 1, 0), (SIZE, SIZE, 1), (SIZE, 1, SIZE),
                                                  (SIZE, 0, SIZE + 1)])
def test_register_out_of_bound(server, client, protocol, region, create, size, offset):
    # Triton: test_register_out_of_bound. Triton: 400 "failed to register shared memory
    # region ...: invalid args"; ours says the object's size or that byte_size must be >= 1.
    key, _ = region(create)
    message = refused(lambda: client.register_system_shared_memory("r", key, size, offset=offset), protocol, 400,
                      "INVALID_ARGUMENT")
    if size:
        assert message == (f"the shared memory object holds {create} bytes, fewer than the registered offset + "
                           f"byte_size ({offset + size} bytes)")
    else:
        assert message == "byte_size must be at least 1, not 0"
    assert names(client) == []
    assert_live(server)


@pytest.mark.parametrize("key", ["/", "///"])
def test_register_invalid_shm_key(server, client, protocol, key):
    # Triton: test_register_invalid_shm_key ("cannot register shared memory region
    # 'my_test_shm_name' - invalid shm key '/'", 400). Ours names neither.
    message = refused(lambda: client.register_system_shared_memory("my_test_shm_name", key, 10000), protocol, 400,
                      "INVALID_ARGUMENT")
    assert "must be the name of one object in /dev/shm" in message and "my_test_shm_name" not in message
    assert names(client) == []
    assert_live(server)


def test_client_shm_disabled(servers, protocol, region):
    # Triton: test_client_shm_disabled_by_default ("Client shared memory is disabled. Start
    # the server with '--allow-client-shm=true' to enable.", UNSUPPORTED: HTTP 501, gRPC
    # UNIMPLEMENTED). Ours: 403 over HTTP (docs/serving.md, status codes), UNIMPLEMENTED
    # over gRPC, naming --shared-memory system. Status while off: see the test below.
    off = servers[1]
    c = make_client(off, protocol)
    key, _ = region(8)
    for call in (lambda: c.register_system_shared_memory("dummy_data", key, 8),
                 lambda: c.unregister_system_shared_memory("dummy_data"),
                 lambda: c.unregister_system_shared_memory()):
        message = refused(call, protocol, 403, "UNIMPLEMENTED")
        assert message == "system shared memory is off; start the server with --shared-memory system to use it"
    assert "system_shared_memory" not in httpx.get(f"{off.url}/v2", timeout=10).json()["extensions"]
    assert_live(off)


def test_client_shm_disabled_status_is_empty(servers, protocol):
    # Triton: test_client_shm_disabled_by_default: "querying status remains allowed (empty)".
    c = make_client(servers[1], protocol)
    assert names(c) == []


def test_status_of_an_unknown_region(server, client, protocol):
    # Triton: TestSharedMemoryUnregister._test_shm_not_found (status of a region that is not
    # registered raises). Triton's text: "Unable to find system shared memory region: 'x'".
    message = refused(lambda: client.get_system_shared_memory_status("x"), protocol, 404, "NOT_FOUND")
    assert message.startswith("unknown shared memory region")
    assert_live(server)


def test_status_of_an_unknown_region_is_not_found(server, protocol):
    # Triton: GetStatus / GetMemoryInfo in src/shared_memory_manager.cc, TRITONSERVER_ERROR_NOT_FOUND.
    c = make_client(server, protocol)
    refused(lambda: c.get_system_shared_memory_status("x"), protocol, 404, "NOT_FOUND")


# ---------------------------------------------------------------- inference (SharedMemoryTest)


def test_unregister_after_inference(server, client, protocol, region):
    # Triton: test_unregister_after_inference.
    handles = configure(client, region)
    result = basic_infer(client, protocol)
    np.testing.assert_array_equal(output_of(result, handles["y"]), X * SCALE)
    client.unregister_system_shared_memory("y")
    assert names(client) == ["scale", "x"]
    assert_live(server)


def test_register_after_inference(server, client, protocol, region):
    # Triton: test_register_after_inference.
    handles = configure(client, region)
    np.testing.assert_array_equal(output_of(basic_infer(client, protocol), handles["y"]), X * SCALE)
    key, _ = region(SIZE)
    client.register_system_shared_memory("input2_data", key, SIZE)
    assert names(client) == ["input2_data", "scale", "x", "y"]
    assert_live(server)


def test_output_region_is_answered_as_triton_answers_it(server, client, protocol, region):
    # Triton answers an output written to shared memory with its name, datatype and shape
    # only: no data and no parameters (http_server.cc: "SHM outputs will not have an info";
    # infer_handler.cc: an empty raw_output_contents entry). tritonclient's C++ client takes
    # any output `parameters` for binary data and fails without `binary_data_size`.
    configure(client, region)
    result = basic_infer(client, protocol)
    if protocol == "http":
        (output,) = result.get_response()["outputs"]
        assert output == {"name": "y", "datatype": "FP32", "shape": list(X.shape)}
    else:
        response = result.get_response()
        assert response.raw_output_contents == [b""]
        (output,) = response.outputs
        assert (output.name, output.datatype, list(output.shape)) == ("y", "FP32", list(X.shape))
        assert not output.parameters
    assert_live(server)


def test_too_big_shm(server, client, protocol, region):
    # Triton: test_too_big_shm. A 128-byte region for a 64-byte input: Triton: 400 "[request id:
    # <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got
    # 128" (its core names the request, as errors.InputMismatchError does).
    handles = configure(client, region)
    key, big = region(128)
    shm.set_shared_memory_region(big, [X, X])
    client.unregister_system_shared_memory("x")
    client.register_system_shared_memory("x", key, 128)
    message = refused(lambda: basic_infer(client, protocol, x_size=128), protocol, 400, "INVALID_ARGUMENT")
    assert message == ("[request id: <id_unknown>] input 'x' of shape [4, 4] (FP32) is 64 bytes; its shared "
                       "memory part (shared_memory_byte_size) is 128")
    assert np.all(shm.get_contents_as_numpy(handles["y"], np.float32, [16]) == 0)  # nothing ran
    assert_live(server)


def test_large_shm_register_offset(server, client, protocol, region):
    # Triton: test_large_shm_register_offset (an out-of-bounds read there once): objects of
    # 1024 pages, regions registered one page before their end.
    handles = configure(client, region, create=PAGE * 1024, offset=PAGE * 1023)
    result = basic_infer(client, protocol)
    np.testing.assert_array_equal(output_of(result, handles["y"], offset=PAGE * 1023), X * SCALE)
    client.unregister_system_shared_memory()
    assert_live(server)


def test_mixed_raw_shm_http(server, region):
    # Triton: test_mixed_raw_shm over HTTP: x from shared memory, scale in the request.
    c = make_client(server, "http")
    try:
        handles = configure(c, region)
        np.testing.assert_array_equal(output_of(basic_infer(c, "http", raw_scale=True), handles["y"]), X * SCALE)
    finally:
        c.unregister_system_shared_memory()
    assert_live(server)


def test_mixed_raw_shm_grpc(server, region):
    # Triton: test_mixed_raw_shm over gRPC. tritonclient sends one raw_input_contents entry
    # (scale's) for two inputs; Triton indexes them over the inputs without a region
    # (infer_handler.cc, InferGRPCToInput). Ours: "raw_input_contents has 1 entries for 2 inputs".
    c = make_client(server, "grpc")
    try:
        handles = configure(c, region)
        np.testing.assert_array_equal(output_of(basic_infer(c, "grpc", raw_scale=True), handles["y"]), X * SCALE)
    finally:
        c.unregister_system_shared_memory()


def test_infer_offset_out_of_bound(server, client, protocol, region):
    # Triton: test_infer_offset_out_of_bound. Over HTTP an output offset of 2**64 - 32 (-32
    # as a signed 64-bit integer), over gRPC 64 (int64_param holds no more): Triton: 400
    # "Invalid offset for shared memory region: 'output0_data'".
    configure(client, region, create=PAGE + SIZE, offset=PAGE)
    offset = 2**64 - 32 if protocol == "http" else 64
    message = refused(lambda: basic_infer(client, protocol, out_offset=offset), protocol, 400, "INVALID_ARGUMENT")
    assert message == f"offset {offset} + 64 bytes runs past the end of the region (64 bytes)"
    assert_live(server)


def test_infer_byte_size_out_of_bound(server, client, protocol, region):
    # Triton: test_infer_byte_size_out_of_bound: output offset 1, byte size 64 in a 64-byte
    # region: Triton: 400 "Invalid offset + byte size for shared memory region: 'output0_data'".
    configure(client, region, create=PAGE + SIZE, offset=PAGE)
    message = refused(lambda: basic_infer(client, protocol, out_offset=1), protocol, 400, "INVALID_ARGUMENT")
    assert message == "offset 1 + 64 bytes runs past the end of the region (64 bytes)"
    assert_live(server)


def test_infer_integer_overflow(server, client, protocol, region):
    # Triton: test_infer_integer_overflow: output offset 32, byte size 2**64 - 32. Triton over
    # HTTP: 400 "Integer overflow detected: byte_size (...) + offset (32) exceeds maximum
    # value ..."; ours refuses the requested part past the region, before the model runs.
    # Over gRPC the client itself refuses the value (int64_param).
    configure(client, region)
    if protocol == "http":
        message = refused(lambda: basic_infer(client, protocol, out_offset=32, out_size=2**64 - 32), protocol, 400, "")
        assert message == f"offset 32 + {2**64 - 32} bytes runs past the end of the region (64 bytes)"
    else:
        with pytest.raises(ValueError, match="Value out of range:"):
            basic_infer(client, protocol, out_offset=32, out_size=2**64 - 32)
    assert_live(server)


@pytest.mark.parametrize("offset, size", [(1, SIZE), (32, 2**64 - 32)], ids=["byte_size", "overflow"])
def test_infer_requested_output_region_out_of_bound(server, region, offset, size):
    # Triton: test_infer_byte_size_out_of_bound and test_infer_integer_overflow (HTTP), with an
    # output (x [1, 4]: 16 bytes) that fits the region from that offset: Triton still refuses
    # the request as named (GetMemoryInfo checks offset + byte_size, before inference).
    c = make_client(server, "http")
    try:
        handles = configure(c, region)
        refused(lambda: basic_infer(c, "http", x_size=16, x_shape=(1, 4), out_offset=offset, out_size=size), "http",
                400, "")
        assert np.all(shm.get_contents_as_numpy(handles["y"], np.uint8, [SIZE]) == 0)  # nothing written
    finally:
        c.unregister_system_shared_memory()


def test_output_region_too_small(server, client, protocol, region):
    # Triton (http_server.cc / infer_handler.cc ResponseAlloc): "shared memory size specified
    # with the request for output 'y' (32 bytes) should be at least 64 bytes to hold the
    # results", as 500 INTERNAL, after running the model. Ours: 400 / INVALID_ARGUMENT, the
    # request's own fault, before the model runs where the output's size follows from the
    # inputs' (y: x's shape), so no execution is spent on it (before: one ran, for nothing).
    def executions() -> int:
        stats = httpx.get(f"{server.url}/v2/models/{SCALED}/stats").json()["model_stats"][0]
        return stats["execution_count"]

    handles = configure(client, region)
    before = executions()
    message = refused(lambda: basic_infer(client, protocol, out_size=32), protocol, 400, "INVALID_ARGUMENT")
    assert message == "output 'y' needs 64 bytes; its shared memory part (shared_memory_byte_size) has 32"
    assert np.all(shm.get_contents_as_numpy(handles["y"], np.float32, [16]) == 0)
    assert executions() == before
    assert_live(server)


# ---------------------------------------------------------------- unregister and inference (TestSharedMemoryUnregister)


def slow_request(c: Any, protocol: str, region) -> tuple[Callable[[], Any], Any]:
    """Triton's `_create_request_data` + async_infer on a model that takes SLOW_SECONDS:
    image in the region "image", logits into "logits". A function that waits for the
    result (raising the error), and the logits' handle."""
    key_in, handle_in = region(256)
    key_out, handle_out = region(40)
    image = np.full((1, 1, 8, 8), 0.25, np.float32)
    image.flat[0] = SLOW
    shm.set_shared_memory_region(handle_in, [image])
    c.register_system_shared_memory("image", key_in, 256)
    c.register_system_shared_memory("logits", key_out, 40)
    m = api(protocol)
    tensor = m.InferInput("image", [1, 1, 8, 8], "FP32")
    tensor.set_shared_memory("image", 256)
    logits = m.InferRequestedOutput("logits")
    logits.set_shared_memory("logits", 40)
    if protocol == "http":
        pending = c.async_infer(FAULTY, [tensor], outputs=[logits])
        return pending.get_result, handle_out
    answers: queue.Queue = queue.Queue()
    c.async_infer(FAULTY, [tensor], outputs=[logits], callback=lambda result, error: answers.put((result, error)))

    def wait() -> Any:
        result, error = answers.get(timeout=30)
        if error is not None:
            raise error
        return result

    return wait, handle_out


def test_unregister_shm_after_inference(server, client, protocol, region):
    # Triton: test_unregister_shm_after_inference_{http,grpc}.
    wait, handle = slow_request(client, protocol, region)
    time.sleep(SLOW_SECONDS / 3)  # the request is running
    observer = make_client(server, "http")
    assert names(observer) == ["image", "logits"]
    wait()
    assert names(observer) == ["image", "logits"]
    assert np.any(shm.get_contents_as_numpy(handle, np.float32, [10]) != 0)
    client.unregister_system_shared_memory()
    assert names(observer) == []
    assert_live(server)


def test_unregister_shm_during_inference_single_req(server, protocol, region):
    # Triton: test_unregister_shm_during_inference_single_req_{http,grpc}: unregister all
    # (from a second client) while the request runs is no error, the regions stay listed
    # until it completes, it completes, and then they are gone.
    c = make_client(server, protocol)
    try:
        wait, handle = slow_request(c, protocol, region)
        time.sleep(SLOW_SECONDS / 3)
        observer = make_client(server, "http")
        observer.unregister_system_shared_memory()
        try:
            wait()  # the request succeeds ...
            assert np.any(shm.get_contents_as_numpy(handle, np.float32, [10]) != 0)  # ... into its region
        finally:
            assert_live(server)
        assert names(observer) == []
    finally:
        c.unregister_system_shared_memory()
