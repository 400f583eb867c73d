"""The Starlette application: Open Inference Protocol routes over the served models.

Models load in the application's lifespan, so the server listens only once every
artifact that can run here is loaded (the others are listed with the reason they were
skipped). "Live" is "the process answers"; "ready" is "every loaded model takes
requests" (not during recovery from a backend failure).

Every error is `{"error": "..."}` with the status from `errors.STATUS`: Starlette's own
404/405, a body over the size limit (413, answered before the body is read when
Content-Length says so, and as soon as a chunked body passes the limit), and anything
unforeseen (500, details only in the log, once). A client that goes away before its body
arrives is no error of the server: nothing is logged, and the answer nobody reads is
counted as 499 (nginx's "client closed request").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from ..version import __version__
from ..errors import ZooError
from . import repository, shm
from .errors import (
    ModelNotFoundError,
    PayloadTooLargeError,
    ProtocolError,
    UnsupportedMediaError,
    message_for,
    status_for,
    too_large,
)
from .http import CLOSE, CYCLE, client_left
from .metrics import Metrics
from .model import ServedModel, config_json
from .protocol import (
    CODINGS,
    HEADER_LENGTH,
    InferRequest,
    compress,
    decode_request,
    encode_response,
    inflate,
    json_length,
    response_coding,
    unique_keys,
)
from .service import Disconnected, Server

log = logging.getLogger("zoo.serve")
OFFLOAD_BYTES = 1 << 16  # bodies larger than this are decoded in a worker thread, off the event loop
INFLATE_BYTES = 1 << 12  # compressed bodies larger than this are inflated there (they may grow a thousandfold)


@dataclass(frozen=True)
class Settings:
    repository: Path
    options: repository.ServeOptions = repository.ServeOptions()
    max_request_bytes: int = 64 << 20  # request bodies beyond this are answered 413
    model_control: bool = False  # load/unload over /v2/repository/models/...
    request_timeout: float = 60.0  # seconds a request may wait for its model
    shutdown_timeout: float = 30.0  # seconds queued work may take to finish at shutdown
    host: str = "127.0.0.1"  # the address both front ends bind
    grpc_port: int = 0  # the gRPC front end's port; 0: no gRPC
    shared_memory: bool = False  # the system shared memory extension (same-host clients)


# ---------------------------------------------------------------- routes


def _zoo(request: Request) -> Server:
    return request.app.state.zoo


async def server_metadata(request: Request) -> Response:
    return JSONResponse({"name": "zoo", "version": __version__, "extensions": _zoo(request).extensions()})


async def live(request: Request) -> Response:
    return JSONResponse({"live": True})


async def ready(request: Request) -> Response:
    ok, reason = _zoo(request).ready()
    return JSONResponse({"ready": True} if ok else {"ready": False, "error": reason}, 200 if ok else 503)


async def model_metadata(request: Request) -> Response:
    return JSONResponse(_model(request).metadata())


async def model_config(request: Request) -> Response:
    return JSONResponse(config_json(_model(request).config()))


async def model_ready(request: Request) -> Response:
    m = _model(request)
    if m.ready:
        return JSONResponse({"name": m.name, "version": m.version, "ready": True})
    return JSONResponse({"name": m.name, "ready": False, "error": f"model {m.name} is not ready: {m.reason}"}, 503)


def _model(request: Request) -> ServedModel:
    return _zoo(request).model(request.path_params["model"], _version(request))


def _version(request: Request) -> str | None:
    """The path's model version, if any. Triton's HTTP routes take digits only there, so a path
    with any other version is no endpoint (404, as tritonserver 2.51 answers); gRPC reads one as
    std::stol does (`service.version_number`)."""
    version = request.path_params.get("version")
    if version is not None and not (version.isascii() and version.isdigit()):
        # no path in the words: a path reads as a file's to `scrub`, which replaces it with <path>
        raise ModelNotFoundError(f"no endpoint for version {version[:100]!r} of model "
                                 f"{request.path_params['model'][:100]!r}: a model version in a URL is its number "
                                 f"(digits), as in versions/1")
    return version


async def infer(request: Request) -> Response:
    zoo = _zoo(request)

    async def decode(model: ServedModel) -> InferRequest:
        try:
            body = await request.body()
        except ClientDisconnect:
            raise Disconnected("the client went away before its request body arrived") from None
        coding = request.headers.get("content-encoding", "").strip().lower()
        if coding in CODINGS:  # the guard lets only these through, and only here
            limit = zoo.settings.max_request_bytes
            body = (await asyncio.to_thread(inflate, body, coding, limit) if len(body) > INFLATE_BYTES
                    else inflate(body, coding, limit))
        header = request.headers.get(HEADER_LENGTH)
        # a raw binary request ("0", as any integer spelling of zero): the body is the one input
        if header is not None and json_length(header, len(body)) == 0:
            return model.raw_request(body)
        if len(body) <= OFFLOAD_BYTES:
            return decode_request(body, header)
        if (len(body) if header is None else json_length(header, len(body))) <= OFFLOAD_BYTES:
            return await asyncio.to_thread(decode_request, body, header)  # mostly binary: its size in memory
        async with zoo.json_parses:
            return await asyncio.to_thread(decode_request, body, header)

    def encode(model: ServedModel, decoded: InferRequest, outputs: list) -> tuple[bytes, dict[str, str]]:
        # as Triton's HTTP front end: the request-wide `binary_data_output` is the default of the
        # outputs it returns when none is named; a named output is binary only by its own
        # `binary_data` (http_server.cc, CheckBinaryOutputData; Triton 2.51 answers so)
        wanted = decoded.outputs or {}
        binary = {t.name: bool(wanted[t.name].binary) if t.name in wanted else decoded.binary_output for t in outputs}
        return encode_response(model.name, model.version, decoded.id, outputs, binary)

    _, _, (content, headers) = await zoo.infer(request.path_params["model"], _version(request), decode, encode)
    coding = response_coding(request.headers.get("accept-encoding"))
    if coding is not None:  # Inference-Header-Content-Length still counts the uncompressed JSON, as Triton's
        content = (await asyncio.to_thread(compress, content, coding) if len(content) > OFFLOAD_BYTES
                   else compress(content, coding))
        headers["Content-Encoding"] = coding
    return Response(content, headers=headers)


async def statistics(request: Request) -> Response:
    """Triton's statistics extension: every model's, or one model's (and version's)."""
    stats = _zoo(request).statistics(request.path_params.get("model", ""), _version(request) or "")
    return JSONResponse({"model_stats": stats})


async def repository_index(request: Request) -> Response:
    """Every artifact in the repository with its state and reason (Triton's index); with
    `{"ready": true}` only the models ready for inference. As tritonserver 2.51 reads the body,
    `ready` is read only from an object: any other JSON document (`[]`, `null`) asks for every
    model, as an empty body does. A `ready` that is not a boolean, or JSON that does not parse,
    is 400 (Triton 2.51 answers 500)."""
    zoo = _zoo(request)
    ready_only = False
    body = await request.body()
    if body.strip():
        try:
            doc = json.loads(body, parse_constant=lambda name: None, object_pairs_hook=unique_keys)
        except RecursionError:
            raise ProtocolError("the repository index request JSON is nested too deeply") from None
        except ValueError:
            raise ProtocolError("the repository index request body must be JSON: an object, "
                                "with `ready` true or false") from None
        if isinstance(doc, dict) and not isinstance(doc.get("ready", False), bool):
            raise ProtocolError("the repository index request body is a JSON object whose `ready` is true or false")
        ready_only = isinstance(doc, dict) and doc.get("ready", False)
    # a ready model's row without an empty reason, as Triton writes it
    return JSONResponse([{k: v for k, v in row.items() if k != "reason" or v} for row in await zoo.index(ready_only)])


async def load_model(request: Request) -> Response:
    zoo = _control(request)
    body = await request.body()
    if body.strip():
        try:
            doc = json.loads(body, object_pairs_hook=unique_keys)
        except (ValueError, RecursionError):
            raise ProtocolError("the load request body must be JSON") from None
        if not isinstance(doc, dict) or doc.get("parameters"):
            raise ProtocolError("load takes no parameters: configuration and file overrides are not supported")
    name = request.path_params["model"]
    await zoo.load(name)
    return JSONResponse({"name": name, "state": "READY"})


async def unload_model(request: Request) -> Response:
    zoo = _control(request)
    name = request.path_params["model"]
    await zoo.unload(name)
    return JSONResponse({"name": name, "state": "UNAVAILABLE"})


def _control(request: Request) -> Server:
    zoo = _zoo(request)
    zoo.check_control()
    return zoo


async def metrics(request: Request) -> Response:
    zoo = _zoo(request)
    content, content_type = zoo.metrics.exposition(list(zoo.models.values()))
    return Response(content, media_type=content_type)


async def shm_register(request: Request) -> Response:
    """System shared memory: register a region (`{"key", "offset", "byte_size"}`)."""
    zoo = _zoo(request)
    body = await request.body()
    try:
        doc = json.loads(body, parse_constant=lambda name: None, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError):
        raise ProtocolError("the register request body must be a JSON object with key, offset and byte_size") \
            from None
    if not isinstance(doc, dict) or not isinstance(doc.get("key"), str) or type(doc.get("byte_size")) is not int \
            or type(doc.get("offset", 0)) is not int:
        raise ProtocolError("the register request body must be a JSON object with a `key` string and integer "
                            "`offset` and `byte_size`")
    zoo.regions.register(request.path_params["region"], doc["key"], doc.get("offset", 0), doc["byte_size"])
    return JSONResponse({})


async def shm_unregister(request: Request) -> Response:
    _zoo(request).regions.unregister(request.path_params.get("region"))
    return JSONResponse({})


async def shm_status(request: Request) -> Response:
    return JSONResponse(_zoo(request).regions.status(request.path_params.get("region")))


async def cuda_register(request: Request) -> Response:
    shm.cuda_register()
    return JSONResponse({})  # never reached


async def cuda_unregister(request: Request) -> Response:
    return JSONResponse({})  # no CUDA region is ever registered (shm.CUDA_OFF)


async def cuda_status(request: Request) -> Response:
    return JSONResponse(shm.cuda_status(request.path_params.get("region")))


SHM = "/v2/systemsharedmemory"
CUDA_SHM = "/v2/cudasharedmemory"
MODEL = "/v2/models/{model}"
VERSION = "/v2/models/{model}/versions/{version}"
INFER_ROUTES = (Route(MODEL + "/infer", infer, methods=["POST"]), Route(VERSION + "/infer", infer, methods=["POST"]))
ROUTES = [
    # inference first: Starlette tries routes in order until one matches, so the hot path
    # matches at once instead of after every metadata and shared-memory route (no earlier
    # pattern can match an .../infer path, so the order changes no routing)
    *INFER_ROUTES,
    Route("/v2", server_metadata, methods=["GET"]),
    Route("/v2/health/live", live, methods=["GET"]),
    Route("/v2/health/ready", ready, methods=["GET"]),
    Route("/v2/models/stats", statistics, methods=["GET"]),
    Route(MODEL + "/stats", statistics, methods=["GET"]),
    Route(VERSION + "/stats", statistics, methods=["GET"]),
    Route(SHM + "/status", shm_status, methods=["GET"]),
    Route(SHM + "/region/{region}/status", shm_status, methods=["GET"]),
    Route(SHM + "/region/{region}/register", shm_register, methods=["POST"]),
    Route(SHM + "/unregister", shm_unregister, methods=["POST"]),
    Route(SHM + "/region/{region}/unregister", shm_unregister, methods=["POST"]),
    Route(CUDA_SHM + "/status", cuda_status, methods=["GET"]),
    Route(CUDA_SHM + "/region/{region}/status", cuda_status, methods=["GET"]),
    Route(CUDA_SHM + "/region/{region}/register", cuda_register, methods=["POST"]),
    Route(CUDA_SHM + "/unregister", cuda_unregister, methods=["POST"]),
    Route(CUDA_SHM + "/region/{region}/unregister", cuda_unregister, methods=["POST"]),
    *(r for base in (MODEL, VERSION) for r in (
        Route(base, model_metadata, methods=["GET"]),
        Route(base + "/ready", model_ready, methods=["GET"]),
        Route(base + "/config", model_config, methods=["GET"]))),
    Route("/v2/repository/index", repository_index, methods=["POST"]),
    Route("/v2/repository/models/{model}/load", load_model, methods=["POST"]),
    Route("/v2/repository/models/{model}/unload", unload_model, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
]


# ---------------------------------------------------------------- errors


async def on_error(request: Request, exc: Exception) -> Response:
    """A typed error's status and message; anything else is a 500 whose details go to the log."""
    status = status_for(exc)
    if status is None:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal server error; the server log has the details"}, 500)
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": message_for(exc)}, status, headers=headers)


async def on_disconnect(request: Request, exc: Exception) -> Response:
    """The client went away before its body arrived: this answer is never sent (uvicorn
    drops it), only counted."""
    log.debug("client went away before its request body arrived: %s %s", request.method, request.url.path[:200])
    return Response(status_code=499)


async def on_http_error(request: Request, exc: HTTPException) -> Response:
    path = request.url.path[:200]
    messages = {404: f"no endpoint at {path}; the server speaks the Open Inference Protocol under /v2",
                405: f"{request.method} is not allowed on {path}"}
    return JSONResponse({"error": messages.get(exc.status_code, str(exc.detail))}, exc.status_code,
                        headers=exc.headers)


# ---------------------------------------------------------------- request-size guard


class Guard:
    """ASGI middleware: the body-size limit (before the body is read where Content-Length
    tells, else while it streams in), unsupported Content-Encodings, per-route response
    counts, and the 500 for anything unforeseen (here, not in a Starlette exception
    handler: Starlette re-raises what those handle, and uvicorn would log it a second time)."""

    def __init__(self, app: Any, limit: int, metrics: Metrics) -> None:
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        code: list[int | None] = [None]  # the status of the response begun, if any

        async def counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                code[0] = message["status"]
                if scope.get(CLOSE):  # the body is left unread: the client is told the connection ends
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)
            cycle = scope.get(CYCLE)
            if scope.get(CLOSE) and cycle is not None:  # uvicorn would close at once, resetting what the client
                cycle.keep_alive = True                 # still sends: `JsonErrorProtocol` ends it after a linger

        try:
            inference = scope.get("route") in INFER_ROUTES  # routed already (`App.__call__`): the only compressed
            refusal = self._refuse(scope["headers"], inference)
            if isinstance(refusal, PayloadTooLargeError):  # the body is not read: the connection ends after
                scope[CLOSE] = True
            if refusal is not None:
                says = inference and isinstance(refusal, UnsupportedMediaError)  # the codings it reads, as Triton
                response = JSONResponse({"error": str(refusal)}, status_for(refusal),
                                        headers={"Accept-Encoding": ", ".join(CODINGS)} if says else None)
                return await response(scope, receive, counted)
            received = 0

            async def limited() -> dict:
                nonlocal received
                message = await receive()
                received += len(message.get("body", b""))
                if received > self.limit:
                    scope[CLOSE] = True  # the rest is not read: the connection ends after the answer
                    raise PayloadTooLargeError(f"the request body exceeds the limit of {self.limit} bytes")
                return message

            await self.app(scope, limited, counted)
        except Exception as exc:
            response = await on_error(Request(scope), exc)
            if code[0] is None:  # else a response had begun: it cannot be replaced (uvicorn closes the connection)
                await response(scope, receive, counted)
        except asyncio.CancelledError:  # the server stopped waiting for it (shutdown): no response
            code[0] = code[0] or 499
            raise
        finally:
            if client_left(scope):  # the answer went nowhere
                code[0] = 499
            route = scope.get("route") or _route_of(scope)  # refused before routing: match it here
            self.metrics.child(self.metrics.http, getattr(route, "path", "unmatched"), str(code[0] or 500)).inc()

    def _refuse(self, headers: list[tuple[bytes, bytes]], inference: bool) -> ZooError | None:
        """Why the request is refused from its headers alone, or None. An inference request
        may be gzip or deflate (one coding, as Triton reads them); no other request may."""
        length = encoding = None
        for name, value in headers:
            if name == b"content-length":
                length = value
            elif name == b"content-encoding":  # every such header, and every coding one lists
                encoding = value if encoding is None else encoding + b"," + value
        if length is not None:
            if not length.isdigit():
                return ProtocolError("Content-Length must be a non-negative integer")
            if int(length) > self.limit:
                return too_large(int(length), self.limit)
        if encoding is not None:
            codings = [c.decode("latin-1") for c in (c.strip() for c in encoding.lower().split(b",")) if c]
            if set(codings) <= {"identity"} or (inference and len(codings) == 1 and codings[0] in CODINGS):
                return None
            where = ("send the body as is, or in one coding: gzip or deflate" if inference else
                     "send the body as is (only an inference request may be compressed)")
            return UnsupportedMediaError(f"Content-Encoding {', '.join(codings)[:60]!r} is not supported; {where}")
        return None


def _route_of(scope: dict) -> Route | None:
    return next((route for route in ROUTES if route.matches(scope)[0] != Match.NONE), None)


# ---------------------------------------------------------------- the application


class App(Starlette):
    """The application, with one shortcut: an inference request goes from the request guard
    straight to its handler, without Starlette's error middlewares and router, which cost
    the event loop's one thread a measurable share of every small request
    (docs/benchmarks.md, "Serving: inference past the router"). The guard (size limit,
    encodings, per-route counts, the 500 for anything unforeseen) and the handler's error
    answers are the same either way."""

    infer: "Guard"  # `_infer` behind the request guard: set by `create_app`

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith("/infer"):
            for route in INFER_ROUTES:
                match, child = route.matches(scope)
                if match == Match.FULL:
                    scope.update(child, route=route, app=self)
                    return await self.infer(scope, receive, send)
        await super().__call__(scope, receive, send)


async def _infer(scope: dict, receive: Any, send: Any) -> None:
    """`infer` with the answers the application's exception handlers (`HANDLERS`) give."""
    request = Request(scope, receive)
    try:
        response = await infer(request)
    except tuple(HANDLERS) as exc:
        handler = next(HANDLERS[cls] for cls in type(exc).__mro__ if cls in HANDLERS)  # as Starlette looks it up
        response = await handler(request, exc)
    await response(scope, receive, send)


#: the answer to each kind of error a route raises, by type
HANDLERS = {HTTPException: on_http_error, ZooError: on_error, Disconnected: on_disconnect,
            ClientDisconnect: on_disconnect}


def create_app(settings: Settings) -> Starlette:
    zoo = Server(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        loaded, zoo.skipped = await asyncio.to_thread(repository.scan, settings.repository, settings.options)
        while loaded:  # popped: no name here keeps a model's runners once model control unloads it
            zoo.add(*loaded.pop(0))
        if not zoo.models and zoo.skipped:
            log.warning("no artifact in %s can run here; serving none", settings.repository)
        elif not zoo.models:  # empty, and served with model control (`zoo serve` refuses it otherwise)
            log.warning("%s holds no artifact yet; serving none until one exported there is loaded "
                        "(POST /v2/repository/models/NAME/load)", settings.repository)
        zoo.heap.hold()
        front = None
        try:
            if settings.grpc_port:
                from .grpc_service import start_grpc  # grpcio: imported only when gRPC is on

                front = await start_grpc(zoo, settings.host, settings.grpc_port)
                zoo.on_shutdown.append(lambda: front.drain(settings.shutdown_timeout))
            yield
        finally:
            try:
                if front is not None:  # in-flight gRPC calls finish (up to the shutdown timeout) first
                    await front.stop(settings.shutdown_timeout)
                await zoo.stop()
            finally:
                zoo.heap.release()

    app = App(routes=ROUTES, lifespan=lifespan, exception_handlers=HANDLERS)
    app.router.redirect_slashes = False
    app.state.zoo = zoo
    app.add_middleware(Guard, limit=settings.max_request_bytes, metrics=zoo.metrics)
    app.infer = Guard(_infer, settings.max_request_bytes, zoo.metrics)
    return app
