"""The Open Inference Protocol over gRPC: Triton's `inference.GRPCInferenceService`.

The service definition is Triton's published `grpc_service.proto`, as the modules
generated from it ship in `tritonclient[grpc]` (`service_pb2`, `service_pb2_grpc`,
`model_config_pb2`): the same messages Triton's own server and every tritonclient
speak, none written by hand. It is served by grpcio's asyncio server on the event loop
of the HTTP front end, on its own port, over the same `service.Server`: the same loaded
models, batcher, queue limit, request size limit (checked on each message, in HTTP's words;
grpc core's own cap, `receive_cap`, is above it), timeout, metrics, statistics and
shared-memory regions, and the same error messages, with the status code Triton gives each
(`CODES`, `OWN_CODES`). It listens on the addresses HTTP binds for the host (`addresses`).

Inputs arrive in `raw_input_contents` (one entry per input not in shared memory, in
order, as Triton takes them; BYTES as length-prefixed items), in typed `contents` or in
a shared-memory region; outputs go back in `raw_output_contents`, as Triton sends them.
A domain-native request is one BYTES input named for the model's raw kind (`text`,
`image`, ...), as over HTTP.

ModelStreamInfer takes a stream of requests and answers each as it completes (an
error as `error_message` on that response, the stream going on); it stops reading the
stream while `--max-queue-size` answers are unsent (`Service._stream`). An error of a request
against the model's configuration starts `[request id: ID] ` (`<id_unknown>` without an
id) in a stream as in a unary call and over HTTP, as Triton's core words those
(`errors.InputMismatchError`); tritonclient hands a stream's callback only the message,
not the response's id. CUDA shared memory is
answered as Triton built without GPUs answers it (no region registered, none can be);
log and trace settings are refused as UNIMPLEMENTED with the reason.

Each method takes its request as bytes and parses it itself (`_handlers`): a message
that does not parse is INVALID_ARGUMENT with a plain message, where grpcio would answer
UNKNOWN naming the protobuf exception class. A call the client cancels (or whose
deadline passes) is counted as CANCELLED (DEADLINE_EXCEEDED), and an inference request
so ended as a failure of reason "cancelled".

At shutdown (`GrpcFront.drain`) every new call is refused with UNAVAILABLE, as Triton
refuses them while it exits, and the server is stopped only once the calls in flight are
answered and no call has arrived for a moment (`QUIET`): stopping grpc's server cancels
the calls it has taken but not yet handed to a method.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import socket
import time
from typing import Any, AsyncIterator, Callable

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from ..version import __version__
from ..errors import ZooError
from . import datatypes as dt, shm
from .errors import (
    FeatureOffError,
    InputMismatchError,
    ModelNotFoundError,
    ProtocolError,
    RegionExistsError,
    message_for,
    named,
    status_for,
    too_large,
)
from .protocol import (
    InferRequest,
    Tensor,
    check_header,
    check_parameters,
    region_of,
    request_timeout,
    requested,
    tensor_from_bytes,
    _typed,
)

log = logging.getLogger("zoo.serve")
#: HTTP status (errors.STATUS) -> the gRPC status code Triton answers with for that kind of error
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.UNIMPLEMENTED, 404: grpc.StatusCode.NOT_FOUND,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT,
         500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
#: error types Triton answers over gRPC with a code of their own, not the one their HTTP status maps to
OWN_CODES = {RegionExistsError: grpc.StatusCode.ALREADY_EXISTS}
INTERNAL = "internal server error; the server log has the details"
#: the answer to a call that arrives once shutdown has begun: UNAVAILABLE, which a client may retry elsewhere
DRAINING = "the server is shutting down and takes no new calls"
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
#: v2 datatype -> the typed `contents` field that carries it (FP16 and BF16 travel only as raw bytes)
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message for an exception, as the HTTP front end words it."""
    status = status_for(exc)
    if status is None:
        return grpc.StatusCode.INTERNAL, INTERNAL
    own = next((OWN_CODES[cls] for cls in type(exc).__mro__ if cls in OWN_CODES), None)
    return own or CODES.get(status, grpc.StatusCode.INTERNAL), message_for(exc)


def parsed(message_type: type, raw: bytes) -> Any:
    """A request message from its bytes; ProtocolError (INVALID_ARGUMENT) when they do not parse."""
    try:
        return message_type.FromString(raw)
    except DecodeError:
        raise ProtocolError(f"the request is not a valid {message_type.DESCRIPTOR.name} message") from None


def _answers(method: Callable) -> Callable:
    """A unary method, taking its request as bytes, whose exceptions become the mapped
    status and message; once the server drains, UNAVAILABLE without running it."""
    request_type = getattr(pb, SERVICE.methods_by_name[method.__name__].input_type.name)

    @functools.wraps(method)
    async def wrapper(self: "Service", raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        with self.calls.held():
            if self.draining.is_set():
                self.zoo.metrics.child(self.zoo.metrics.grpc, method.__name__, "UNAVAILABLE").inc()
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
            try:
                await self._check_size(raw, method.__name__)
                response = await method(self, parsed(request_type, raw), context)
            except asyncio.CancelledError:  # the client cancelled the call, or its deadline passed
                self.zoo.metrics.child(self.zoo.metrics.grpc, method.__name__, _ended(context)).inc()
                raise
            except Exception as exc:
                code, message = status_of(exc)
                if code == grpc.StatusCode.INTERNAL and message == INTERNAL:
                    log.error("internal error on gRPC %s", method.__name__, exc_info=exc)
                self.zoo.metrics.child(self.zoo.metrics.grpc, method.__name__, code.name).inc()
                await context.abort(code, message)
            self.zoo.metrics.child(self.zoo.metrics.grpc, method.__name__, "OK").inc()
            return response

    return wrapper


#: seconds before the server's copy of a call's deadline within which a cancellation is the
#: deadline's: the client cancels at its own deadline, which comes first by the time the call
#: took to arrive and be read (under load, a call ended by its deadline was counted CANCELLED)
DEADLINE_SLACK = 0.1


def _ended(context: grpc.aio.ServicerContext) -> str:
    """Why a call was cancelled, as its status code's name."""
    remaining = context.time_remaining()
    return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= DEADLINE_SLACK else "CANCELLED"


#: seconds a draining server goes on taking calls once none is left in flight and none arrives: grpc core
#: cancels the calls it has taken but not yet handed to a method when the server stops (CANCELLED, and no
#: handler runs), so these are let in first, to be answered UNAVAILABLE
QUIET = 0.25
QUIET_MAX = 2.0


class Calls:
    """The calls being handled, and when one last arrived or ended: what a drain waits on."""

    def __init__(self) -> None:
        self.count, self.last = 0, time.monotonic()

    @contextlib.contextmanager
    def held(self):
        self.count, self.last = self.count + 1, time.monotonic()
        try:
            yield
        finally:
            self.count, self.last = self.count - 1, time.monotonic()

    async def settled(self, deadline: float) -> None:
        """Once no call is left and none has come for QUIET seconds (the calls on their way
        when this is called among them), or at `deadline` (monotonic). New calls keep it
        waiting for at most QUIET_MAX seconds: a client that polls (is_server_live every 50 ms)
        held the server to the whole grace, as long as Kubernetes' before its SIGKILL."""
        since = time.monotonic()
        while time.monotonic() < deadline and (self.count or (
                time.monotonic() - max(self.last, since) < QUIET and time.monotonic() - since < QUIET_MAX)):
            await asyncio.sleep(QUIET / 10)


# ---------------------------------------------------------------- messages <-> requests


def parameters(entries: Any) -> dict[str, Any]:
    """A protobuf map of InferParameter as plain values."""
    out = {}
    for key, value in entries.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, which) if which else None
    return out


#: the one `triton_` request parameter Triton's gRPC front end takes (TRITON_RESERVED_REQUEST_PARAMS):
#: an empty final stream response for decoupled models. tritonclient's C++ client and
#: perf_analyzer send it on every gRPC request; no zoo model is decoupled, so it changes nothing
EMPTY_FINAL = "triton_enable_empty_final_response"


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


def decode(message: pb.ModelInferRequest) -> InferRequest:
    """A ModelInferRequest as the request `service.Server.infer` takes."""
    given = parameters(message.parameters)
    if EMPTY_FINAL in given and type(given.pop(EMPTY_FINAL)) is not bool:
        raise ProtocolError(f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param")
    params = check_parameters(given, "request", "request")
    raw = message.raw_input_contents
    # as Triton (InferGRPCToInput): the entries go to the inputs not in shared memory, in order
    plain = [parameters(item.parameters).get("shared_memory_region") is None for item in message.inputs]
    if raw and len(raw) != sum(plain):
        raise ProtocolError(f"raw_input_contents has {len(raw)} entries for {sum(plain)} inputs not in shared memory; "
                            "give one per such input, in the order of `inputs`")
    inputs, seen, entries = [], set(), iter(raw)
    try:
        for i, item in enumerate(message.inputs):
            tensor = _input(item, i, next(entries) if raw and plain[i] else None)
            if tensor.name in seen:
                raise InputMismatchError(f"input {tensor.name!r} is given more than once")
            seen.add(tensor.name)
            inputs.append(tensor)
    except InputMismatchError as exc:  # a byte size, an input twice: Triton's core names the request
        raise named(exc, message.id) from None
    outputs = {}
    for item in message.outputs:
        where = f"output {item.name[:200]!r}"
        if not item.name:
            raise ProtocolError("each requested output must have a `name`")
        if item.name in outputs:
            raise ProtocolError(f"{where} is requested more than once")
        outputs[item.name] = requested(check_parameters(parameters(item.parameters), where, "output"), where)
    return InferRequest(inputs, message.id or None, outputs, True, params, request_timeout(params))


def _input(item: pb.ModelInferRequest.InferInputTensor, index: int, raw: bytes | None) -> Tensor:
    name, datatype, shape = check_header(item.name, item.datatype, list(item.shape), index)
    where = f"input {name[:200]!r}"
    region = region_of(check_parameters(parameters(item.parameters), where, "input"), where)
    given = [what for what, there in (("`contents`", item.HasField("contents")),
                                      ("raw_input_contents", raw is not None),
                                      ("shared_memory_region", region is not None)) if there]
    if len(given) > 1:
        raise ProtocolError(f"{where} has both {given[0]} and {given[1]}; give one")
    if region is not None:
        return Tensor(name, datatype, shape, None, region)
    if raw is not None:
        return tensor_from_bytes(name, datatype, shape, raw)
    if not given:
        raise ProtocolError(f"{where} has neither `contents` nor raw_input_contents")
    field = CONTENTS.get(datatype)
    if field is None:
        raise ProtocolError(f"{where}: {datatype} has no typed `contents` field; send it in raw_input_contents")
    others = [f.name for f, _ in item.contents.ListFields() if f.name != field]
    if others:  # as Triton refuses them ("unexpected explicit tensor data"), never ignored
        raise ProtocolError(f"{where}: a {datatype} input's values go in contents.{field}, not {', '.join(others)}")
    values = list(getattr(item.contents, field))
    count = math.prod(shape)
    if len(values) != count:  # Triton's core: "input byte size mismatch"
        raise InputMismatchError(f"{where}: contents.{field} has {len(values)} elements but shape {list(shape)} "
                                 f"needs {count}")
    if datatype == "BYTES":
        flat = dt.bytes_array(values)
    elif datatype in dt.INTEGER:
        flat = _typed(values, datatype, where)  # range-checked: int_contents are 32-bit for INT8 and INT16
    else:  # floats and booleans as the protobuf holds them; NaN and infinity are values here, not errors
        flat = np.asarray(values, dtype=dt.numpy_of(datatype))
    return Tensor(name, datatype, shape, flat.reshape(shape))


def encode(model: str, version: str, request_id: str | None, outputs: list[Tensor]) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id or "")
    for t in outputs:
        response.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        if t.region is not None:  # written to shared memory: an empty entry, no parameters, as Triton
            response.raw_output_contents.append(b"")  # keeps raw_output_contents aligned with outputs
        else:
            response.raw_output_contents.append(dt.to_bytes(t.datatype, t.data))
    return response


# ---------------------------------------------------------------- the service


class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, zoo) -> None:
        self.zoo = zoo
        self.draining = asyncio.Event()  # set at shutdown: new calls are refused, streams take no new requests
        self.calls = Calls()

    @_answers
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    @_answers
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.zoo.ready()[0])

    @_answers
    async def ModelReady(self, request, context):
        try:
            model = self.zoo.model(request.name, request.version or None)
        except ModelNotFoundError:  # Triton: a model (or version) it does not serve is "not ready", not an error
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=model.ready)

    @_answers
    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="zoo", version=__version__, extensions=self.zoo.extensions())

    @_answers
    async def ModelMetadata(self, request, context):
        meta = self.zoo.model(request.name, request.version or None).metadata()
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]])

    @_answers
    async def ModelConfig(self, request, context):
        config = self.zoo.model(request.name, request.version or None).config()
        return pb.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

    @_answers
    async def ModelStatistics(self, request, context):
        stats = self.zoo.statistics(request.name, request.version)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    @_answers
    async def RepositoryIndex(self, request, context):
        if request.repository_name:  # as Triton: the one repository served is never named
            raise FeatureOffError("repository_name: this server serves one model repository and takes no name for it")
        rows = await self.zoo.index(request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**r) for r in rows])

    @_answers
    async def RepositoryModelLoad(self, request, context):
        self.zoo.check_control()
        if request.parameters:
            raise ProtocolError("load takes no parameters: configuration and file overrides are not supported")
        await self.zoo.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @_answers
    async def RepositoryModelUnload(self, request, context):
        self.zoo.check_control()
        await self.zoo.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


    @_answers
    async def ModelInfer(self, request, context):
        return await self._infer(request)

    async def _check_size(self, raw: bytes, method: str) -> None:
        """Refuse a message over --max-request-size as HTTP refuses a body over it, in its words
        (grpc core lets messages up to `receive_cap` through to be refused here): RESOURCE_EXHAUSTED,
        counted among the method's answers, and an inference request also as a request of the
        model it names that failed (reason bad_request), as an HTTP body cut off at the limit is."""
        limit = self.zoo.settings.max_request_bytes
        if len(raw) <= limit:
            return
        error = too_large(len(raw), limit)
        if method in ("ModelInfer", "ModelStreamInfer"):
            try:
                message = await asyncio.to_thread(pb.ModelInferRequest.FromString, raw)
            except DecodeError:
                raise error from None

            async def refused(model) -> InferRequest:
                raise error

            # counted where it names a model that can count it; the answer is the size's, whatever else is wrong
            with contextlib.suppress(Exception):
                await self.zoo.infer(message.model_name, message.model_version or None, refused)
        raise error

    async def _infer(self, message: pb.ModelInferRequest) -> pb.ModelInferResponse:
        async def decoded(model) -> InferRequest:
            if sum(map(len, message.raw_input_contents)) > (1 << 16):  # typed contents stay small
                return await asyncio.to_thread(decode, message)
            return decode(message)

        model, request, outputs = await self.zoo.infer(message.model_name, message.model_version or None, decoded)
        return encode(model.name, model.version, request.id, outputs)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator, context) -> AsyncIterator:
        """Each request of the stream answered as it completes; an error on its own response."""
        with self.calls.held():
            if self.draining.is_set():
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
            async with contextlib.aclosing(self._stream(request_iterator, context)) as responses:
                async for response in responses:  # closed with this one: its reader stops at once
                    yield response

    async def _stream(self, request_iterator: AsyncIterator, context) -> AsyncIterator:
        """The answers of a stream, as they complete. At most `max_queue_size` requests of the
        stream are being answered or have answers grpc has not taken yet (grpc takes one only as
        the client's flow-control window lets it out): past that, the stream is not read until
        the client reads, so a client that writes and never reads holds that many answers, not
        one per request it wrote (Triton bounds them with --grpc-max-response-pool-size). As
        many as a model queues: a stream that took more for one model would only have them
        refused as a full queue."""
        answers: asyncio.Queue = asyncio.Queue()
        room = asyncio.Semaphore(self.zoo.settings.options.max_queue_size)
        taken = 0  # requests read from the stream

        async def answer(raw: bytes) -> None:
            message = pb.ModelInferRequest()
            try:
                await self._check_size(raw, "ModelStreamInfer")
                message = parsed(pb.ModelInferRequest, raw)
                response = pb.ModelStreamInferResponse(infer_response=await self._infer(message))
                self.zoo.metrics.child(self.zoo.metrics.grpc, "ModelStreamInfer", "OK").inc()
            except asyncio.CancelledError:  # the stream ended (cancelled, broken) before this answer
                self.zoo.metrics.child(self.zoo.metrics.grpc, "ModelStreamInfer", _ended(context)).inc()
                raise
            except Exception as exc:
                code, text = status_of(exc)
                if text == INTERNAL:
                    log.error("internal error on a gRPC stream request", exc_info=exc)
                self.zoo.metrics.child(self.zoo.metrics.grpc, "ModelStreamInfer", code.name).inc()
                response = pb.ModelStreamInferResponse(error_message=text, infer_response=pb.ModelInferResponse(
                    model_name=message.model_name, model_version=message.model_version, id=message.id))
            # as Triton marks every stream response (stream_infer_handler.cc): each request has one
            response.infer_response.parameters["triton_final_response"].bool_param = True
            await answers.put(response)

        async def read() -> None:
            nonlocal taken
            tasks: set[asyncio.Future] = set()  # the answers in progress (a done one is let go)
            try:
                await room.acquire()
                async for message in self._until_draining(request_iterator):
                    task = asyncio.ensure_future(answer(message))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    taken += 1
                    await room.acquire()  # before the next request is read
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:  # the stream ended early: nobody reads their answers
                    task.cancel()
                await answers.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (response := await answers.get()) is not None:
                yield response  # back once grpc has taken it
                room.release()
            await reader  # a broken stream surfaces here
        finally:
            reader.cancel()
        if self.draining.is_set():  # what the client sends from now on is not read: say so
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(f"the server is shutting down; the {taken} requests read from this stream were "
                                "answered, any sent after them were not read")

    async def _until_draining(self, messages: AsyncIterator) -> AsyncIterator:
        """A stream's messages until the client ends it or the server starts shutting down:
        an idle stream must not hold a shutdown up for its whole grace period (Triton waits
        for the requests in flight, not for open streams)."""
        it = messages.__aiter__()
        while not self.draining.is_set():
            following = asyncio.ensure_future(it.__anext__())
            # a stream that ends (StopAsyncIteration) while it is being cancelled leaves an
            # exception nobody reads, which asyncio would log as "never retrieved"
            following.add_done_callback(_retrieved)
            stop = asyncio.ensure_future(self.draining.wait())
            try:
                await asyncio.wait({following, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when the stream is cancelled
                stop.cancel()
                unread = not following.done()
                if unread:  # cancel() only asks: the task is not done until the loop runs it again
                    following.cancel()
            if unread or following.cancelled():
                return
            try:
                message = following.result()
            except StopAsyncIteration:
                return
            yield message

    # ------------------------------------------------------------ shared memory

    @_answers
    async def SystemSharedMemoryRegister(self, request, context):
        self.zoo.regions.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_answers
    async def SystemSharedMemoryUnregister(self, request, context):
        self.zoo.regions.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_answers
    async def SystemSharedMemoryStatus(self, request, context):
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.zoo.regions.status(request.name or None):
            response.regions[region["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    # CUDA shared memory as Triton built without GPUs answers it (shm.CUDA_OFF)
    @_answers
    async def CudaSharedMemoryRegister(self, request, context):
        shm.cuda_register()

    @_answers
    async def CudaSharedMemoryUnregister(self, request, context):
        return pb.CudaSharedMemoryUnregisterResponse()

    @_answers
    async def CudaSharedMemoryStatus(self, request, context):
        shm.cuda_status(request.name or None)
        return pb.CudaSharedMemoryStatusResponse()

    @_answers
    async def TraceSetting(self, request, context):
        raise _not_offered("trace settings")

    @_answers
    async def LogSettings(self, request, context):
        raise _not_offered("log settings")


def _not_offered(what: str) -> FeatureOffError:
    return FeatureOffError(f"{what}: this server does not offer it (GET /v2 lists the extensions it offers)")


class GrpcFront:
    """The running gRPC server. `drain` at SIGTERM: new calls are refused from then on
    (UNAVAILABLE, DRAINING), open streams stop reading, and the calls in flight have up to
    `grace` seconds; the server stops once they are done and no call has arrived for QUIET
    seconds, so that none it has taken is cancelled. `stop` waits for that."""

    def __init__(self, server: grpc.aio.Server, service: Service) -> None:
        self.server, self.service = server, service
        self._stopping: asyncio.Future | None = None

    def drain(self, grace: float) -> None:
        if self._stopping is None:
            self.service.draining.set()
            self._stopping = asyncio.ensure_future(self._drained(grace))

    async def _drained(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        await self.service.calls.settled(deadline)
        await self.server.stop(max(deadline - time.monotonic(), 0))

    async def stop(self, grace: float) -> None:
        self.drain(grace)
        await self._stopping


def _handlers(service: Service) -> dict[str, grpc.RpcMethodHandler]:
    """Every method of the service, as the generated `add_..._to_server` registers them
    but with no request deserializer: each method parses its request's bytes itself."""
    handlers = {}
    for method in SERVICE.methods:
        serialize = getattr(pb, method.output_type.name).SerializeToString
        behaviour = getattr(service, method.name)
        make = grpc.stream_stream_rpc_method_handler if method.client_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(behaviour, response_serializer=serialize)
    return handlers


def receive_cap(limit: int) -> int:
    """The largest message grpc core takes, for a request size limit of `limit` bytes. Core holds
    a message whole before a method sees it, so this cap is what bounds a call's memory; a
    message over `limit` but within it reaches the method, to be refused as HTTP refuses a body
    over the limit (`Service._check_size`: RESOURCE_EXHAUSTED in those words, and counted). Twice
    the limit (and 64 KiB for the message's other fields): a message up to twice over it is
    answered so; a larger one core refuses in its own words ("Received message larger than max"),
    before any method runs, and uncounted."""
    return min(2 * limit + (64 << 10), (1 << 31) - 1)  # grpc core takes a C int: past it, start-up failed


def addresses(host: str, port: int) -> list[str]:
    """What gRPC listens on for `host`: the addresses the HTTP front end binds, which asyncio's
    create_server (under uvicorn) finds as every address getaddrinfo gives for the name. grpc
    core resolves names its own way: given `localhost`, it listened on [::1] too where the
    system resolves the name to 127.0.0.1 alone, and HTTP on 127.0.0.1 only."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ZooError(f"gRPC cannot listen on {host}: {exc.strerror}") from None
    found = dict.fromkeys(str(info[4][0]) for info in infos)  # each once, in the resolver's order
    return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in found]


async def start_grpc(zoo, host: str, port: int) -> GrpcFront:
    """The gRPC front end, listening on `host:port` (each address HTTP binds for `host`); ZooError when it cannot."""
    from .http import Limits

    # a connection that has not finished HTTP/2's handshake within the HTTP front end's read
    # timeout is closed (gRPC's default waits 120 s), so silent connections do not pile up;
    # past the connection cap, grpc core closes a new connection as it is accepted (the
    # client sees UNAVAILABLE), so open files are left for HTTP, shared memory and models
    limits = Limits.from_environment()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", receive_cap(zoo.settings.max_request_bytes)),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.server_handshake_timeout_ms", int(limits.read_timeout * 1000)),
                                      ("grpc.max_allowed_incoming_connections", limits.max_grpc_connections),
                                      ("grpc.so_reuseport", 0)])  # a port in use is an error, not shared
    service = Service(zoo)
    handlers = _handlers(service)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
    listening = []
    for address in addresses(host, port):
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if bound:
            listening.append(address)
        elif not address.startswith("["):  # an IPv6 one is skipped where others bind (IPv6 off, ::1 in hosts)
            raise ZooError(f"gRPC cannot listen on {address}: the port is in use or the address is not this "
                           "machine's; pass --grpc-port PORT, or --grpc-port 0 for no gRPC")
    if not listening:
        raise ZooError(f"gRPC cannot listen on {host}:{port}: the port is in use or the address is not this "
                       "machine's; pass --grpc-port PORT, or --grpc-port 0 for no gRPC")
    await server.start()
    log.info("gRPC listening on %s", ", ".join(listening))
    return GrpcFront(server, service)
