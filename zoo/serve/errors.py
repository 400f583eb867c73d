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


class ModelNotFoundError(ZooError):
    """No loaded model (or version) by that name (404)."""


class ModelNotReadyError(ZooError):
    """The model is loaded but cannot take requests now: recovering or stopping (503)."""


class QueueFullError(ZooError):
    """The model's bounded queue is full; the client should back off and retry (503)."""


class PayloadTooLargeError(ZooError):
    """The request body exceeds the configured limit (413)."""


class ModelControlDisabledError(ZooError):
    """Loading and unloading over the API is off (403)."""


class UnsupportedMediaError(ZooError):
    """A Content-Encoding or Content-Type the server does not read (415)."""


class BackendFailureError(ZooError):
    """The backend raised while running a batch (500); the message names the model only."""


class RequestTimeoutError(ZooError):
    """The model did not answer within the request timeout (504)."""


#: exception type -> HTTP status; the first match along the exception's MRO wins, so
#: subclasses (ProtocolError is an InputError) may be listed before or after their bases.
STATUS: dict[type[BaseException], int] = {
    ProtocolError: 400,
    InputError: 400,
    ModelControlDisabledError: 403,
    ModelNotFoundError: 404,
    UnknownModelError: 404,
    PayloadTooLargeError: 413,
    UnsupportedMediaError: 415,
    BackendFailureError: 500,
    ModelNotReadyError: 503,
    QueueFullError: 503,
    RequestTimeoutError: 504,
    ZooError: 500,  # any other typed zoo failure: its message is written for users
}

#: an absolute path of two or more components (POSIX or Windows), as library messages embed them.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-~]+){2,}[\\/]?")


def status_for(exc: BaseException) -> int | None:
    """The HTTP status for `exc`, or None for an exception the table does not know."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return None


def scrub(message: str, limit: int = 1000) -> str:
    """A message safe to send: file system paths replaced, length capped."""
    message = _PATH.sub("<path>", message)
    return message if len(message) <= limit else message[:limit] + "..."
