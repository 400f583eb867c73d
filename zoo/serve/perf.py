"""`zoo bench MODEL --url URL`: requests/s and latency percentiles of a running server at
several concurrencies, as Triton's `perf_analyzer --concurrency-range` reports them.

Each of `c` concurrent clients sends its next request as soon as the previous answer
arrives (closed loop), for a fixed time, cycling through distinct pre-encoded requests.
Over HTTP (`http://HOST:PORT`) each client keeps one HTTP/1.1 keep-alive connection, a few
lines over asyncio streams rather than a general HTTP library, so that on a small machine
the load generator takes as little CPU from the server as it can. Over gRPC
(`grpc://HOST:PORT`, the server's gRPC port) the `c` clients share one `grpc.aio` channel,
as tritonclient's asyncio client does, and send pre-serialized `ModelInferRequest` bytes
(tensors in `raw_input_contents`, as tritonclient sends them) through a method with no
serializer: neither transport spends client CPU building messages during the run. With
`streaming=True` (perf_analyzer's `--streaming`) each gRPC client holds one ModelStreamInfer
stream instead and writes its next request when the answer to the last one is read: the
per-call work of a unary RPC (a new HTTP/2 stream, headers and status each way) is paid
once per client.

Request inputs come from the model's own `sample` when its plugin is installed here;
otherwise they are made from the server's metadata (`synthesize`): dynamic dimensions at
the `opt` size of the model's axes, the batch axis at the rows asked for, values in each
input's declared range.

With `shared_memory=True` (system shared memory, a same-host server) each client creates
its own input and output POSIX regions (tritonclient's `create_shared_memory_region`),
writes its request's inputs into them once, registers them with the server, and sends
requests that only name the regions; every region is unregistered and destroyed at the
end, whatever happens.

The server's own view comes from its HTTP `/metrics` (for a gRPC URL, `metrics_url`)
scraped before and after each point: mean time in the server, in the queue and in the
model (the runner call of the request's batch), and the mean batch size. Overhead =
server time - queue time - model time: what the server adds per request (transport,
decoding, validation, batching, encoding).

As perf_analyzer, a refused request is an error, never throughput or latency. A server
that goes away during a point (it closes the connection, or stops answering /metrics)
fails that point with the reason, and the sweep ends there with the points measured
before it; Ctrl-C raises `Interrupted` with them (the matrix's, `zoo.bench.matrix`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from ..errors import ZooError
from . import datatypes as dt
from .protocol import _v2_of, encode_request

SERVER_HISTOGRAMS = {"request": "zoo_inference_request_duration_seconds",
                     "queue": "zoo_inference_queue_duration_seconds",
                     "compute": "zoo_inference_compute_duration_seconds", "batch": "zoo_inference_batch_size"}
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
#: gRPC channel options: no message size limit either way
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
SHM = "/v2/systemsharedmemory"
#: a float input's `value_range` wider than this is not drawn from uniformly: it bounds what is
#: valid (a policy's unbounded observation takes float32's finite range), and values near 3e38
#: overflow the model; such inputs are drawn from a standard normal, clipped to the range
WIDEST_DRAW = 1e6


@dataclass(frozen=True)
class Target:
    """Where the load goes (`protocol`, `host`, `port`) and the server's HTTP base URL
    (metadata, /metrics, shared memory registration over HTTP)."""

    url: str
    protocol: str  # "http" or "grpc"
    host: str
    port: int
    http: str  # http://HOST:PORT
    streaming: bool = False  # gRPC: each client's requests over one ModelStreamInfer stream

    @property
    def grpc(self) -> str:
        """HOST:PORT, as grpc and tritonclient.grpc take it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def target(url: str, metrics_url: str | None = None) -> Target:
    """The load's target from `--url` (http://HOST:PORT or grpc://HOST:PORT) and `--metrics-url`
    (the server's HTTP address; required with grpc://)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "grpc") or not parts.hostname:
        raise ZooError(f"--url must be http://HOST:PORT or grpc://HOST:PORT (the server's gRPC port), got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ZooError(f"--url {url!r} has an invalid port") from None
    if parts.scheme == "grpc" and port is None:
        raise ZooError(f"--url {url!r} needs the gRPC port: grpc://HOST:PORT")
    if metrics_url is None:
        if parts.scheme == "grpc":
            raise ZooError(f"--url {url} is gRPC; the server's own view (/metrics) and the model's zoo metadata come "
                           "from its HTTP port: give --metrics-url http://HOST:PORT")
        http = f"http://{parts.netloc}"
    else:
        m = urlsplit(metrics_url if "://" in metrics_url else f"http://{metrics_url}")
        if m.scheme != "http" or not m.hostname:
            raise ZooError(f"--metrics-url must be the server's HTTP address, http://HOST:PORT, got {metrics_url!r}")
        http = f"http://{m.netloc}"
    return Target(url, parts.scheme, parts.hostname, port or 80, http)


def sweep(url: str, served: str, model: str, concurrencies: Sequence[int], batch_sizes: Sequence[int] = (1,),
          duration: float = 5.0, binary: bool = True, warmup: float = 0.5, distinct: int = 64,
          metrics_url: str | None = None, shared_memory: bool = False, streaming: bool = False) -> dict[str, Any]:
    """Closed-loop load at each concurrency (and rows per request); a JSON-able report.

    `url` is http://HOST:PORT or grpc://HOST:PORT (then `metrics_url`, the server's HTTP
    address, is required); `shared_memory` sends every tensor through system shared memory;
    `streaming` (gRPC) sends each client's requests over one ModelStreamInfer stream."""
    where = target(url, metrics_url)
    if not binary and (where.protocol == "grpc" or shared_memory):
        raise ZooError("JSON tensors (--json-data) are for HTTP without shared memory: gRPC carries raw tensors, and "
                       "with --shared-memory no tensor travels in the request")
    if streaming and where.protocol != "grpc":
        raise ZooError("--streaming is gRPC's ModelStreamInfer: give the server's grpc://HOST:PORT")
    where = dataclasses.replace(where, streaming=streaming)
    meta, info = model_metadata(where, served)
    name = meta["name"]
    make = request_maker(meta, info, model)
    results: list[dict[str, Any]] = []

    def report() -> dict[str, Any]:
        return {"url": url, "metrics_url": where.http, "model": name, "protocol": where.protocol,
                "streaming": streaming, "shared_memory": shared_memory, "batching": info.get("batching"),
                "binary": binary if where.protocol == "http" and not shared_memory else None,
                "duration_s": duration, "results": results}

    try:
        for batch in batch_sizes:
            count = max(concurrencies) if shared_memory else distinct
            with _batch_requests(where, meta, info, make, batch, count, binary, shared_memory) as (payloads, own):
                for c in concurrencies:
                    results.append(_point(where, name, payloads, own, c, batch, duration, warmup))
                    if results[-1]["failed"]:  # the server is gone: every later point would fail the same way
                        return report()
    except KeyboardInterrupt:  # Ctrl-C: the points that finished are kept, as the matrix keeps its rows
        from ..bench.matrix import Interrupted

        raise Interrupted(report()) from None
    return report()


@contextlib.contextmanager
def _batch_requests(where: Target, meta: Mapping[str, Any], info: Mapping[str, Any], make, batch: int, count: int,
                    binary: bool, shared_memory: bool) -> Iterator[tuple[list | None, list | None]]:
    """(payloads shared by every client, None) or, with `shared_memory`, (None, each client's
    own request naming its regions): `count` requests of `batch` rows, built before the load."""
    datatypes = {t["name"]: t["datatype"] for t in meta["inputs"]}
    rng = np.random.default_rng(0)
    samples = [make(batch, rng) for _ in range(count)]
    if shared_memory:
        with shared_memory_requests(where, meta["name"], meta, info, samples, datatypes, batch) as own:
            yield None, own
        return
    if where.protocol == "grpc":
        payloads = [grpc_request(meta["name"], x, datatypes) for x in samples]
    else:
        payloads = [encode_request(x, binary=binary, datatypes=datatypes) for x in samples]
    del samples
    yield payloads, None


def _point(where: Target, name: str, payloads: list | None, own: list | None, c: int, batch: int, duration: float,
           warmup: float) -> dict[str, Any]:
    """One concurrency: as perf_analyzer, a failed request counts as an error only, never in
    throughput or latency (an error answered at once would look like speed), and the first
    error's reason is kept so that the report says why. `failed`: why the point itself
    failed (the server closed the connection, or stopped answering), else None."""
    reasons: list[str] = []
    lost: list[str] = []
    latencies, errors, elapsed, server = asyncio.run(_measure(where, name, payloads, own, c, duration, warmup,
                                                              reasons, lost))
    ms = np.asarray(latencies) * 1e3
    return {"concurrency": c, "batch": batch, "requests": len(latencies), "errors": errors,
            "first_error": reasons[0] if reasons else None, "failed": lost[0] if lost else None,
            "requests_per_s": len(latencies) / elapsed, "samples_per_s": len(latencies) * batch / elapsed,
            "p50_ms": float(np.percentile(ms, 50)) if ms.size else None,
            "p90_ms": float(np.percentile(ms, 90)) if ms.size else None,
            "p99_ms": float(np.percentile(ms, 99)) if ms.size else None, "server": server}


async def _measure(where: Target, name: str, payloads: list | None, own: list | None, c: int, duration: float,
                   warmup: float, reasons: list[str], lost: list[str]) -> tuple[list[float], int, float, dict]:
    """Warm-up, then the measured run between two scrapes of /metrics; `reasons` gets the
    measured run's first error, `lost` why the server went away, if it did."""
    if where.protocol == "http":
        path = f"/v2/models/{name}/infer"

        async def run(seconds: float, why: list[str], gone: list[str]) -> tuple[list[float], int, float]:
            return await closed_loop(where.host, where.port, path, payloads or [], c, seconds, own=own, reasons=why,
                                     lost=gone)

        return await _timed(run, where, name, warmup, duration, reasons, lost)
    import grpc

    async with grpc.aio.insecure_channel(where.grpc, options=CHANNEL_OPTIONS) as channel:
        async def run(seconds: float, why: list[str], gone: list[str]) -> tuple[list[float], int, float]:
            # a gRPC client sees a server gone only as UNAVAILABLE answers: `_timed` tells from /metrics
            return await grpc_closed_loop(channel, payloads or [], c, seconds, own=own, reasons=why,
                                          streaming=where.streaming)

        return await _timed(run, where, name, warmup, duration, reasons, lost)


async def _timed(run, where: Target, name: str, warmup: float, duration: float, reasons: list[str], lost: list[str]):
    """A server that does not answer its /metrics after the run (gRPC's clients see it only
    as UNAVAILABLE answers) has gone away: the point failed, as one whose connection the
    server closed."""
    if warmup > 0:
        await run(warmup, [], [])
    before = await asyncio.to_thread(_scrape, where.http, name)
    latencies, errors, elapsed = await run(duration, reasons, lost)
    after = await asyncio.to_thread(_scrape, where.http, name)
    if (before is None or after is None) and not lost:
        lost.append(f"the server stopped answering at {where.http}")
    return latencies, errors, elapsed, _server_view(before or {}, after or {})


# ---------------------------------------------------------------- the model's metadata and inputs


def model_metadata(where: Target, served: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Open Inference Protocol metadata over the load's own protocol, shapes as ints; the
    `zoo` block of the HTTP metadata, {} when the server has none, as Triton)."""
    http_meta = _http_metadata(where, served)
    if where.protocol == "http":
        meta = http_meta
    else:
        from tritonclient.grpc import InferenceServerClient
        from tritonclient.utils import InferenceServerException

        client = InferenceServerClient(where.grpc)
        try:
            meta = client.get_model_metadata(served, as_json=True)
        except InferenceServerException as exc:
            raise ZooError(f"server at {where.url}: {exc.message()}") from None
        finally:
            client.close()
    for t in (*meta.get("inputs", ()), *meta.get("outputs", ())):
        t["shape"] = [int(d) for d in t.get("shape", ())]  # protobuf's JSON writes int64 as strings
    return meta, http_meta.get("zoo") or {}


def most_rows(where: Target, served: str) -> int | None:
    """The most rows one request to `served` may carry: its config's `max_batch_size`
    (Triton's; zoo serves the same), else the max of the batch axis in the zoo metadata;
    None when neither says (a model that does not batch, a server that does not answer:
    the sweep then reports what the server says)."""
    with contextlib.suppress(httpx.HTTPError, ValueError, TypeError):
        config = httpx.get(f"{where.http}/v2/models/{served}/config", timeout=30).json()
        if isinstance(config, dict) and isinstance(config.get("max_batch_size"), int) and config["max_batch_size"] > 0:
            return config["max_batch_size"]
        axis = ((_http_metadata(where, served).get("zoo") or {}).get("axes") or {}).get("batch")
        return int(axis[2]) if axis else None
    return None


def _http_metadata(where: Target, served: str) -> dict[str, Any]:
    try:
        meta = httpx.get(f"{where.http}/v2/models/{served}", timeout=30).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ZooError(f"no answer from {where.http}: {exc}") from None
    if not isinstance(meta, dict) or "error" in meta:
        raise ZooError(f"server at {where.http}: {meta.get('error') if isinstance(meta, dict) else meta}")
    return meta


def request_maker(meta: Mapping[str, Any], info: Mapping[str, Any], model: str):
    """`make(rows, rng)` -> one request's inputs: the model's own `sample` when its plugin is
    registered here, else `synthesize` from the server's metadata."""
    from ..registry import find_model

    spec = find_model(info.get("model", model))
    if spec is not None:
        return spec.configure(**info.get("config", {})).sample
    return lambda rows, rng: synthesize(meta, info, rows, rng)


def synthesize(meta: Mapping[str, Any], info: Mapping[str, Any], rows: int,
               rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One request's inputs from the server's metadata alone (no plugin): dynamic dimensions
    filled from the `zoo.axes` block (the batch axis with `rows`, the others at their opt
    size), each input's datatype, values uniform in `zoo.value_ranges` (integers inclusive),
    else standard normal (floats) or 0 and 1 (integers)."""
    axes = info.get("axes") or {}
    ranges = info.get("value_ranges") or {}
    inputs = {}
    for t in meta["inputs"]:
        name, datatype = t["name"], t["datatype"]
        if datatype == "BYTES":
            raise ZooError(f"input {name!r} is BYTES (raw items): this machine cannot make them without the model's "
                           f"plugin ({info.get('model', meta['name'])}); install it, or measure a model with tensor "
                           "inputs")
        shape = _fill(t["shape"], axes, rows, f"input {name!r}")
        inputs[name] = _values(datatype, shape, ranges.get(name), rng)
    return inputs


def _fill(dims: Sequence[int], axes: Mapping[str, Sequence[int]], rows: int, where: str,
          dynamic_ok: bool = True) -> tuple[int, ...]:
    """`dims` with -1 replaced: a leading -1 is the batch axis (when the model has one, or
    no axes are known), the others the model's other axes at their opt size, in order."""
    shape = list(dims)
    if shape and shape[0] == -1 and ("batch" in axes or not axes):
        shape[0] = rows
    dynamic = [i for i, d in enumerate(shape) if d < 0]
    if not dynamic:
        return tuple(shape)
    if not dynamic_ok:
        raise ZooError(f"{where} has a dynamic dimension besides the batch axis ({list(dims)}), so its size is not "
                       "known before the answer and cannot be given a shared memory region; measure this model "
                       "without --shared-memory")
    others = [(k, v) for k, v in axes.items() if k != "batch"]
    opts = [int(v[1]) for _, v in others]
    if len(opts) == len(dynamic):
        fill = opts
    elif opts and len(set(opts)) == 1:
        fill = [opts[0]] * len(dynamic)
    else:
        known = ", ".join(f"{k} {list(v)}" for k, v in others) or "none in the server's metadata"
        raise ZooError(f"{where}: cannot tell which axis each dynamic dimension of {list(dims)} is (axes: {known}); "
                       "install the model's plugin on this machine to use its own samples")
    for i, n in zip(dynamic, fill):
        shape[i] = n
    return tuple(shape)


def _values(datatype: str, shape: tuple[int, ...], value_range: Sequence[float] | None,
            rng: np.random.Generator) -> np.ndarray:
    dtype = dt.numpy_of(datatype)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if datatype in dt.INTEGER:
        low, high = (math.ceil(value_range[0]), math.floor(value_range[1])) if value_range else (0, 1)
        return rng.integers(low, high, shape, endpoint=True).astype(dtype)
    if value_range and value_range[1] - value_range[0] <= WIDEST_DRAW:
        return rng.uniform(value_range[0], value_range[1], shape).astype(dtype)
    normal = rng.standard_normal(shape)  # a range that only bounds validity (float32's own): not a distribution
    if not value_range:
        return normal.astype(dtype)
    low, high = value_range  # about the range's point nearest 0, reflected at its ends (clipped, a range
    drawn = normal + min(max(0.0, low), high)  # with 0 at an end was half that end, one excluding 0 all of it)
    drawn = np.where(drawn < low, 2 * low - drawn, np.where(drawn > high, 2 * high - drawn, drawn))
    return np.clip(drawn, low, high).astype(dtype)


def _inputs(inputs: Mapping[str, Any], datatypes: Mapping[str, str]) -> list[tuple[str, str, list[int], bytes]]:
    """(name, datatype, shape, raw bytes) of each input, in the wire layout."""
    out = []
    for name, value in inputs.items():
        array = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
        datatype = datatypes.get(name) or ("BYTES" if array.dtype == object else _v2_of(array.dtype))
        if datatype == "BYTES" and array.dtype != object:
            array = array.astype(object)
        out.append((name, datatype, list(array.shape), dt.to_bytes(datatype, array)))
    return out


# ---------------------------------------------------------------- gRPC


def grpc_request(served: str, inputs: Mapping[str, Any], datatypes: Mapping[str, str]) -> bytes:
    """A serialized ModelInferRequest with every input in raw_input_contents (as tritonclient
    sends them) and no requested outputs (every output comes back)."""
    from tritonclient.grpc import service_pb2 as pb

    message = pb.ModelInferRequest(model_name=served)
    for name, datatype, shape, raw in _inputs(inputs, datatypes):
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(raw)
    return message.SerializeToString()


async def grpc_closed_loop(channel, messages: list[bytes], concurrency: int, duration: float,
                           statuses: Counter | None = None, own: Sequence[list[bytes]] | None = None,
                           reasons: list[str] | None = None, streaming: bool = False) -> tuple[list[float], int, float]:
    """`concurrency` clients sharing `channel` (grpc.aio) in a closed loop over serialized
    ModelInferRequest `messages` (client k over `own[k]` instead, when given) for
    `duration` s: the latencies of the OK answers, how many were not OK, the seconds taken;
    `statuses` counts answers by (message index, status code name); `reasons` gets the
    first error's status and message. `streaming`: each client over a ModelStreamInfer
    stream of its own (`_grpc_streamer`) instead of unary calls."""
    if streaming:
        stream = channel.stream_stream(STREAM_INFER, request_serializer=None, response_deserializer=None)
        client, make = _grpc_streamer, lambda: stream()
    else:
        call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
        client, make = _grpc_client, lambda: call
    latencies: list[float] = []
    errors = [0]
    statuses = Counter() if statuses is None else statuses
    start = time.perf_counter()
    stop_at = start + duration
    await asyncio.gather(*(client(make(), own[k] if own else messages, k, stop_at, latencies, errors, statuses,
                                  [] if reasons is None else reasons) for k in range(concurrency)))
    return latencies, errors[0], time.perf_counter() - start


async def _grpc_client(call, messages: list[bytes], k: int, stop_at: float, latencies: list[float],
                       errors: list[int], statuses: Counter, reasons: list[str]) -> None:
    import grpc

    i = k * 7  # clients start at different requests
    while time.perf_counter() < stop_at:
        index = i % len(messages)
        i += 1
        sent = time.perf_counter()
        try:
            await call(messages[index])
            code, detail = "OK", ""
        except grpc.aio.AioRpcError as exc:
            code, detail = exc.code().name, exc.details()
        _tally(index, code, detail, sent, latencies, errors, statuses, reasons)


def _tally(index: int, code: str, detail: str, sent: float, latencies: list[float], errors: list[int],
           statuses: Counter, reasons: list[str]) -> None:
    """One answer counted: its latency when OK, else an error, the first one's reason kept."""
    statuses[index, code] += 1
    if code == "OK":
        latencies.append(time.perf_counter() - sent)
        return
    errors[0] += 1
    if not reasons:
        reasons.append(f"{code}: {detail}")


async def _grpc_streamer(stream, messages: list[bytes], k: int, stop_at: float, latencies: list[float],
                         errors: list[int], statuses: Counter, reasons: list[str]) -> None:
    """One client over one ModelStreamInfer stream: it writes a request, reads its answer,
    writes the next. An answer with an `error_message` is an error (counted as
    INVALID_ARGUMENT: a stream's answers carry no status), as is a stream the server ends."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    i = k * 7
    try:
        while time.perf_counter() < stop_at:
            index = i % len(messages)
            i += 1
            sent = time.perf_counter()
            await stream.write(messages[index])
            answer = await stream.read()
            if answer is grpc.aio.EOF:  # the server ended the stream: nothing more comes on it
                raise grpc.aio.AioRpcError(await stream.code(), None, None, await stream.details())
            error = pb.ModelStreamInferResponse.FromString(answer).error_message
            _tally(index, "INVALID_ARGUMENT" if error else "OK", error, sent, latencies, errors, statuses, reasons)
        await stream.done_writing()
        await stream.code()
    except grpc.aio.AioRpcError as exc:
        errors[0] += 1
        if not reasons:
            reasons.append(f"{exc.code().name}: {exc.details()}")
    finally:
        stream.cancel()


# ---------------------------------------------------------------- HTTP


async def closed_loop(host: str, port: int, path: str, bodies: list, concurrency: int, duration: float,
                      statuses: Counter | None = None, own: Sequence[list] | None = None,
                      reasons: list[str] | None = None,
                      lost: list[str] | None = None) -> tuple[list[float], int, float]:
    """`concurrency` clients in a closed loop over `bodies` (client k over `own[k]` instead,
    when given) for `duration` s: the latencies of the 200 answers, how many were not 200,
    the seconds taken; `statuses` counts the answers by (body index, status code);
    `reasons` gets the first error's status and the server's message; `lost` why the
    server went away (closed a connection, or refused one), if it did."""
    latencies: list[float] = []
    errors = [0]
    shared = _http_requests(host, path, bodies) if not own else None
    mine = [_http_requests(host, path, own[k]) for k in range(concurrency)] if own else None
    start = time.perf_counter()
    stop_at = start + duration
    counts = Counter() if statuses is None else statuses
    why = [] if reasons is None else reasons
    gone = [] if lost is None else lost
    await asyncio.gather(*(_client(host, port, mine[k] if mine else shared, k, stop_at, latencies, errors, counts, why,
                                   gone) for k in range(concurrency)))
    return latencies, errors[0], time.perf_counter() - start


def _http_requests(host: str, path: str, bodies: list) -> list[bytes]:
    """Each (body, headers) as the bytes of a whole HTTP/1.1 request, built once."""
    requests = []
    for body, headers in bodies:
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        requests.append(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
                        .encode() + body)
    return requests


async def _client(host: str, port: int, requests: list[bytes], k: int, stop_at: float, latencies: list[float],
                  errors: list[int], statuses: Counter, reasons: list[str], lost: list[str]) -> None:
    """One client on one keep-alive connection. A connection the server closes (or refuses)
    ends the client with one error, its reason in `reasons` and `lost`: perf_analyzer's
    "failed" point, not an exception that would lose the points measured before it."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        _gone(f"cannot connect to the server: {exc.strerror or exc}", errors, reasons, lost)
        return
    i = k * 7  # clients start at different requests
    try:
        while time.perf_counter() < stop_at:
            index = i % len(requests)
            request = requests[index]
            i += 1
            sent = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            statuses[index, status] += 1
            if status == 200:
                latencies.append(time.perf_counter() - sent)
                continue
            errors[0] += 1
            if not reasons:
                reasons.append(f"HTTP {status}: {_server_message(body)}")
    except (asyncio.IncompleteReadError, ConnectionError):  # EOF or a reset: no answer comes on this connection
        _gone("the server closed the connection", errors, reasons, lost)
    finally:
        writer.close()


def _gone(reason: str, errors: list[int], reasons: list[str], lost: list[str]) -> None:
    """A request the server will never answer: an error, and the first such reason kept."""
    errors[0] += 1
    if not reasons:
        reasons.append(reason)
    if not lost:
        lost.append(reason)


def _server_message(body: bytes) -> str:
    """The `error` of an Open Inference Protocol error answer, else its text (first line)."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    message = doc.get("error") if isinstance(doc, dict) else None
    lines = str(message if message is not None else text).strip().splitlines()
    return lines[0] if lines else "(no message)"


# ---------------------------------------------------------------- system shared memory


def _output_sizes(meta: Mapping[str, Any], info: Mapping[str, Any], rows: int) -> list[tuple[str, int]]:
    """(name, bytes) of each output at `rows` rows, from the metadata's shapes."""
    sizes = []
    for t in meta["outputs"]:
        where = f"output {t['name']!r}"
        size = dt.element_size(t["datatype"]) if t["datatype"] in dt.NUMPY_TYPES else None
        if size is None:
            raise ZooError(f"{where} is {t['datatype']}, whose size is not known before the answer, so it cannot be "
                           "given a shared memory region; measure this model without --shared-memory")
        shape = _fill(t["shape"], info.get("axes") or {}, rows, where, dynamic_ok=False)
        sizes.append((t["name"], size * math.prod(shape)))
    return sizes


@contextlib.contextmanager
def shared_memory_requests(where: Target, served: str, meta: Mapping[str, Any], info: Mapping[str, Any],
                           samples: list[Mapping[str, Any]], datatypes: Mapping[str, str], rows: int
                           ) -> Iterator[list[list]]:
    """For each sample (one per client): an input and an output region created, the inputs
    written into the first, both registered with the server; yields each client's one
    request (HTTP (body, headers) or gRPC bytes) naming them. Every region registered is
    unregistered and every region created destroyed on the way out."""
    import tritonclient.utils.shared_memory as shm

    outputs = _output_sizes(meta, info, rows)  # refuse before creating anything
    handles, registered, requests = [], [], []
    grpc_client = None
    if where.protocol == "grpc":
        from tritonclient.grpc import InferenceServerClient

        grpc_client = InferenceServerClient(where.grpc)
    try:
        for k, sample in enumerate(samples):
            tensors = _inputs(sample, datatypes)
            base = f"zoo-perf-{os.getpid()}-{k}"
            in_name, out_name = f"{base}-in", f"{base}-out"
            in_size = sum(len(raw) for *_, raw in tensors)
            out_size = sum(size for _, size in outputs)
            handle = shm.create_shared_memory_region(in_name, "/" + in_name, max(in_size, 1))
            handles.append(handle)
            shm.set_shared_memory_region(handle, [np.frombuffer(raw, np.uint8) for *_, raw in tensors])
            handles.append(shm.create_shared_memory_region(out_name, "/" + out_name, max(out_size, 1)))
            for name, size in ((in_name, in_size), (out_name, out_size)):
                _register(where, grpc_client, name, "/" + name, max(size, 1))
                registered.append(name)
            placed_in, offset = [], 0
            for name, datatype, shape, raw in tensors:
                placed_in.append((name, datatype, shape, offset, len(raw)))
                offset += len(raw)
            placed_out, offset = [], 0
            for name, size in outputs:
                placed_out.append((name, offset, size))
                offset += size
            build = _grpc_shm_request if grpc_client is not None else _http_shm_request
            requests.append([build(served, in_name, placed_in, out_name, placed_out)])
        yield requests
    finally:
        for name in registered:
            with contextlib.suppress(Exception):
                _unregister(where, grpc_client, name)
        for handle in handles:
            with contextlib.suppress(Exception):
                shm.destroy_shared_memory_region(handle)
        if grpc_client is not None:
            grpc_client.close()


def _register(where: Target, grpc_client, name: str, key: str, size: int) -> None:
    if grpc_client is not None:
        from tritonclient.utils import InferenceServerException

        try:
            grpc_client.register_system_shared_memory(name, key, size)
        except InferenceServerException as exc:
            raise ZooError(f"the server at {where.url} refused to register a shared memory region: "
                           f"{exc.message()}") from None
        return
    try:
        response = httpx.post(f"{where.http}{SHM}/region/{name}/register",
                              json={"key": key, "offset": 0, "byte_size": size}, timeout=30)
    except httpx.HTTPError as exc:
        raise ZooError(f"no answer from {where.http}: {exc}") from None
    if response.status_code != 200:
        try:
            reason = response.json().get("error", response.text)
        except ValueError:
            reason = response.text
        raise ZooError(f"the server at {where.http} refused to register a shared memory region "
                       f"({response.status_code}): {reason}")


def _unregister(where: Target, grpc_client, name: str) -> None:
    if grpc_client is not None:
        grpc_client.unregister_system_shared_memory(name)
    else:
        httpx.post(f"{where.http}{SHM}/region/{name}/unregister", timeout=30)


def _http_shm_request(served: str, in_name: str, inputs: list, out_name: str, outputs: list) -> tuple[bytes, dict]:
    doc = {"inputs": [{"name": name, "shape": shape, "datatype": datatype,
                       "parameters": {"shared_memory_region": in_name, "shared_memory_byte_size": size,
                                      "shared_memory_offset": offset}}
                      for name, datatype, shape, offset, size in inputs],
           "outputs": [{"name": name, "parameters": {"shared_memory_region": out_name, "shared_memory_byte_size": size,
                                                     "shared_memory_offset": offset}}
                       for name, offset, size in outputs]}
    return json.dumps(doc, separators=(",", ":")).encode(), {"Content-Type": "application/json"}


def _grpc_shm_request(served: str, in_name: str, inputs: list, out_name: str, outputs: list) -> bytes:
    from tritonclient.grpc import service_pb2 as pb

    message = pb.ModelInferRequest(model_name=served)
    for name, datatype, shape, offset, size in inputs:
        item = message.inputs.add(name=name, datatype=datatype, shape=shape)
        item.parameters["shared_memory_region"].string_param = in_name
        item.parameters["shared_memory_byte_size"].int64_param = size
        item.parameters["shared_memory_offset"].int64_param = offset
    for name, offset, size in outputs:
        item = message.outputs.add(name=name)
        item.parameters["shared_memory_region"].string_param = out_name
        item.parameters["shared_memory_byte_size"].int64_param = size
        item.parameters["shared_memory_offset"].int64_param = offset
    return message.SerializeToString()


# ---------------------------------------------------------------- the server's view and the report


def _scrape(http: str, model: str) -> dict[str, float] | None:
    """Sum and count of the server's histograms for `model`; none from a server whose HTTP
    port has no zoo /metrics (Triton serves its own on another port, under other names);
    None from one that does not answer (gone: `_timed`)."""
    try:
        response = httpx.get(f"{http}/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return {}
    text = response.text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == model and sample.name.endswith(("_sum", "_count")):
                found[sample.name] = sample.value
    return found


def _server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    def mean(metric: str) -> float | None:
        count = after.get(f"{metric}_count", 0) - before.get(f"{metric}_count", 0)
        total = after.get(f"{metric}_sum", 0) - before.get(f"{metric}_sum", 0)
        return total / count if count else None

    view = {key: mean(name) for key, name in SERVER_HISTOGRAMS.items()}
    out = {f"{k}_ms": (v * 1e3 if v is not None else None) for k, v in view.items() if k != "batch"}
    out["mean_batch"] = view["batch"]
    if None not in (view["request"], view["queue"], view["compute"]):
        out["overhead_ms"] = (view["request"] - view["queue"] - view["compute"]) * 1e3
    return out


def print_sweep(report: dict[str, Any], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    how = report.get("protocol", "http") + (", streaming" if report.get("streaming") else "") + \
        (", shared memory" if report.get("shared_memory") else "")
    table = Table("concurrency", "rows/request", "requests/s", "p50 ms", "p90 ms", "p99 ms", "errors",
                  "server ms", "queue ms", "model ms", "overhead ms", "mean batch",
                  title=f"{report['model']} at {report['url']} ({how})")

    def f(v: float | None, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    for r in report["results"]:
        s = r["server"]
        table.add_row(str(r["concurrency"]), str(r["batch"]), f(r["requests_per_s"], 1), f(r["p50_ms"]),
                      f(r["p90_ms"]), f(r["p99_ms"]), str(r["errors"]), f(s.get("request_ms")), f(s.get("queue_ms")),
                      f(s.get("compute_ms")), f(s.get("overhead_ms")), f(s.get("mean_batch"), 1))
    console.print(table)
    for r in report["results"]:
        if r.get("first_error"):
            console.print(f"[yellow]concurrency {r['concurrency']}, {r['batch']} rows/request: {r['errors']} "
                          f"errors, the first: {escape(r['first_error'])}[/]", highlight=False)
        if r.get("failed"):
            console.print(f"[red]concurrency {r['concurrency']}, {r['batch']} rows/request failed: "
                          f"{escape(r['failed'])}; the sweep stopped there[/]", highlight=False)
