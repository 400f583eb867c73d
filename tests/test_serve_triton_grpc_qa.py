"""NVIDIA Triton's gRPC QA tests, ported to `zoo serve`.

Source: the GitHub repository triton-inference-server/server, `qa/L0_grpc/python_grpc_aio_test.py`
(class TestGrpcAioClient: every call of `tritonclient.grpc.aio` once). Triton's tests are
© NVIDIA CORPORATION & AFFILIATES under the BSD-3-Clause license; this is our own code. It
makes the same calls against a server of its own (the digits model, system shared memory
on); each test gives its Triton name in a comment, asserts Triton's answer where we should
agree (ours where we differ by design, see docs/serving.md "Differences from Triton"), and
then checks that the server is still live.

Not ported, and why:
- test_update_trace_settings, test_get_trace_settings, the CUDA shared memory calls: extensions
  we do not offer (UNIMPLEMENTED, checked here once each).
- test_load_model / test_unload_model with polling: we have no polling mode; with model
  control off the answer is ours (docs/serving.md, "model control off").
- qa/L0_grpc_state_cleanup/cleanup_test.py (stream cancellation, a client closing mid-stream):
  ported in test_serve_triton_grpc_cleanup_qa.py.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Iterator

import httpx
import pytest
import tritonclient.grpc.aio as triton_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX, ServerProcess, export  # noqa: E402

pytest_plugins = ["serve_support"]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("grpc_qa") / "exports"
    export(DIGITS, "onnxruntime", repo)
    proc = ServerProcess(repo, "--shared-memory", "system", log=repo.parent / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


def call(server: ServerProcess, method: str, *args: Any, **kwargs: Any) -> Any:
    """One call of the aio client, on a client of its own (as Triton's setUp makes one)."""
    async def run() -> Any:
        client = triton_aio.InferenceServerClient(server.grpc_url)
        try:
            return await getattr(client, method)(*args, **kwargs)
        finally:
            await client.close()

    return asyncio.run(run())


def failure(server: ServerProcess, method: str, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(server, method, *args, **kwargs)
    return info.value


def assert_live(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200


def test_is_server_live_and_ready(server):
    # Triton: test_is_server_live, test_is_server_ready.
    assert call(server, "is_server_live") is True
    assert call(server, "is_server_ready") is True


def test_is_model_ready(server):
    # Triton: test_is_model_ready.
    assert call(server, "is_model_ready", ONNX) is True
    assert call(server, "is_model_ready", "no.such.model") is False


def test_get_server_metadata(server):
    # Triton: test_get_server_metadata (name "triton" there; "zoo" here, by design).
    assert call(server, "get_server_metadata").name == "zoo"
    assert call(server, "get_server_metadata", as_json=True)["name"] == "zoo"


def test_get_model_metadata_and_config(server):
    # Triton: test_get_model_metadata, test_get_model_config.
    assert call(server, "get_model_metadata", ONNX).name == ONNX
    assert call(server, "get_model_config", ONNX).config.name == ONNX
    assert_live(server)


def test_get_model_repository_index(server):
    # Triton: test_get_model_repository_index (8 models there; 1 here).
    assert [m.name for m in call(server, "get_model_repository_index").models] == [ONNX]


def test_load_and_unload_model_with_model_control_off(server):
    # Triton: test_load_model, test_unload_model: UNAVAILABLE "explicit model load / unload is
    # not allowed if polling is enabled". Ours, model control off: see docs/serving.md.
    for method in ("load_model", "unload_model"):
        error = failure(server, method, ONNX)
        assert "--model-control" in error.message(), error.message()
    assert call(server, "is_model_ready", ONNX) is True
    assert_live(server)


def test_get_inference_statistics(server):
    # Triton: test_get_inference_statistics.
    assert ONNX in [s.name for s in call(server, "get_inference_statistics").model_stats]


def test_trace_settings_are_unimplemented(server):
    # Triton: test_update_trace_settings, test_get_trace_settings: served there; not offered
    # here (UNIMPLEMENTED, docs/serving.md).
    for method in ("update_trace_settings", "get_trace_settings"):
        assert str(failure(server, method).status()) == "StatusCode.UNIMPLEMENTED", method
    assert_live(server)


def test_cuda_shared_memory_as_triton_without_gpus(server):
    # Triton: test_get_cuda_shared_memory_status, test_unregister_cuda_shared_memory: an
    # empty status and an unregister that succeeds, as Triton built without GPUs answers
    # (perf_analyzer unregisters every region, CUDA ones included, around each run);
    # registering is refused there ("GPUs not supported", INVALID_ARGUMENT) and here.
    assert dict(call(server, "get_cuda_shared_memory_status").regions) == {}
    call(server, "unregister_cuda_shared_memory")
    call(server, "unregister_cuda_shared_memory", "r")
    error = failure(server, "register_cuda_shared_memory", "r", b"\0" * 64, 0, 64)
    assert str(error.status()) == "StatusCode.INVALID_ARGUMENT" and "no GPU memory" in error.message()
    assert str(failure(server, "get_cuda_shared_memory_status", "r").status()) == "StatusCode.NOT_FOUND"
    assert_live(server)


def test_system_shared_memory_status_and_unregister(server):
    # Triton: test_get_system_shared_memory_status, test_unregister_system_shared_memory.
    assert dict(call(server, "get_system_shared_memory_status").regions) == {}
    call(server, "unregister_system_shared_memory")


def test_register_system_shared_memory_of_no_object(server):
    # Triton: test_register_system_shared_memory: INTERNAL "Unable to open shared memory
    # region: '/test_shm'" for a key no object has. Ours: INVALID_ARGUMENT, without the key.
    key = f"/zoo_qa_{uuid.uuid4().hex}"
    error = failure(server, "register_system_shared_memory", "test_shm", key, 8)
    assert str(error.status()) == "StatusCode.INVALID_ARGUMENT"
    assert error.message().startswith("no shared memory object has that key") and key not in error.message()
    assert_live(server)


def test_register_system_shared_memory_of_size_zero(server):
    # Triton: test_register_system_shared_memory sends byte_size 0; ours refuses it as such.
    key = f"/zoo_qa_{uuid.uuid4().hex}"
    handle = shm.create_shared_memory_region(key[1:], key, 8, create_only=True)
    try:
        error = failure(server, "register_system_shared_memory", "test_shm", key, 0)
        assert error.message() == "byte_size must be at least 1, not 0"
    finally:
        shm.destroy_shared_memory_region(handle)
    assert_live(server)
