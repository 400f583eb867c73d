"""Server errors and the one table that maps an exception type to an HTTP status.

KServe keeps such a table in its `errors.py`; unlike its catch-all, a response here never
carries an exception class name, a traceback or a file path: the body is always
`{"error": "<what was wrong>"}`, and anything unforeseen is a 500 whose details go to
the server's log only.
"""

from __future__ import annotations

import re

from ..errors import InputError, UnknownModelError, ZooError


class ProtocolError(InputError):
    """The request is not a well-formed Open Inference Protocol request (400)."""


class InputMismatchError(InputError):
    """The request's inputs do not fit the model's configuration (400): their number, one given
    twice, a datatype, a shape, the batch size, a tensor's byte size. Triton's core refuses these
    naming the request, `[request id: ID] ` before its message (`<id_unknown>` without an id),
    over HTTP, gRPC and gRPC streams alike; its front ends' refusals (JSON, an unknown model,
    input or output name) and the model's own checks (axis ranges, values) carry no id
    (tritonserver 2.51, compared side by side). `request_id` is set where the id is known;
    `message_for` writes the prefix, so that `str()` stays the message `zoo.load`'s runner
    gives for the same tensors."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def named(exc: InputMismatchError, request_id: str | None) -> InputMismatchError:
    """`exc`, naming the request it refuses."""
    exc.request_id = request_id
    return exc


class ModelNotFoundError(ZooError):
    """No loaded model (or version) by that name (404)."""


class ModelLoadError(ZooError):
    """A load (model control) failed on the artifact: corrupted, refused, or not runnable here (400, as Triton)."""


class ModelNotReadyError(ZooError):
    """The model is loaded but cannot take requests now: recovering or stopping (503)."""


class QueueFullError(ZooError):
    """The model's bounded queue is full; the client should back off and retry (503)."""


class PayloadTooLargeError(ZooError):
    """The request body exceeds the configured limit (413)."""


def too_large(size: int, limit: int) -> PayloadTooLargeError:
    """A body (an HTTP request's, a gRPC message's) of `size` bytes over the limit, in the
    words both front ends use."""
    return PayloadTooLargeError(f"the request body ({size} bytes) exceeds the limit of {limit} bytes")


class FeatureOffError(ZooError):
    """An extension the server offers but was started without (403): model control,
    system shared memory. The message names the flag that turns it on."""


class ModelControlDisabledError(FeatureOffError):
    """Loading and unloading over the API is off (403)."""


class SharedMemoryError(InputError):
    """A shared-memory registration or reference the server refuses (400): unknown
    region, bad key, offset or size outside the region. Never echoes a region name."""


class RegionNotFoundError(SharedMemoryError):
    """The status of a region that is not registered (404, NOT_FOUND over gRPC, as Triton).
    An inference request naming one stays a plain `SharedMemoryError` (400)."""


class RegionExistsError(SharedMemoryError):
    """A registration under a name already registered (400; ALREADY_EXISTS over gRPC, as Triton)."""


class UnsupportedMediaError(ZooError):
    """A Content-Encoding or Content-Type the server does not read (415)."""


class BackendFailureError(ZooError):
    """The backend failed and no longer answers a known-good request (500); the message
    names the model only, and the model reloads."""


class RequestFailedError(InputError):
    """The engine failed on this request's values while it still answers others (400):
    the client's error, never a reason to reload the model or change readiness."""


class RequestTimeoutError(ZooError):
    """The model did not answer within the request's timeout (503): UNAVAILABLE, as Triton's
    dynamic batcher answers a request whose timeout expired ("Request timeout expired",
    dynamic_batch_scheduler.cc), over HTTP and gRPC alike."""


#: exception type -> HTTP status; the first match along the exception's MRO wins, so
#: subclasses (ProtocolError is an InputError) may be listed before or after their bases.
STATUS: dict[type[BaseException], int] = {
    RequestFailedError: 400,
    ProtocolError: 400,
    InputError: 400,
    RegionNotFoundError: 404,
    FeatureOffError: 403,
    ModelLoadError: 400,
    ModelNotFoundError: 404,
    UnknownModelError: 404,
    PayloadTooLargeError: 413,
    UnsupportedMediaError: 415,
    BackendFailureError: 500,
    ModelNotReadyError: 503,
    QueueFullError: 503,
    RequestTimeoutError: 503,
    ZooError: 500,  # any other typed zoo failure: its message is written for users
}

#: an absolute path of two or more components (POSIX or Windows), as library messages embed them.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-~]+){2,}[\\/]?")


#: exception type -> the `reason` label of `zoo_inference_failures_total`, matched as STATUS is;
#: anything else (an unforeseen error, a typed zoo error of no other kind) is "internal".
REASONS: dict[type[BaseException], str] = {
    InputError: "bad_request",
    ModelNotFoundError: "bad_request",
    ModelLoadError: "bad_request",
    PayloadTooLargeError: "bad_request",
    UnsupportedMediaError: "bad_request",
    QueueFullError: "queue_full",
    ModelNotReadyError: "not_ready",
    BackendFailureError: "backend",
    RequestTimeoutError: "timeout",
}


def _lookup(table: dict, exc: BaseException):
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return None


def status_for(exc: BaseException) -> int | None:
    """The HTTP status for `exc`, or None for an exception the table does not know."""
    return _lookup(STATUS, exc)


def reason_for(exc: BaseException) -> str:
    """The failure-metric reason for `exc`."""
    return _lookup(REASONS, exc) or "internal"


#: an exception class name as engines prefix their messages ("[ONNXRuntimeError] : 2 :", "RuntimeError:")
_CLASS_NAME = re.compile(r"\[?\b\w+(?:Error|Exception)\b\]?(?:\s*:\s*\d+)?\s*:?\s*")


def engine_reason(exc: BaseException, limit: int = 300) -> str:
    """The first line of an engine's error, safe to send: class names and paths removed."""
    lines = str(exc).strip().splitlines()
    reason = _CLASS_NAME.sub("", lines[0]).strip() if lines else ""
    return scrub(reason or "the engine gave no reason", limit)


def scrub(message: str, limit: int = 1000) -> str:
    """A message safe to send: file system paths replaced, length capped."""
    message = _PATH.sub("<path>", message)
    return message if len(message) <= limit else message[:limit] + "..."


def message_for(exc: BaseException, limit: int = 1000) -> str:
    """What a client reads for a typed error. A request error (`InputError`) is about
    what the client sent and is written by the zoo or a plugin's decoder, so it is sent as
    written: it may quote the request's own slashes (a SMILES with stereo bonds, an API
    path). Any other error may carry a library's text, so file system paths are replaced."""
    if isinstance(exc, InputError):
        message = str(exc)
        if isinstance(exc, InputMismatchError):  # as Triton's core words it
            message = f"[request id: {exc.request_id or '<id_unknown>'}] {message}"
        return message if len(message) <= limit else message[:limit] + "..."
    return scrub(str(exc), limit)
