"""NVIDIA Triton's model-control (lifecycle) QA tests, ported to `zoo serve --model-control`.

Source: the GitHub repository triton-inference-server/server, `qa/L0_lifecycle/lifecycle_test.py`
(class LifeCycleTest) and the server modes its `test.sh` starts each case in (there is no
`qa/L0_model_control` in that repository). Triton's tests are (c) NVIDIA CORPORATION &
AFFILIATES under the BSD-3-Clause license; this is our own code. Only the cases run in
explicit model-control mode (`--model-control-mode=explicit`) apply: `zoo serve
--model-control` is that mode (load and unload by name over HTTP and gRPC, no repository
polling). Every case uses the real clients, `tritonclient.http` and `tritonclient.grpc`,
and Triton's add/sub model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (swapped in
"the other version"), FP32 [batch, 16], defined below, exported to ONNX and served from its
manifest, each answer compared exactly. Each test gives its Triton name.

Where Triton's case needs a model that loads slowly (`identity_zero_1_int32` with
`creation_delay_sec`) or answers slowly, the artifact runs on `qaslow`: ONNX Runtime wrapped
by a plugin file this module writes (PLUGIN below), whose load sleeps as long as the file
`load_delay` beside it says and whose runner sleeps SLOW_SECONDS on an input starting SLOW.

Differences asserted as zoo documents them (docs/serving.md):
- all artifacts load at start-up (Triton's explicit mode loads only `--load-model` ones):
  "At start-up, ... every artifact in the repository is opened ... and loaded"; a case that
  starts from "no models loaded" unloads first.
- a model has one version, `1` ("Names and versions").
- a load with config or file overrides is a 400 / INVALID_ARGUMENT ("Differences from Triton":
  "model load with config or file overrides (with `--model-control`) | applied in explicit
  mode | 400"; "Safe defaults": no configuration or file overrides).
- a load of a name that is no artifact is 404 / NOT_FOUND (docs row "model load of a name the repository does not hold";
  Triton answers INTERNAL "failed to load 'x', failed to poll from model repository").
- a load that fails is 400 and the model served before keeps serving (status table, 400 row).
- the index lists every artifact directory: READY / UNAVAILABLE with the reason, `unloaded`
  after an unload, "not loaded" for one never loaded (endpoint table, `/v2/repository/index`;
  Triton lists a never-loaded model with no state).
- a request for an unloaded model is 404 "not served (UNAVAILABLE): unloaded" ("Safe
  defaults"; Triton: "Request for unknown model: '...' has no available versions").

Defects the port found, fixed (each test failed before):
- test_concurrent_model_load_speedup: loads of different models ran one after the other
  (one server-wide lock while an artifact opened); Triton loads them side by side, and so
  does zoo now (a lock per artifact name, zoo/serve/service.py Server.load).
- test_model_availability_on_reload_request_in_transit: an HTTP request whose body was still
  arriving when a reload swapped the new model in was answered 503 "not ready: unloading"
  by the old one; Triton resolves the model once the request is whole, and serves it, as
  zoo now does (Server.infer looks the name up again after the body).

Not ported, and why:
- test_parse_error_noexit, test_parse_error_modelfail(_nostrict), test_parse_error_no_model_config,
  test_init_error_modelfail, test_parse_error_model_no_version, test_parse_ignore_zero_prefixed_version,
  test_parse_ignore_non_intergral_version: start-up modes (--exit-on-error, --strict-readiness,
  version directories) zoo does not have; a skipped artifact at start is
  tests/test_serve_lifecycle.py::test_skipped_artifacts_say_why.
- test_dynamic_model_load_unload, test_dynamic_version_load_unload, test_dynamic_model_modify,
  test_dynamic_file_delete, test_multiple_model_repository_polling, test_add_custom_config,
  test_delete_custom_config: repository polling (`--model-control-mode=poll`); zoo does not
  poll. Their explicit-mode halves (load after files changed, statistics reset) are here.
- test_dynamic_version_load_unload_disabled, test_load_new_model_version, the version-policy
  parts of test_model_control and test_multiple_model_repository_control_startup_models:
  one version per artifact directory, no version policy.
- test_multiple_model_repository_control, the duplicate-repository reason of
  test_model_repository_index: zoo serves one repository.
- test_model_control_ensemble, the ensemble parts of test_model_control,
  test_concurrent_model_load_unload and test_shutdown_ensemble: ensembles are Triton-only.
- test_load_same_model_different_platform: an artifact's name carries its backend
  (`NAME.BACKEND.PRECISION`), so one name cannot change platform; other files under the
  same name are test_load_after_files_changed.
- test_model_config_overwite, test_concurrent_model_instance_load_speedup,
  test_concurrent_model_instance_load_sanity: they load with a config override (refused, see
  test_load_overrides_refused) and need sequence batching (not offered).
- test_load_gpu_limit: --model-load-gpu-limit, a GPU option zoo does not have.
- test_shutdown_dynamic, test_shutdown_sequence, test_shutdown_with_live_connection: shutdown
  with requests in flight is tests/test_serve_lifecycle.py's SIGTERM tests; sequences are not
  offered.
"""

from __future__ import annotations

import shutil
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec, registry

pytest.register_assert_rewrite("serve_support")
from serve_support import ServerProcess, copy_as  # noqa: E402

SIZE, BATCH = 16, 8
ADD = "lifecycle.addsub.onnxruntime.fp32"  # Triton's onnx_float32_float32_float32
SLOW_A = "lifecycle.addsub.qaslow.fp32"  # identity_zero_1_int32 with a creation delay
SLOW_B = "lifecycle.subadd.qaslow.fp32"  # a second slow-loading model
BROKEN = "lifecycle.broken.onnxruntime.fp32"  # a model that fails to load
LATE = "lifecycle.late.onnxruntime.fp32"  # copied into the repository while serving
SLOW, SLOW_SECONDS = 4321.0, 1.0
DELAY = 1.5  # seconds a slow load takes (Triton's cases: 10)

PLUGIN = f'''"""Test-only backend written by tests/test_serve_triton_lifecycle_qa.py: ONNX Runtime whose
load sleeps as long as the file load_delay beside this one says (after the engine has read
the model), and waits while a file hold_MODEL beside it exists, and whose runner sleeps on
an input starting SLOW."""
import time
from pathlib import Path

import numpy as np
from zoo_onnxruntime import OnnxRuntimeBackend

import zoo

DELAY = Path(__file__).with_name("load_delay")


class SlowRunner:
    def __init__(self, inner):
        self.inner = inner
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def __call__(self, inputs):
        if float(np.asarray(next(iter(inputs.values()))).reshape(-1)[0]) == {SLOW}:
            time.sleep({SLOW_SECONDS})
        return self.inner(inputs)


class SlowLoadBackend(OnnxRuntimeBackend):
    name = "qaslow"
    description = "ONNX Runtime with a load delay (lifecycle QA tests only)"
    precisions = {{"cpu": ("fp32",)}}

    def load(self, path, spec, precision, device, threads=None, info=None):
        runner = SlowRunner(super().load(path, spec, precision, device, threads, info))
        time.sleep(float(DELAY.read_text()) if DELAY.is_file() else 0.0)
        hold, deadline = DELAY.with_name("hold_" + spec.name), time.monotonic() + 60
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return runner


@zoo.hookimpl
def zoo_register_backends(register):
    register(SlowLoadBackend())
'''


class AddSub(torch.nn.Module):
    """Triton's add/sub model, its outputs swapped when `swap` (Triton's version 3)."""

    def __init__(self, swap: bool) -> None:
        super().__init__()
        self.swap = swap

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: N803
        total, difference = INPUT0 + INPUT1, INPUT0 - INPUT1
        first, second = (difference, total) if self.swap else (total, difference)
        return {"OUTPUT0": first, "OUTPUT1": second}


def addsub_spec(name: str, swap: bool) -> ModelSpec:
    shape = ("batch", SIZE)

    def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {n: rng.integers(-50, 50, (batch, SIZE)).astype(np.float32) for n in ("INPUT0", "INPUT1")}

    return ModelSpec(name=name, domain="test", task="add-sub",
                     inputs=(TensorSpec("INPUT0", "float32", shape), TensorSpec("INPUT1", "float32", shape)),
                     outputs=(TensorSpec("OUTPUT0", "float32", shape), TensorSpec("OUTPUT1", "float32", shape)),
                     build=lambda: AddSub(swap), sample=sample, axes={"batch": AxisRange(1, BATCH, BATCH)})


class LifecycleServer(ServerProcess):
    """`python -m zoo --plugin tests/serve_plugin.py --plugin PLUGIN serve REPO --model-control`."""

    def __init__(self, repository: Path, plugin: Path, *args: str, log: Path) -> None:
        super().__init__(repository, "--model-control", *args, log=log, plugins=[plugin])


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """The repository (ADD, SLOW_A, SLOW_B, BROKEN), the other version of ADD and SLOW_A
    (outputs swapped, same artifact names) in `alt`, and the server."""
    root = tmp_path_factory.mktemp("lifecycle_qa")
    plugin = root / "lifecycle_qa_plugin.py"
    plugin.write_text(PLUGIN)
    repo, alt = root / "exports", root / "alt"
    registry.load_plugin_file(plugin)
    server = None
    try:
        for name, backend, swap in (("lifecycle.addsub", "onnxruntime", False), ("lifecycle.addsub", "qaslow", False),
                                    ("lifecycle.subadd", "qaslow", True)):
            zoo.export(addsub_spec(name, swap), backend, repository=repo, random_init=True)
        broken = copy_as(repo / ADD, repo / BROKEN)
        (broken / "1" / "model.onnx").write_bytes(b"tampered")
        server = LifecycleServer(repo, plugin, log=root / "server.log")  # starts while the other version exports
        for backend in ("onnxruntime", "qaslow"):
            zoo.export(addsub_spec("lifecycle.addsub", True), backend, repository=alt, random_init=True)
    except BaseException:
        if server is not None:
            server.kill()
        raise
    finally:
        registry.unload_plugin_file(plugin)
    try:
        server.wait_ready()
        yield SimpleNamespace(server=server, repo=repo, alt=alt, root=root, plugin=plugin,
                              delay=root / "load_delay")
    finally:
        server.kill()


@pytest.fixture
def server(world) -> Iterator[Any]:
    """The module's server, checked live at the end of each test (as Triton's tests end), and
    left as each test found it: every model but BROKEN loaded, no load delay."""
    yield world.server
    world.delay.unlink(missing_ok=True)
    assert httpx.get(f"{world.server.url}/v2/health/live", timeout=10).status_code == 200
    for name in (ADD, SLOW_A, SLOW_B):
        if httpx.get(f"{world.server.url}/v2/models/{name}/ready", timeout=10).status_code != 200:
            assert httpx.post(f"{world.server.url}/v2/repository/models/{name}/load", timeout=60).status_code == 200


def http_client(server) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60,
                                             connection_timeout=60)


def grpc_client(server) -> triton_grpc.InferenceServerClient:
    return triton_grpc.InferenceServerClient(server.grpc_url)


def both(server) -> list[Any]:
    return [http_client(server), grpc_client(server)]


def draw(seed: int, rows: int = 1, first: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """INPUT0 and INPUT1 as infer_util.py draws FP32 ones: integers in half int16's range,
    so every sum and difference is exact."""
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-8192, 8192, (rows, SIZE)).astype(np.float32) for _ in range(2))
    if first is not None:
        a.flat[0] = first
    return a, b


def inputs_for(client, a: np.ndarray, b: np.ndarray) -> list:
    module = triton_http if isinstance(client, triton_http.InferenceServerClient) else triton_grpc
    tensors = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def infer_exact(client, model: str, swap: bool = False, seed: int = 0, first: float | None = None,
                version: str = "") -> None:
    """infer_util.py's infer_exact, FP32, batch 1: both outputs exact (swapped when `swap`)."""
    a, b = draw(seed, first=first)
    result = client.infer(model, inputs_for(client, a, b), model_version=version)
    want = (a - b, a + b) if swap else (a + b, a - b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), want[0], err_msg=f"{model} OUTPUT0")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), want[1], err_msg=f"{model} OUTPUT1")


def status(ex: InferenceServerException) -> str:
    """The HTTP status or gRPC code of a failed call, as tritonclient reports it."""
    return str(ex.status())


def index_of(client) -> dict[str, dict]:
    """The repository index by name, from either client, as JSON."""
    if isinstance(client, triton_http.InferenceServerClient):
        rows = client.get_model_repository_index()
    else:
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    return {row["name"]: row for row in rows}


def success_count(client, model: str) -> int:
    if isinstance(client, triton_http.InferenceServerClient):
        (stats,) = client.get_inference_statistics(model)["model_stats"]
        return int(stats["inference_stats"]["success"]["count"])
    (stats,) = client.get_inference_statistics(model).model_stats
    return stats.inference_stats.success.count


def assert_states(server, ready: dict[str, bool]) -> None:
    """Triton's `is_server_live`, `is_server_ready` and `is_model_ready(name, "1")` through both clients."""
    for client in both(server):
        with client:
            assert client.is_server_live() and client.is_server_ready()
            for name, want in ready.items():
                assert client.is_model_ready(name, "1") is want, (name, type(client).__module__)


# ---------------------------------------------------------------- load and unload


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_control(server, protocol):
    # Triton: test_model_control (explicit mode), with the statistics checks of
    # test_dynamic_model_load_unload: a model loaded over the API answers and counts; loading
    # a name that is in no repository fails naming it; unloading one does nothing; an unloaded
    # model is not ready and answers no request; loaded again, its statistics start from 0.
    control = http_client(server) if protocol == "http" else grpc_client(server)
    with control:
        control.unload_model(ADD)  # "Make sure no models are loaded" (zoo loads all at start)
        assert_states(server, {ADD: False})
        with pytest.raises(InferenceServerException) as info:
            control.load_model("unknown_model")
        # Triton: "failed to load 'unknown_model', failed to poll from model repository" (INTERNAL);
        # zoo: 404 / NOT_FOUND, the status table's "unknown model"
        assert "'unknown_model'" in info.value.message() and "model repository" in info.value.message()
        assert status(info.value) in ("404", "StatusCode.NOT_FOUND")
        control.load_model(ADD)
        assert_states(server, {ADD: True})
        for client in both(server):
            with client:
                infer_exact(client, ADD)
                infer_exact(client, ADD, version="1")
        for client in both(server):
            with client:
                assert success_count(client, ADD) == 4
        control.unload_model("unknown_model")  # "Unload non-existing model, nothing should happen"
        control.unload_model(ADD)
        assert_states(server, {ADD: False})
        for client in both(server):
            with client, pytest.raises(InferenceServerException) as info:
                infer_exact(client, ADD)
            # Triton: "Request for unknown model: '...' has no available versions"
            assert f"model {ADD} is in the repository but not served (UNAVAILABLE): unloaded" in info.value.message()
            assert status(info.value) in ("404", "StatusCode.NOT_FOUND")
        control.load_model(ADD)
        assert_states(server, {ADD: True})
        for client in both(server):
            with client:
                assert success_count(client, ADD) == 0  # "The status/stats should be reset"
        for client in both(server):
            with client:
                infer_exact(client, ADD)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_control_fail(server, protocol):
    # Triton: test_model_control_fail: a model that fails to load fails again on another
    # attempt ("load failed for model '...'"), and is not ready. Here the artifact's
    # model.onnx no longer matches its sha256: 400 / INVALID_ARGUMENT, the index says why.
    with http_client(server) if protocol == "http" else grpc_client(server) as control:
        for _ in range(2):
            with pytest.raises(InferenceServerException) as info:
                control.load_model(BROKEN)
            assert f"failed to load {BROKEN}" in info.value.message() and "sha256" in info.value.message()
            assert status(info.value) in ("400", "StatusCode.INVALID_ARGUMENT")
        assert_states(server, {BROKEN: False, ADD: True})
        row = index_of(control)[BROKEN]
        assert row["state"] == "UNAVAILABLE" and "sha256" in row["reason"], row


def test_model_reload_fail(world, server):
    # Triton: test_model_reload_fail: a served model whose files change so that the reload
    # fails keeps serving what it served ("v1 should still be available even if v2 fails to
    # load"). Loaded again once the files are whole, it serves them.
    path = world.repo / ADD
    original = (path / "1" / "model.onnx").read_bytes()
    (path / "1" / "model.onnx").write_bytes(b"not a model")
    try:
        for client in both(server):
            with client:
                with pytest.raises(InferenceServerException) as info:
                    client.load_model(ADD)
                assert f"failed to load {ADD}" in info.value.message()
                assert "the loaded one keeps serving" in info.value.message()
                assert status(info.value) in ("400", "StatusCode.INVALID_ARGUMENT")
                assert client.is_model_ready(ADD, "1")
                infer_exact(client, ADD)
                assert index_of(client)[ADD]["state"] == "READY"
    finally:
        (path / "1" / "model.onnx").write_bytes(original)
    with grpc_client(server) as client:
        client.load_model(ADD)
        infer_exact(client, ADD)


def test_model_repository_index(world, server):
    # Triton: test_model_repository_index: every model of the repository is listed, loaded or
    # not, with its state and reason, over HTTP and gRPC; `ready` lists only the ready ones.
    with grpc_client(server) as control:
        control.unload_model(SLOW_B)
    try:
        for client in both(server):
            with client:
                index = index_of(client)
                assert sorted(index) == sorted([ADD, SLOW_A, SLOW_B, BROKEN])
                for name in (ADD, SLOW_A):
                    assert (index[name]["state"], index[name]["version"]) == ("READY", "1")
                assert (index[SLOW_B]["state"], index[SLOW_B]["reason"]) == ("UNAVAILABLE", "unloaded")
                assert index[SLOW_B]["version"] == "1"
                assert index[BROKEN]["state"] == "UNAVAILABLE" and "sha256" in index[BROKEN]["reason"]
                if isinstance(client, triton_http.InferenceServerClient):
                    ready = {name for name, row in index.items() if row["state"] == "READY"}
                    listed = {r["name"] for r in httpx.post(f"{server.url}/v2/repository/index",
                                                            json={"ready": True}).json()}
                else:
                    from tritonclient.grpc import service_pb2

                    listed = {m.name for m in client._client_stub.RepositoryIndex(
                        service_pb2.RepositoryIndexRequest(ready=True)).models}
                    ready = {name for name, row in index.items() if row["state"] == "READY"}
                assert listed == ready == {ADD, SLOW_A}
    finally:
        with grpc_client(server) as control:
            control.load_model(SLOW_B)


def test_dynamic_model_load_unload_disabled(world, server):
    # Triton: test_dynamic_model_load_unload_disabled (no polling): a model copied into the
    # repository is not loaded until asked; one removed from it keeps being served. Then,
    # explicit mode: loaded, it answers; unloaded with its directory gone, it leaves the index
    # and cannot be loaded.
    late = copy_as(world.repo / ADD, world.repo / LATE)
    try:
        time.sleep(0.5)
        assert_states(server, {LATE: False, ADD: True})
        for client in both(server):
            with client:
                row = index_of(client)[LATE]
                assert (row["state"], row["reason"]) == ("UNAVAILABLE", "not loaded"), row
        with http_client(server) as client:
            client.load_model(LATE)
        shutil.rmtree(late)
        time.sleep(0.5)
        assert_states(server, {LATE: True})
        for client in both(server):
            with client:
                infer_exact(client, LATE)
                assert index_of(client)[LATE]["state"] == "READY"
        with grpc_client(server) as client:
            client.unload_model(LATE)
            assert LATE not in index_of(client)
            with pytest.raises(InferenceServerException) as info:
                client.load_model(LATE)
            assert status(info.value) == "StatusCode.NOT_FOUND" and repr(LATE) in info.value.message()
    finally:
        shutil.rmtree(late, ignore_errors=True)
        httpx.post(f"{server.url}/v2/repository/models/{LATE}/unload", timeout=60)


def replace_files(source: Path, target: Path) -> None:
    """Every file of artifact `source` written over artifact `target`'s."""
    shutil.copytree(source, target, dirs_exist_ok=True)


def test_load_after_files_changed(world, server):
    # Triton: test_model_control's reload after the model's files changed (and the explicit
    # halves of test_dynamic_model_modify and test_load_same_model_different_platform): without
    # polling, the server keeps serving what it loaded; a load reads the new files (here the
    # other version, outputs swapped), and the original ones again once they are back.
    saved = world.root / "saved-add"
    shutil.copytree(world.repo / ADD, saved)
    try:
        replace_files(world.alt / ADD, world.repo / ADD)
        for client in both(server):
            with client:
                infer_exact(client, ADD, swap=False)
        with grpc_client(server) as client:
            client.load_model(ADD)
        for client in both(server):
            with client:
                assert client.is_model_ready(ADD, "1")
                infer_exact(client, ADD, swap=True)
    finally:
        replace_files(saved, world.repo / ADD)
    with http_client(server) as client:
        client.load_model(ADD)
        infer_exact(client, ADD, swap=False)


def test_model_availability_on_reload(world, server):
    # Triton: test_model_availability_on_reload (and _2, _3): while a reload takes its time
    # (Triton: creation delay; here DELAY), the model loaded before stays ready and answers,
    # promptly; once the load returns, the new files answer (here the other version).
    saved = world.root / "saved-slow"
    shutil.copytree(world.repo / SLOW_A, saved)
    world.delay.write_text(str(DELAY))
    try:
        replace_files(world.alt / SLOW_A, world.repo / SLOW_A)
        with ThreadPoolExecutor(1) as pool, grpc_client(server) as control:
            load = pool.submit(control.load_model, SLOW_A)
            time.sleep(DELAY / 4)
            assert not load.done()
            with grpc_client(server) as client:
                start = time.monotonic()
                assert client.is_server_live() and client.is_model_ready(SLOW_A, "1")
                assert time.monotonic() - start < DELAY / 2, "the server waited on the load"
            assert_states(server, {SLOW_A: True})
            for client in both(server):
                with client:
                    infer_exact(client, SLOW_A, swap=False)
            assert not load.done(), "the checks above did not run during the load"
            load.result(timeout=60)
        assert_states(server, {SLOW_A: True})
        for client in both(server):
            with client:
                infer_exact(client, SLOW_A, swap=True)
    finally:
        world.delay.unlink(missing_ok=True)
        replace_files(saved, world.repo / SLOW_A)
        assert httpx.post(f"{server.url}/v2/repository/models/{SLOW_A}/load", timeout=60).status_code == 200


def raw_infer_head(server, model: str, body: bytes) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return sock, head


def test_model_availability_on_reload_request_in_transit(world, server):
    # Triton: test_model_availability_on_reload ("v1 should still be available until v2 is
    # loaded"), for a request that is being received while the reload completes: Triton looks
    # the model up once the request is whole, so it is answered by whichever model is loaded.
    import json

    a, b = draw(7)
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, SIZE], "data": a.ravel().tolist()},
                                  {"name": "INPUT1", "datatype": "FP32", "shape": [1, SIZE],
                                   "data": b.ravel().tolist()}]}).encode()
    sock, head = raw_infer_head(server, ADD, body)
    with sock:
        sock.sendall(head + body[:10])
        time.sleep(0.3)  # the server has the headers and has begun reading the body
        assert httpx.post(f"{server.url}/v2/repository/models/{ADD}/load", timeout=60).status_code == 200
        sock.sendall(body[10:])
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
    status_line = answer.split(b"\r\n", 1)[0].decode()
    assert " 200 " in status_line, answer[:400]


def test_unload_with_requests_in_flight(server):
    # Triton: unloading a model waits for the requests it holds (the in-flight part of
    # test_shutdown_dynamic, for an unload): slow requests sent before the unload are all
    # answered, exactly; the unload returns after them; the model is then not ready.
    results: list = []
    done = threading.Event()

    def callback(result, error) -> None:
        results.append(error if error is not None else result)
        if len(results) == 3:
            done.set()

    a, b = draw(3, first=SLOW)
    with grpc_client(server) as client, http_client(server) as control:
        for _ in range(3):
            client.async_infer(SLOW_A, inputs_for(client, a, b), callback)
        time.sleep(0.3)
        start = time.monotonic()
        control.unload_model(SLOW_A)
        assert time.monotonic() - start > 0.3, "the unload did not wait for the requests in flight"
        assert done.wait(30)
        for result in results:
            assert not isinstance(result, Exception), result
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        assert not client.is_model_ready(SLOW_A)
        control.load_model(SLOW_A)
        infer_exact(client, SLOW_A)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_overrides_refused(world, server, protocol):
    # Triton: test_config_override, test_file_override, test_file_override_security (and the
    # override of test_model_config_overwite): Triton applies a config or files given at load
    # time; zoo refuses both (docs/serving.md, "Differences from Triton": "model load with config
    # or file overrides (with `--model-control`) | applied in explicit mode | 400"), loaded or
    # not the model stays as it was, and no file is written (Triton's security case: a path
    # out of the model directory creates nothing).
    escape = world.root / "escaped.txt"
    overrides = [dict(config='{"backend": "onnxruntime", "version_policy": {"specific": {"versions": [2]}}}'),
                 dict(files={"file:1/model.onnx": (world.repo / ADD / "1" / "model.onnx").read_bytes()}),
                 dict(config='{"backend": "identity"}', files={f"file:../../{escape.name}": b"should not exist"})]
    with http_client(server) if protocol == "http" else grpc_client(server) as control:
        for loaded in (True, False):
            if not loaded:
                control.unload_model(ADD)
            for override in overrides:
                for name in (ADD, "override_model"):
                    with pytest.raises(InferenceServerException) as info:
                        control.load_model(name, **override)
                    assert status(info.value) in ("400", "StatusCode.INVALID_ARGUMENT"), info.value
                    assert "configuration and file overrides are not supported" in info.value.message()
            assert control.is_model_ready(ADD) is loaded
            assert "override_model" not in index_of(control)
        control.load_model(ADD)
        infer_exact(control, ADD)
    assert not escape.exists() and not (world.repo / "override_model").exists()


# ---------------------------------------------------------------- concurrency


def test_concurrent_model_load_unload(world, server):
    # Triton: test_concurrent_model_load_unload: an unload sent while the model loads waits for
    # the load, so the model ends unloaded; two models loaded at once, then unloaded at once,
    # end as asked.
    with grpc_client(server) as client:
        client.unload_model(SLOW_A)
        world.delay.write_text(str(DELAY))
        with ThreadPoolExecutor(2) as pool:
            load = pool.submit(client.load_model, SLOW_A)
            time.sleep(DELAY / 3)
            unload = pool.submit(client.unload_model, SLOW_A)
            load.result(timeout=60)
            unload.result(timeout=60)
        world.delay.unlink()
        assert client.is_server_live() and client.is_server_ready()
        assert not client.is_model_ready(SLOW_A)
        for action in (client.load_model, client.unload_model):
            with ThreadPoolExecutor(2) as pool:
                for future in [pool.submit(action, name) for name in (SLOW_A, ADD)]:
                    future.result(timeout=60)
            for name in (SLOW_A, ADD):
                assert client.is_model_ready(name) is (action == client.load_model)
        client.load_model(SLOW_A)
        client.load_model(ADD)
        infer_exact(client, SLOW_A)


def test_concurrent_model_load(world, server):
    # Triton: test_concurrent_model_load: a second load of a model sent while the first one
    # still loads, after its files changed (Triton: another backend; here the other version),
    # waits for the first; both succeed and the second's files are served.
    saved = world.root / "saved-concurrent"
    shutil.copytree(world.repo / SLOW_A, saved)
    world.delay.write_text(str(DELAY))
    try:
        with ThreadPoolExecutor(2) as pool, grpc_client(server) as client:
            first = pool.submit(client.load_model, SLOW_A)
            time.sleep(DELAY / 3)  # the first load has read the files and is "creating" the model
            replace_files(world.alt / SLOW_A, world.repo / SLOW_A)
            second = pool.submit(client.load_model, SLOW_A)
            first.result(timeout=60)
            second.result(timeout=60)
            assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(SLOW_A)
            infer_exact(client, SLOW_A, swap=True)
    finally:
        world.delay.unlink(missing_ok=True)
        replace_files(saved, world.repo / SLOW_A)
        assert httpx.post(f"{server.url}/v2/repository/models/{SLOW_A}/load", timeout=60).status_code == 200


def test_concurrent_model_load_speedup(world, server):
    # Triton: test_concurrent_model_load_speedup: two models that each take 10 s to load,
    # loaded at once, take less than 15 s ("Concurrent loading speedup not observed"). Here
    # without a clock: the load of A is held (until a file is removed) while B loads; B's
    # load must finish meanwhile, then A's once released.
    hold = world.delay.with_name("hold_lifecycle.addsub")
    with grpc_client(server) as client:
        client.unload_model(SLOW_A)
        client.unload_model(SLOW_B)
        hold.write_text("")
        try:
            with ThreadPoolExecutor(2) as pool:
                held = pool.submit(client.load_model, SLOW_A)
                time.sleep(0.5)  # A's load has begun (and waits on the file)
                pool.submit(client.load_model, SLOW_B).result(timeout=30)  # not behind A's
                assert client.is_model_ready(SLOW_B) and not held.done()
                hold.unlink()
                held.result(timeout=60)
        finally:
            hold.unlink(missing_ok=True)
        assert client.is_model_ready(SLOW_A) and client.is_model_ready(SLOW_B)


def test_concurrent_same_model_load_unload_stress(server):
    # Triton: test_concurrent_same_model_load_unload_stress (32 threads x 1024 iterations;
    # here 4 x 3, over both clients): loads and unloads of one model from many threads at once
    # never crash the server. Triton tolerates a few race failures ("versions that are still
    # available"); zoo serializes model control, so every call succeeds. The server stays live
    # and ready, and the model loaded last answers.
    errors: list[Exception] = []

    def load_unload(k: int) -> None:
        client = http_client(server) if k % 2 else grpc_client(server)
        with client:
            for _ in range(3):
                try:
                    client.load_model(ADD)
                    client.unload_model(ADD)
                except InferenceServerException as ex:
                    errors.append(ex)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(load_unload, range(4)))
    assert errors == []
    with grpc_client(server) as client:
        assert client.is_server_live() and client.is_server_ready()
        assert not client.is_model_ready(ADD)
        client.load_model(ADD)
        infer_exact(client, ADD)


def test_load_unload_under_inference_load(server):
    # Triton: test_model_availability_on_reload under load, and load/unload while requests
    # keep coming: while a model is reloaded again and again, every request to it is answered
    # exactly (none finds it unserved); while it is unloaded and loaded again and again, each
    # request is answered exactly or refused as not served (404 / NOT_FOUND, or 503 /
    # UNAVAILABLE while it unloads), never with another error; requests to another model are
    # all answered.
    stop = threading.Event()
    outcomes: dict[str, list] = {"ADD": [], "other": []}
    phase = {"unloading": False}

    def worker(k: int) -> None:
        client = http_client(server) if k % 2 else grpc_client(server)
        with client:
            seed = 0
            while not stop.is_set():
                seed += 1
                model, key = (ADD, "ADD") if k < 4 else (SLOW_B, "other")
                try:
                    infer_exact(client, model, swap=model == SLOW_B, seed=seed)
                    outcomes[key].append(("ok", phase["unloading"]))
                except InferenceServerException as ex:
                    outcomes[key].append((status(ex), phase["unloading"], ex.message()))

    with ThreadPoolExecutor(5) as pool, grpc_client(server) as control:
        futures = [pool.submit(worker, k) for k in range(5)]
        try:
            time.sleep(0.3)
            for _ in range(3):
                control.load_model(ADD)  # a reload: the name stays served throughout
                time.sleep(0.1)
            time.sleep(0.2)
            phase["unloading"] = True
            for _ in range(3):
                control.unload_model(ADD)
                time.sleep(0.1)
                control.load_model(ADD)
                time.sleep(0.1)
        finally:
            stop.set()
            for future in futures:
                future.result(timeout=60)
    reload_phase = [o for o in outcomes["ADD"] if not o[1]]
    assert reload_phase and all(o[0] == "ok" for o in reload_phase), [o for o in reload_phase if o[0] != "ok"][:3]
    unload_phase = [o for o in outcomes["ADD"] if o[1]]
    assert unload_phase and {o[0] for o in unload_phase} <= {"ok", "404", "StatusCode.NOT_FOUND", "503",
                                                             "StatusCode.UNAVAILABLE"}, unload_phase[:3]
    refused = [o for o in unload_phase if o[0] != "ok"]
    assert all("not served" in o[2] or "not ready" in o[2] for o in refused), refused[:3]
    assert outcomes["other"] and all(o[0] == "ok" for o in outcomes["other"]), outcomes["other"][:3]


# ---------------------------------------------------------------- shutdown


def test_shutdown_while_loading(world):
    # Triton: test_shutdown_while_loading and test_shutdown_while_background_unloading: the
    # server stops while a model loads (and while a replaced model is still being unloaded),
    # without hanging or failing.
    repo = world.root / "shutdown"  # a server of its own, with only the model it loads
    shutil.copytree(world.repo / SLOW_A, repo / SLOW_A, dirs_exist_ok=True)
    server = LifecycleServer(repo, world.plugin, log=world.root / "shutdown.log").wait_ready()
    try:
        world.delay.write_text(str(DELAY))
        with ThreadPoolExecutor(1) as pool, grpc_client(server) as client:
            load = pool.submit(client.load_model, SLOW_A)
            time.sleep(DELAY / 3)
            assert client.is_model_ready(SLOW_A)  # the one loaded before is replaced once the new one is ready
            start = time.monotonic()
            assert server.terminate(timeout=60) in (0, -signal.SIGTERM)
            assert time.monotonic() - start < DELAY + 10
            try:
                load.result(timeout=30)
            except InferenceServerException as ex:  # the load may be cut short by the shutdown
                assert status(ex) in ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED"), ex
        log = server.log()
        assert "Traceback" not in log, log[-3000:]
    finally:
        world.delay.unlink(missing_ok=True)
        server.kill()
