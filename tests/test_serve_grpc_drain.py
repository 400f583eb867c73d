"""`zoo serve`'s gRPC front end at shutdown and on stream errors, through tritonclient's
asyncio client against a real server.

A graceful shutdown under load: every call that reached the server is answered, or
refused with UNAVAILABLE and the reason; grpc core never cancels one (as it does when its
server is stopped with calls it has taken but not yet handed to a method: tritonserver
2.51 answered all 400 calls of this test, zoo cancelled 118). On a stream, an error of the
request against the model's configuration starts with `[request id: ID] ` (`<id_unknown>`
without an id) as Triton's core words it, and an unknown model does not, as in Triton's
(tritonclient hands a stream's callback only that message, not the response's `id`).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

import zoo

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX, ServerProcess, export  # noqa: E402

pytest_plugins = ["serve_support"]
CALLS = 400
ROWS = 8
IMAGE = np.linspace(0.0, 1.0, ROWS * 64, dtype=np.float32).reshape(ROWS, 1, 8, 8)


@pytest.fixture(scope="module")
def drain_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("drain") / "exports"
    export(DIGITS, "onnxruntime", repo)
    return repo


@pytest.fixture(scope="module")
def live_server(drain_repo) -> Iterator[ServerProcess]:
    proc = ServerProcess(drain_repo, log=drain_repo.parent / "server.log").wait_ready()
    try:
        yield proc
    finally:
        proc.kill()


def image(array: np.ndarray) -> list[InferInput]:
    item = InferInput("image", list(array.shape), "FP32")
    item.set_data_from_numpy(array)
    return [item]


def test_a_shutdown_under_load_answers_or_refuses_every_call_and_cancels_none(drain_repo):
    # calls in flight, calls taken but not yet handled and calls that arrive during the drain
    expected = zoo.load(drain_repo / ONNX, threads=1)({"image": IMAGE})["logits"]
    server = ServerProcess(drain_repo, log=drain_repo.parent / "shutdown.log").wait_ready()
    try:
        async def load() -> list:
            async with grpc_aio.InferenceServerClient(server.grpc_url) as client:
                await client.infer(ONNX, image(IMAGE))  # connected and warm: the calls go out at once
                loop = asyncio.get_running_loop()
                loop.call_later(0.02, server.proc.send_signal, signal.SIGTERM)
                calls = [client.infer(ONNX, image(IMAGE), request_id=str(k), client_timeout=30) for k in range(CALLS)]
                return await asyncio.gather(*calls, return_exceptions=True)

        results = asyncio.run(load())
        assert server.proc.wait(20) in (0, -signal.SIGTERM), server.log()[-2000:]
    finally:
        server.kill()
    refused = [r for r in results if isinstance(r, BaseException)]
    statuses = sorted({r.status() if isinstance(r, InferenceServerException) else repr(r) for r in refused})
    assert all(isinstance(r, InferenceServerException) and r.status() == "StatusCode.UNAVAILABLE"
               and "the server is shutting down" in r.message() for r in refused), \
        f"{len(refused)} of {CALLS} calls failed: {statuses}: {[str(r) for r in refused[:3]]}"
    answered = [r for r in results if not isinstance(r, BaseException)]
    assert answered, "no call was answered: the signal came before any call reached the server"
    for k, result in enumerate(results):
        if not isinstance(result, BaseException):
            assert result.get_response().id == str(k)
            np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-4, rtol=1e-4)


def test_a_stream_error_names_its_request_as_triton_does(live_server):
    bad = np.zeros((1, 1, 4, 16), np.float32)  # a fixed dimension of the wrong size

    async def stream() -> list:
        async with grpc_aio.InferenceServerClient(live_server.grpc_url) as client:
            async def messages():
                yield {"model_name": ONNX, "inputs": image(IMAGE[:1]), "request_id": "r0"}
                yield {"model_name": ONNX, "inputs": image(bad), "request_id": "r1"}
                yield {"model_name": "no-such-model", "inputs": image(IMAGE[:1]), "request_id": "r2"}
                yield {"model_name": ONNX, "inputs": image(bad)}  # no id: `<id_unknown>`, as Triton names it

            return [item async for item in client.stream_infer(messages())]

    answers = asyncio.run(stream())
    assert len(answers) == 4
    assert [e for _, e in answers].count(None) == 1
    errors = [e.message() for _, e in answers if e is not None]
    named = {m.split("]")[0]: m for m in errors if m.startswith("[request id: ")}
    # tritonserver 2.51: "[request id: r1] unexpected shape for input 'image' ...", "Request for unknown
    # model: 'no-such-model' is not found" (its front end's refusal: no id), "[request id: <id_unknown>] ..."
    assert set(named) == {"[request id: r1", "[request id: <id_unknown>"}, errors
    assert named["[request id: r1"].startswith("[request id: r1] input 'image'"), errors
    unnamed = [m for m in errors if m not in named.values()]
    assert len(unnamed) == 1 and unnamed[0].startswith("unknown model 'no-such-model'"), errors
    # the request with no id gets the same error as r1, under Triton's name for no id
    assert named["[request id: <id_unknown>"] == named["[request id: r1"].replace("r1", "<id_unknown>", 1), errors


def test_a_client_polling_through_the_drain_does_not_hold_the_server_to_its_grace(drain_repo):
    # a review found it: each refused call restarted the quiet wait, so a client asking
    # is_server_live every 50 ms kept the server up for the whole --shutdown-timeout (here
    # 20 s; 30 by default, Kubernetes' grace before its SIGKILL)
    import threading
    import time

    import tritonclient.grpc as triton_grpc

    server = ServerProcess(drain_repo, "--shutdown-timeout", "20", log=drain_repo.parent / "poll.log").wait_ready()
    stop = threading.Event()

    def poll() -> None:
        with triton_grpc.InferenceServerClient(server.grpc_url) as client:
            while not stop.is_set():
                try:
                    client.is_server_live(client_timeout=1)
                except InferenceServerException:
                    pass
                time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        time.sleep(0.3)
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) in (0, -signal.SIGTERM), server.log()[-2000:]
        assert time.monotonic() - start < 10, "the polling client held the drain open"
    finally:
        stop.set()
        poller.join(10)
        server.kill()
