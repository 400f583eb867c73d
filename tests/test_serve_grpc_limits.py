"""`zoo serve`'s gRPC front end at its limits, through real clients (grpc.aio, the stub
generated from Triton's `grpc_service.proto`, tritonclient) against a real server:

- a ModelStreamInfer client that writes and does not read: the server stops reading the
  stream while `--max-queue-size` answers are unsent, and reading resumes as the client
  reads (it read every request and held an answer for each: 3000 unread requests cost the
  server about 100 MB);
- a message over `--max-request-size`: refused in the words HTTP refuses a body over it
  and counted, plain or compressed (grpc core refused it in its own words, uncounted);
- `--host localhost`: gRPC listens where HTTP does (grpc core listened on [::1] too where
  the name resolves to 127.0.0.1 alone, and HTTP only there).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from typing import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

import zoo

pytest.register_assert_rewrite("serve_support")
from serve_support import ONNX, ServerProcess  # noqa: E402

pytest_plugins = ["serve_support"]
QUEUE = 16  # the own server's --max-queue-size: the answers a stream may hold unsent
LIMIT = 1 << 20  # the shared server's --max-request-size


def metric(server, family: str, **labels: str) -> float:
    """The sum of `family`'s samples whose labels include `labels`, from /metrics."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        name, _, rest = line.partition("{")
        if name == family and all(w in rest for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def infer_message(rows: int, request_id: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=ONNX, id=request_id)
    message.inputs.add(name="image", datatype="FP32", shape=[rows, 1, 8, 8])
    message.raw_input_contents.append(np.linspace(0, 1, rows * 64, dtype=np.float32).tobytes())
    return message


@pytest.fixture(scope="module")
def own_server(serve_repo, tmp_path_factory) -> Iterator[ServerProcess]:
    """One artifact, `--max-queue-size 16` (so a stream holds at most 16 answers unsent), on
    `--host localhost`."""
    repo = tmp_path_factory.mktemp("grpc-limits") / "exports"
    shutil.copytree(serve_repo / ONNX, repo / ONNX)
    proc = ServerProcess(repo, "--host", "localhost", "--max-queue-size", str(QUEUE), log=repo.parent / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


# ---------------------------------------------------------------- a stream the client does not read

#: rows per request: each answer holds 64 x 10 FP32 logits (2560 bytes), so the client's
#: HTTP/2 window (64 KiB: its growth by bandwidth probing is turned off) takes a known few
ROWS, WINDOW, ANSWER_BYTES = 64, 1 << 16, 64 * 10 * 4
REQUESTS = 400


def test_a_stream_is_not_read_while_its_answers_are_not_read(own_server, serve_repo):
    """The server reads at most QUEUE requests more than grpc has sent answers for, and grpc
    sends only what the client's flow-control window takes; once the client reads, every
    request is answered, in order, none refused for a full queue."""
    expected = zoo.load(serve_repo / ONNX, threads=1)({"image": np.frombuffer(
        infer_message(ROWS).raw_input_contents[0], np.float32).reshape(ROWS, 1, 8, 8)})["logits"]
    before = metric(own_server, "zoo_inference_requests_total", model=ONNX)
    bound = QUEUE + 2 * (WINDOW // ANSWER_BYTES + 1)  # a window of answers sent, and as many again of slack

    def taken() -> float:
        return metric(own_server, "zoo_inference_requests_total", model=ONNX) - before

    async def stream() -> tuple[float, list[pb.ModelStreamInferResponse]]:
        options = [("grpc.http2.bdp_probe", 0)]  # the window stays 64 KiB
        async with grpc.aio.insecure_channel(own_server.grpc_url, options=options) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            call = stub.ModelStreamInfer(infer_message(ROWS, str(k)) for k in range(REQUESTS))
            seen, since, deadline = 0.0, time.monotonic(), time.monotonic() + 60
            while seen <= bound and time.monotonic() < deadline:  # until the server has stopped reading
                await asyncio.sleep(0.25)
                now = await asyncio.to_thread(taken)
                if now != seen or not now:
                    seen, since = now, time.monotonic()
                elif time.monotonic() - since > 1.5:
                    break
            return seen, [answer async for answer in call]

    held, answers = asyncio.run(stream())
    assert held <= bound, f"the server read {held:.0f} requests of a stream whose answers were not read"
    assert [a.error_message for a in answers if a.error_message] == []
    # every request answered once (a stream answers each as it completes: with more than one instance, out of order)
    assert sorted(a.infer_response.id for a in answers) == sorted(str(k) for k in range(REQUESTS))
    for answer in answers:
        got = np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert taken() == REQUESTS


# ---------------------------------------------------------------- a message over the size limit


@pytest.mark.parametrize("compression", [None, grpc.Compression.Gzip], ids=["plain", "gzip"])
def test_a_message_over_the_limit_gets_https_words_and_is_counted(server, compression):
    """RESOURCE_EXHAUSTED with the words HTTP answers a body of that size with (the limit is
    on the message decompressed, as on an HTTP body), counted among the method's answers and
    as a failed request of the model, unary or streamed; the server serves on."""
    message = infer_message(4200)  # 4200 x 256 bytes of pixels: just over the 1 MiB limit
    size = len(message.SerializeToString())
    assert LIMIT < size < 2 * LIMIT
    http = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=b"x" * size, timeout=30)
    words = http.json()["error"]
    assert (http.status_code, words) == (413, f"the request body ({size} bytes) exceeds the limit of {LIMIT} bytes")
    counts = {"unary": ("zoo_grpc_responses_total", {"method": "ModelInfer", "code": "RESOURCE_EXHAUSTED"}),
              "stream": ("zoo_grpc_responses_total", {"method": "ModelStreamInfer", "code": "RESOURCE_EXHAUSTED"}),
              "failed": ("zoo_inference_failures_total", {"model": ONNX, "reason": "bad_request"}),
              "requests": ("zoo_inference_requests_total", {"model": ONNX})}
    before = {key: metric(server, family, **labels) for key, (family, labels) in counts.items()}
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(message, timeout=30, compression=compression)
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, words)
        answers = list(stub.ModelStreamInfer(iter([message, infer_message(1, "small")]), timeout=30,
                                             compression=compression))
        assert sorted((a.error_message, a.infer_response.id) for a in answers) == [("", "small"), (words, "")]
        assert stub.ServerLive(pb.ServerLiveRequest()).live
    after = {key: metric(server, family, **labels) for key, (family, labels) in counts.items()}
    assert {key: after[key] - before[key] for key in counts} == {"unary": 1, "stream": 1, "failed": 2, "requests": 3}


# ---------------------------------------------------------------- where gRPC listens


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def http_answers(address: str, port: int) -> bool:
    try:
        return httpx.get(f"http://{address}:{port}/v2/health/live", timeout=10).status_code == 200
    except httpx.ConnectError:
        return False


def grpc_answers(address: str, port: int) -> bool:
    with triton_grpc.InferenceServerClient(f"{address}:{port}") as client:
        try:
            return client.is_server_live(client_timeout=10)
        except InferenceServerException:
            return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_grpc_listens_on_the_addresses_http_listens_on(own_server):
    """`--host localhost`: each front end answers on the loopback addresses the name resolves
    to here, and on no other (here 127.0.0.1 alone where /etc/hosts has no `::1 localhost`)."""
    resolved = {info[4][0] for info in socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)}
    for address, bracketed in (("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")):
        http, grpc_ = http_answers(bracketed, own_server.port), grpc_answers(bracketed, own_server.grpc_port)
        assert (http, grpc_) == ((address in resolved,) * 2), (address, resolved, http, grpc_)
