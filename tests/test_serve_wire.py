"""`zoo serve` at the wire, as a tester who meant harm (or a slow, careless client) met it:
raw sockets and grpcio against real servers. Each test sends what once broke the server,
asserts the status and the error text, and that the server still serves; where the
finding was a log line or a metric, it asserts those.

One server over a one-model repository, with system shared memory, a 1 MiB request
limit, a 3 s queue delay unless a request brings the 64 rows of a full batch (so a call
can be cancelled while it waits, and every other request is answered at once), and, set
through the environment variables `zoo serve` reads, a 1 s read timeout and at most 16
connections (the defaults, 30 s and 1024, would make the tests slow).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX, ServerProcess, export  # noqa: E402

pytest_plugins = ["serve_support"]
ROWS = 64  # a full batch: answered at once, where one row waits the 3 s queue delay
IMAGE = {"name": "image", "datatype": "FP32", "shape": [ROWS, 1, 8, 8], "data": [0.5] * ROWS * 64}
INFER = f"/v2/models/{ONNX}/infer"
CONNECTIONS = 16  # the server's connection cap
LEAKS = re.compile(r"Traceback|File \"|\b[A-Z]\w*(Error|Exception)\b|<class|/tmp/|site-packages|\.py\b")


@pytest.fixture(scope="module")
def wire(tmp_path_factory) -> ServerProcess:
    repo = tmp_path_factory.mktemp("wire") / "exports"
    export(DIGITS, "onnxruntime", repo)
    with pytest.MonkeyPatch.context() as mp:  # the server process takes the environment it starts with
        mp.setenv("ZOO_SERVE_READ_TIMEOUT", "1")
        mp.setenv("ZOO_SERVE_MAX_CONNECTIONS", str(CONNECTIONS))
        server = ServerProcess(repo, "--max-request-size", str(1 << 20), "--shared-memory", "system",
                               "--max-queue-delay-ms", "3000", "--preferred-batch-sizes", str(ROWS),
                               log=repo.parent / "server.log")
    try:
        yield server.wait_ready()
    finally:
        server.kill()


# ---------------------------------------------------------------- raw HTTP


def request(body: bytes, *headers: str, path: str = INFER, close: bool = True) -> bytes:
    headers = (*headers, "Connection: close") if close else headers
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n" + "".join(h + "\r\n" for h in headers)
    return head.encode("latin-1") + b"\r\n" + body


def infer_body(**extra) -> bytes:
    return json.dumps({"inputs": [IMAGE], **extra}).encode()


def exchange(port: int, data: bytes, timeout: float = 10) -> bytes:
    """Send `data` on a new connection; what comes back until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # a server that refuses may close before all is sent
            sock.sendall(data)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    reply = b""
    with contextlib.suppress(OSError):  # a reset after a refusal: what came before it counts
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def responses(reply: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each response in `reply`, in order."""
    found = []
    while reply:
        head, _, rest = reply.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        length = int(headers[b"content-length"])
        found.append((int(lines[0].split()[1]), rest[:length]))
        reply = rest[length:]
    return found


def error_text(body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc) == {"error"} and not LEAKS.search(doc["error"]), doc
    return doc["error"]


def still_serving(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
    assert httpx.post(f"{server.url}{INFER}", content=infer_body()).status_code == 200


def samples(server: ServerProcess) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def count(found: dict, name: str, **labels: str) -> float:
    return sum(v for (n, have), v in found.items() if n == name and labels.items() <= dict(have).items())


def failed(server: ServerProcess) -> int:
    """The model's `fail` count in the statistics extension."""
    stats = httpx.get(f"{server.url}/v2/models/{ONNX}/stats").json()["model_stats"][0]
    return stats["inference_stats"]["fail"]["count"]


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (result := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return result


# ---------------------------------------------------------------- header size, read time, connections


def test_a_head_over_64_kib_is_refused_with_431_and_one_under_it_is_served(wire):
    big = exchange(wire.port, b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 10) + b"\r\n\r\n")
    [(status, body)] = responses(big)
    assert status == 431 and "65536 bytes" in error_text(body)
    fine = exchange(wire.port, b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " + b"a" * (60 << 10)
                    + b"\r\n\r\n")
    assert [status for status, _ in responses(fine)] == [200]
    still_serving(wire)


def test_stalled_requests_get_408_and_a_silent_connection_is_closed(wire):
    partial_head = b"GET /v2 HTTP/1.1\r\nHost: x\r\n"
    partial_body = request(b"{}", path="/v2/repository/index")[:-1]  # the body's last byte never comes
    sockets = [socket.create_connection(("127.0.0.1", wire.port), timeout=10) for _ in range(3)]
    try:
        sockets[0].sendall(partial_head)
        sockets[1].sendall(partial_body)
        replies = [read_to_close(sock) for sock in sockets]  # closed by the server, or the test times out
    finally:
        for sock in sockets:
            sock.close()
    for reply in replies[:2]:
        [(status, body)] = responses(reply)
        assert status == 408 and "within 1 s of its first byte" in error_text(body)
    assert replies[2] == b""  # nothing sent, nothing answered
    assert httpx.get(f"{wire.url}/v2/health/live").status_code == 200


def test_a_grpc_connection_that_never_finishes_its_handshake_is_closed(wire):
    """gRPC's own default waits 120 s for a connection's HTTP/2 preface; the server takes
    the HTTP front end's read timeout (1 s here), so silent connections do not pile up."""
    host, port = wire.grpc_url.split(":")
    with socket.create_connection((host, int(port)), timeout=15) as silent:
        start = time.monotonic()
        read_to_close(silent)  # the server's SETTINGS frame, then the close; or the 15 s timeout
        waited = time.monotonic() - start
    assert waited < 10, f"the connection was still open after {waited:.0f} s"
    with grpc.insecure_channel(wire.grpc_url) as channel:  # a client that speaks HTTP/2 is served as before
        assert pbg.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=10).live


def test_grpc_connections_over_the_cap_are_closed_and_the_cap_frees_as_they_close(wire):
    """gRPC has a connection cap of its own (ZOO_SERVE_MAX_CONNECTIONS, as HTTP's): one
    connection more is closed as it is accepted, so a client opening connections without
    end cannot take the process's open files; HTTP keeps its own count."""
    def channel() -> grpc.Channel:  # a connection of its own: channels otherwise share one per target
        return grpc.insecure_channel(wire.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)])

    def live(ch: grpc.Channel) -> bool:
        return pbg.GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest(), timeout=10).live

    held = [channel() for _ in range(CONNECTIONS)]
    try:
        assert all(live(ch) for ch in held)  # each channel's connection is up and held
        with channel() as extra:
            with pytest.raises(grpc.RpcError) as refused:
                live(extra)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert httpx.get(f"{wire.url}/v2/health/live").status_code == 200
    finally:
        for ch in held[1:]:
            ch.close()
    try:
        with channel() as another:  # closed connections give their places back
            assert wait_for(lambda: _answers(another))
        assert live(held[0])
    finally:
        held[0].close()


def _answers(ch: grpc.Channel) -> bool:
    try:
        return pbg.GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest(), timeout=2).live
    except grpc.RpcError:
        return False


def test_connections_over_the_cap_are_refused_with_503_at_once(wire):
    held, refused = [], b""
    try:
        while not refused and len(held) <= CONNECTIONS:  # each answered, then idle in keep-alive (5 s)
            held.append(socket.create_connection(("127.0.0.1", wire.port), timeout=10))
            with contextlib.suppress(OSError):
                held[-1].sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = held[-1].recv(65536)
            refused = b"" if reply.startswith(b"HTTP/1.1 200") else reply + read_to_close(held[-1])
        assert refused, f"{len(held)} connections were all served"
        [(status, body)] = responses(refused)
        assert status == 503 and f"{CONNECTIONS} connections open, its limit" in error_text(body)
    finally:
        for sock in held:
            sock.close()
    assert wait_for(lambda: httpx.get(f"{wire.url}/v2/health/live").status_code == 200)
    still_serving(wire)


# ---------------------------------------------------------------- pipelining


@pytest.mark.parametrize(("second", "status"), [
    (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
    (b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n", 431),
    (b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
], ids=["malformed", "head-too-large", "transfer-coding"])
def test_a_refused_pipelined_request_is_answered_after_the_one_before_it(wire, second, status):
    """RFC 9112 section 9.3.2: responses in request order; the refusal used to go out at
    once and close the connection, so the first request's answer never came."""
    reply = responses(exchange(wire.port, request(infer_body(id="first"), close=False) + second))
    assert [s for s, _ in reply] == [200, status], reply
    assert json.loads(reply[0][1])["id"] == "first"
    error_text(reply[1][1])
    still_serving(wire)


def chunked(body: bytes, path: str = INFER) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n".encode()
            + body + b"\r\n0\r\n\r\n")


GZIP_CHUNKED = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"


@pytest.mark.parametrize("third", [b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", request(infer_body(id="third"))],
                         ids=["get", "post"])
def test_nothing_after_a_refusal_in_the_same_read_is_served(wire, third):
    """A chunked body's read is parsed whole: a request after a refused one used to be
    served before the refusal (responses out of order), or, a POST, to wait for a body that
    would never come and hold the connection past every timeout."""
    started = time.monotonic()
    reply = responses(exchange(wire.port, chunked(infer_body(id="first")) + GZIP_CHUNKED + third, timeout=15))
    assert [s for s, _ in reply] == [200, 501], reply
    assert json.loads(reply[0][1])["id"] == "first" and time.monotonic() - started < 5
    still_serving(wire)


def test_the_first_refusal_of_a_connection_is_its_answer(wire):
    """`Transfer-Encoding: gzip` is refused 501, then the parser's own error followed: its
    400, saying a malformed request, replaced the 501 when a response was owed first."""
    second = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc"
    reply = responses(exchange(wire.port, request(infer_body(id="first"), close=False) + second))
    assert [s for s, _ in reply] == [200, 501] and "Transfer-Encoding 'gzip'" in error_text(reply[1][1]), reply


# ---------------------------------------------------------------- client-controlled values


BINARY_HEAD = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [2 ** 62, 0],
                                      "parameters": {"binary_data_size": 0}}]}).encode()


@pytest.mark.parametrize(("data", "words"), [
    (request(infer_body(), "Inference-Header-Content-Length: \xb2"), "must be an integer"),
    (request(infer_body(), "Inference-Header-Content-Length: " + "9" * 5000), "but the body has"),
    (request(json.dumps({"inputs": [{**IMAGE, "shape": [2 ** 62, 0], "data": []}]}).encode()),
     "dimensions larger than any request"),
    (request(BINARY_HEAD, f"Inference-Header-Content-Length: {len(BINARY_HEAD)}"),
     "dimensions larger than any request"),
], ids=["header-length-superscript", "header-length-5000-digits", "huge-empty-shape", "huge-empty-shape-binary"])
def test_values_that_made_500s_are_400s_and_log_nothing(wire, data, words):
    mark = len(wire.log())
    [(status, body)] = responses(exchange(wire.port, data))
    assert status == 400 and words in error_text(body)
    assert "Traceback" not in wire.log()[mark:]
    still_serving(wire)


def test_a_huge_empty_shape_over_grpc_is_invalid_argument(wire):
    message = pb.ModelInferRequest(model_name=ONNX)
    message.inputs.add(name="image", datatype="FP32", shape=[2 ** 62, 0])
    message.raw_input_contents.append(b"")
    with grpc.insecure_channel(wire.grpc_url) as channel, pytest.raises(grpc.RpcError) as refused:
        pbg.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dimensions larger than any request" in refused.value.details()


def test_every_content_encoding_header_is_checked(wire):
    # an inference body may be in one coding (gzip or deflate, as Triton reads it): every
    # header, and every coding one lists, counts
    for headers, named in ((("Content-Encoding: gzip", "Content-Encoding: identity"), "gzip, identity"),
                           (("Content-Encoding: identity, gzip",), "identity, gzip")):
        [(status, body)] = responses(exchange(wire.port, request(gzip.compress(infer_body()), *headers)))
        assert status == 415 and f"Content-Encoding '{named}'" in error_text(body)


def test_a_transfer_coding_other_than_chunked_is_501(wire):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(infer_body()), infer_body())
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".encode()
    [(status, body)] = responses(exchange(wire.port, head + chunked))
    assert status == 501 and "Transfer-Encoding 'gzip'" in error_text(body)
    still_serving(wire)


# ---------------------------------------------------------------- shared memory


def peak_memory(server: ServerProcess) -> int:
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) << 10


def test_a_shared_memory_input_larger_than_the_model_takes_is_refused_unread(wire):
    """A sparse region costs its client nothing; a copy of it cost the server its size
    (1 GiB for one request) before the shape was checked."""
    size, name, key = 256 << 20, "sparse", f"/zoo_wire_{uuid.uuid4().hex}"
    fd = os.open(f"/dev/shm/{key[1:]}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    shm = f"{wire.url}/v2/systemsharedmemory/region/{name}"
    try:
        os.ftruncate(fd, size)
        assert httpx.post(f"{shm}/register", json={"key": key, "offset": 0, "byte_size": size}).status_code == 200
        before = peak_memory(wire)

        def infer(rows: int) -> httpx.Response:
            image = {**{k: v for k, v in IMAGE.items() if k != "data"}, "shape": [rows, 1, 8, 8],
                     "parameters": {"shared_memory_region": name, "shared_memory_byte_size": rows * 256}}
            return httpx.post(f"{wire.url}{INFER}", json={"inputs": [image]}, timeout=60)

        refused = infer(size // 256)
        assert refused.status_code == 400, refused.text
        assert peak_memory(wire) - before < 64 << 20
        assert "at most [64, 1, 8, 8]" in error_text(refused.content)
        assert infer(ROWS).status_code == 200  # the largest batch the model takes is still read
    finally:
        httpx.post(f"{shm}/unregister")
        os.close(fd)
        os.unlink(f"/dev/shm/{key[1:]}")


# ---------------------------------------------------------------- clients that go away


def test_a_client_gone_mid_body_is_counted_as_disconnected_not_as_an_internal_error(wire):
    mark, before = len(wire.log()), samples(wire)
    body = infer_body()
    with socket.create_connection(("127.0.0.1", wire.port)) as sock:
        sock.sendall(request(body)[:-10])
        time.sleep(0.2)  # the application is reading the body

    def counted():
        after = samples(wire)
        return after if count(after, "zoo_inference_failures_total", reason="disconnected") > \
            count(before, "zoo_inference_failures_total", reason="disconnected") else None

    after = wait_for(counted)
    assert after, "the disconnect was not counted"
    assert count(after, "zoo_inference_failures_total", reason="internal") == \
        count(before, "zoo_inference_failures_total", reason="internal")
    assert count(after, "zoo_inference_failures_total", model=ONNX) == failed(wire)  # metrics and statistics agree
    log = wire.log()[mark:]
    assert "Traceback" not in log and "internal error" not in log, log
    still_serving(wire)


def infer_message(request_id: str = "", rows: int = 1) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=ONNX, id=request_id)
    message.inputs.add(name="image", datatype="FP32", shape=[rows, 1, 8, 8])
    message.raw_input_contents.append(np.zeros((rows, 1, 8, 8), np.float32).tobytes())
    return message


def test_cancelled_grpc_calls_are_counted_as_failures(wire):
    """A call the client cancels, or whose deadline passes, while it waits in the queue (3 s
    here) used to be counted as a request but never as a success or a failure."""
    before, failed_before = samples(wire), failed(wire)
    hold = threading.Event()

    def stream_requests():
        yield infer_message("a")
        yield infer_message("b")
        hold.wait(10)  # the stream stays open until the test is done with it

    with grpc.insecure_channel(wire.grpc_url) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        cancelled = stub.ModelInfer.future(infer_message())
        stream = stub.ModelStreamInfer(stream_requests())
        with pytest.raises(grpc.RpcError) as late:
            stub.ModelInfer(infer_message(), timeout=0.5)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        cancelled.cancel()
        stream.cancel()
        hold.set()

    def delta(name: str, **labels: str) -> float:
        return count(samples(wire), name, **labels) - count(before, name, **labels)

    assert wait_for(lambda: delta("zoo_inference_failures_total", reason="cancelled") == 4), samples(wire)
    assert delta("zoo_inference_requests_total") == 4
    assert failed(wire) - failed_before == 4  # the statistics extension agrees
    assert delta("zoo_grpc_responses_total", method="ModelInfer", code="CANCELLED") == 1
    assert delta("zoo_grpc_responses_total", method="ModelInfer", code="DEADLINE_EXCEEDED") == 1
    assert delta("zoo_grpc_responses_total", method="ModelStreamInfer", code="CANCELLED") == 2


def test_an_undecodable_grpc_message_is_invalid_argument_without_a_class_name(wire):
    with grpc.insecure_channel(wire.grpc_url) as channel:
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            raw(b"\xff\xff\xff\xff", timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid ModelInferRequest message" in refused.value.details()
        assert not LEAKS.search(refused.value.details())
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                       response_deserializer=pb.ModelStreamInferResponse.FromString)
        answers = list(stream(iter([b"\xff\xff\xff\xff", infer_message("ok", ROWS).SerializeToString()]), timeout=10))
        assert sorted((a.infer_response.id, a.error_message) for a in answers) == [
            ("", "the request is not a valid ModelInferRequest message"), ("ok", "")]


# ---------------------------------------------------------------- pipelined floods, refused bodies


def resident(server: ServerProcess) -> int:
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) << 10


def flood(port: int, one: bytes, seconds: float) -> socket.socket:
    """A connection that sends `one` over and over for `seconds` and reads nothing (a
    receive buffer of 4 KiB: the server's answers back up at once); returned open."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(0.2)
    burst, deadline = one * max(1, (64 << 10) // len(one)), time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(socket.timeout):
            sock.sendall(burst)
    return sock


def test_pipelined_requests_sent_without_reading_the_answers_are_parsed_a_few_at_a_time(wire):
    """uvicorn parsed every request of each read and read again after each answer: one
    connection sending health checks without reading the answers had the server hold
    about 150 MB (tens of thousands of parsed requests); 8 such connections, 2.5 GB."""
    before = resident(wire)
    sock = flood(wire.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", 3)
    try:
        grown = resident(wire) - before
    finally:
        sock.close()
    assert grown < 24 << 20, f"the server grew by {grown >> 20} MB"
    still_serving(wire)


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_body_over_the_limit_is_answered_413_and_the_connection_ends(wire, framing):
    """The 413 went out and the server went on reading the body to drop it (7.7 GB in 20 s
    from one client) until the read timeout closed the connection; now the end of the
    answer is the end of the connection (its sender reads end of file at once)."""
    size = (1 << 20) + 1
    head = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\n" + ("Transfer-Encoding: chunked\r\n\r\n" if framing == "chunked"
                                                      else f"Content-Length: {64 * size}\r\n\r\n")).encode()
    piece = b"10000\r\n" + b"0" * 0x10000 + b"\r\n" if framing == "chunked" else b"0" * 0x10000
    with socket.create_connection(("127.0.0.1", wire.port), timeout=10) as sock:
        sock.sendall(head)
        stop = threading.Event()

        def keep_sending():
            with contextlib.suppress(OSError):
                while not stop.is_set():
                    sock.sendall(piece)

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        try:
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
                reply += sock.recv(65536)
            answered = time.monotonic()
            sock.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                while sock.recv(65536):
                    pass
            ended = time.monotonic() - answered
        finally:
            stop.set()
    [(status, body)] = responses(reply)
    assert status == 413 and "exceeds the limit of 1048576 bytes" in error_text(body)
    assert b"\r\nconnection: close\r\n" in reply.lower()  # said, as RFC 9112 section 9.6 asks
    assert ended < 0.5, f"the connection ended {ended:.2f} s after the answer"
    still_serving(wire)


# ---------------------------------------------------------------- answers that cannot be sent, words


def test_an_output_json_cannot_carry_fails_the_request_in_the_statistics_too(wire):
    """A NaN output asked for as JSON is answered 400, and was counted a success (statistics,
    `zoo_inference_failures_total`) since the answer was encoded after the count."""
    nan = np.full((ROWS, 1, 8, 8), np.nan, np.float32).tobytes()
    head = json.dumps({"inputs": [{**{k: v for k, v in IMAGE.items() if k != "data"},
                                   "parameters": {"binary_data_size": len(nan)}}]}).encode()
    stats = f"{wire.url}/v2/models/{ONNX}/stats"
    before, tallies = httpx.get(stats).json()["model_stats"][0]["inference_stats"], samples(wire)
    answer = httpx.post(f"{wire.url}{INFER}", content=head + nan,
                        headers={"Inference-Header-Content-Length": str(len(head))})
    assert answer.status_code == 400 and "holds NaN or infinity" in error_text(answer.content)
    after = httpx.get(stats).json()["model_stats"][0]["inference_stats"]
    assert after["success"]["count"] == before["success"]["count"]
    assert after["fail"]["count"] == before["fail"]["count"] + 1
    assert count(samples(wire), "zoo_inference_failures_total", model=ONNX, reason="bad_request") == \
        count(tallies, "zoo_inference_failures_total", model=ONNX, reason="bad_request") + 1


def test_a_version_that_is_not_a_number_is_named_in_its_404(wire):
    answer = httpx.get(f"{wire.url}/v2/models/{ONNX}/versions/abc/ready")
    assert answer.status_code == 404
    assert error_text(answer.content) == (f"no endpoint for version 'abc' of model '{ONNX}': a model version in a URL "
                                          f"is its number (digits), as in versions/1")


def test_a_number_beyond_fp32_is_refused_without_a_warning_in_the_log(wire):
    mark = len(wire.log())
    body = json.dumps({"inputs": [{**IMAGE, "data": [1e39] + IMAGE["data"][1:]}]}).encode()
    answer = httpx.post(f"{wire.url}{INFER}", content=body)
    assert answer.status_code == 400 and "outside the range of FP32" in error_text(answer.content)
    time.sleep(0.2)
    assert "Warning" not in wire.log()[mark:], wire.log()[mark:]
