"""uvicorn's HTTP protocol (httptools) with the limits a server on an open port needs,
and one error shape: every refusal made here, before the application sees a request,
is answered with the server's JSON error body, `{"error": ...}`, and closes the
connection.

- 400: a request the parser refuses (a malformed request line or header, both
  Content-Length and Transfer-Encoding).
- 400: a chunked body of more than `MAX_CHUNKS` non-empty chunks, as Triton refuses it
  (`kMaxChunkedChunks`, http_server.cc, with its message): each chunk costs the event
  loop's one thread a parser callback, and a body of tens of millions of one-byte chunks
  fits under the size limit.
- 501: a Transfer-Encoding other than chunked (gzip would otherwise reach the
  application as the body).
- 431: a request line and headers longer than `MAX_HEAD_BYTES`. They are counted as
  they arrive, before httptools joins a header's pieces (which it does on the event
  loop: one client sending a 100 MB header stalled every other for seconds).
- 408: a request not whole (headers and body) `Limits.read_timeout` seconds after its
  first byte; a connection that sends nothing is closed after as long, without an
  answer. Time in which the server itself holds reading paused (a pipelined request
  waiting for the one before it) does not count against the client.
- 503: a connection beyond `Limits.max_connections`, answered and closed at once, so
  stalled clients cannot use up the process's file descriptors.

Pipelining (RFC 9112 section 9.3.2: responses go out in the order of the requests): a
refusal of a request that follows others on the connection waits until their
responses are out, then is sent and the connection closes. At most `MAX_PIPELINED`
parsed requests wait behind the one being answered; the rest of what the client sent
waits unparsed, with reading paused, until one is answered (uvicorn parses every request
of a read and resumes reading after each answer: a client sending requests without
reading the answers had the server hold about 150 MB per connection). A refused request
body (413 from the application, while the client still sends it) closes the connection
as a refusal here does, instead of being read to its end.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
from dataclasses import dataclass

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol  # httptools: a core dependency

from ..errors import UsageError

MESSAGE = ("the HTTP request could not be parsed: a malformed request line or header, or both Content-Length "
           "and Transfer-Encoding")
#: the request line and headers of one request, in bytes: 64 KiB, as common servers allow
#: (nginx 4 x 8 KiB buffers, Node.js 16 KiB, Go 1 MiB); zoo's requests need a few hundred
MAX_HEAD_BYTES = 64 << 10
READ_TIMEOUT = 30.0  # seconds from a request's first byte until its body is complete
MAX_CONNECTIONS = 1024  # open HTTP connections at most; fewer where the open-file limit is low
LINGER = 2.0  # seconds a refused connection is drained before it is closed
MAX_CHUNKS = 65536  # non-empty chunks of one chunked body at most: Triton's kMaxChunkedChunks
MAX_PIPELINED = 8  # parsed requests waiting behind the one being answered, at most
#: a chunked body is given to the parser in pieces of at most this many bytes: its end is
#: not known ahead, and a request the parser meets after it in the same piece joins the
#: pipeline whatever its depth, so a piece bounds how far past MAX_PIPELINED that goes
CHUNKED_PIECE = 4096


#: the ASGI scope's key for the request's uvicorn cycle (set by `JsonErrorProtocol`)
CYCLE = "zoo.cycle"
#: the ASGI scope's key an application sets (to True) to have the connection closed once its
#: response is out, without reading the rest of the request body (a 413 while it streams in)
CLOSE = "zoo.close"


def client_left(scope: dict) -> bool:
    """Whether the client went away before the request's response was complete: uvicorn
    then drops what the application sends, without a word, so the status the application
    chose was never delivered (counted as 499)."""
    cycle = scope.get(CYCLE)
    return cycle is not None and cycle.disconnected and not cycle.response_complete


@dataclass(frozen=True)
class Limits:
    read_timeout: float = READ_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    max_grpc_connections: int = MAX_CONNECTIONS  # the gRPC front end's own cap (`grpc_service`)

    @classmethod
    def from_environment(cls) -> Limits:
        """The defaults, but `ZOO_SERVE_READ_TIMEOUT` (seconds) and `ZOO_SERVE_MAX_CONNECTIONS`
        (each front end's cap) where set. By default the HTTP cap is at most half the
        process's open-file limit and the gRPC cap a quarter, so that both full leave a
        quarter for shared-memory regions, model files and the process's own."""
        timeout = os.environ.get("ZOO_SERVE_READ_TIMEOUT", "")
        connections = os.environ.get("ZOO_SERVE_MAX_CONNECTIONS", "")
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        unlimited = soft == resource.RLIM_INFINITY
        http, grpc = ((MAX_CONNECTIONS, MAX_CONNECTIONS) if unlimited else
                      (max(1, min(MAX_CONNECTIONS, soft // 2)), max(1, min(MAX_CONNECTIONS, soft // 4))))
        try:
            limits = cls(float(timeout or READ_TIMEOUT), int(connections or http), int(connections or grpc))
        except ValueError:
            limits = None
        if limits is None or not limits.read_timeout > 0 or limits.max_connections < 1:
            raise UsageError(f"ZOO_SERVE_READ_TIMEOUT must be a positive number of seconds and "
                             f"ZOO_SERVE_MAX_CONNECTIONS a positive integer; got {timeout!r} and {connections!r}")
        return limits


class JsonErrorProtocol(HttpToolsProtocol):
    limits = Limits()

    @classmethod
    def with_limits(cls, limits: Limits) -> type[JsonErrorProtocol]:
        """This protocol under `limits` (uvicorn makes one protocol object per connection)."""
        return type(cls.__name__, (cls,), {"limits": limits})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # of the request whose head is arriving
        self._in_head = True  # between requests, or before the headers of the current one are complete
        self._reading = False  # a request has begun and its body is not complete
        self._body_left: int | None = None  # bytes of the body still to come, where Content-Length says
        self._chunks = 0  # non-empty chunks of the chunked body being read
        self._chunk_counted = False  # whether the chunk being read has been counted
        #: loop time by which what is being read must be whole (None: nothing is); checked by one
        #: timer per connection, so a request costs a float, not a timer of its own
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._refusal: bytes | None = None  # a refusal waiting for the responses owed before it
        self._running = None  # the request-response cycle whose application runs
        self._held = b""  # read, not parsed: the pipeline was full (MAX_PIPELINED)

    # ------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, f"the server has {self.limits.max_connections} connections open, its limit; retry "
                              "later", b"retry-after: 1\r\n")
            return
        self._deadline = self.loop.time() + self.limits.read_timeout  # a connection that never sends is closed too
        self._timer = self.loop.call_at(self._deadline, self._check_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._held = b""
        # uvicorn tells only the last request parsed; the one being answered (waiting for the
        # client to read, in a flood of pipelined requests) wrote on the closed transport
        for cycle in (self._running, *(entry[0] for entry in self.pipeline)):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """The parser is given a head up to its end (at most what the limit still allows)
        and a body of known length up to its end, so that the next request's head starts
        a piece of its own and is counted from its first byte. (The end of a chunked body
        is not known: a head in the same read after one may pass the limit by that read.)"""
        if self._refusal is not None:  # refused: what follows is not read
            return
        if self._held:  # read while the pipeline is full (reading resumed by uvicorn): waits its turn too
            self._held += data
            self.flow.pause_reading()
            return
        if self._deadline is None and self._in_head:  # bytes before a request line count too
            self._deadline = self.loop.time() + self.limits.read_timeout
        start, size = 0, len(data)
        while start < size and self._refusal is None and not self.transport.is_closing():
            if len(self.pipeline) >= MAX_PIPELINED:  # the rest waits until a request is answered
                self._held = bytes(data[start:])
                self.flow.pause_reading()
                return
            if self._in_head:
                room = MAX_HEAD_BYTES - self._head_bytes
                end = data.find(b"\r\n\r\n", start, start + room)  # no CRLF CRLF inside a head: it ends one
                stop = min(size, start + room if end < 0 else end + 4)
                self._head_bytes += stop - start
            else:
                stop = min(size, start + (self._body_left or CHUNKED_PIECE))  # 0: not a body of known length
            # httptools takes any buffer: a view, not a copy, of a large body
            super().data_received(data if start == 0 and stop == size else memoryview(data)[start:stop])
            start = stop
            if self._in_head and self._head_bytes >= MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refuse(431, f"the request line and headers exceed {MAX_HEAD_BYTES} bytes, the server's limit")

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, MESSAGE)

    # ------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self._refusal is not None:  # the parser goes on through a read already fed to it: nothing after a
            return                     # refusal becomes a request (nor a response out of order)
        self._reading = True
        self._deadline = self.loop.time() + self.limits.read_timeout  # the request's time starts at its first byte
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._refusal is not None:
            return
        length = coding = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                coding = value if coding is None else coding + b"," + value
        if coding is not None:
            unknown = [c for c in (c.strip() for c in coding.lower().split(b",")) if c and c != b"chunked"]
            if unknown:  # RFC 9112 section 6.1: a transfer coding the server does not understand is a 501
                self._refuse(501, f"Transfer-Encoding {unknown[0].decode('latin-1')[:40]!r} is not supported; send "
                                  "the body as is (chunked, or with a Content-Length)")
                return
        self._in_head, self._head_bytes = False, 0
        self._body_left = int(length) if length is not None and coding is None else None  # the parser checked it
        self._chunks = 0
        super().on_headers_complete()
        if self.cycle is not None:
            self.scope[CYCLE] = self.cycle  # for `client_left`

    def on_chunk_header(self) -> None:  # httptools calls it at each chunk's size line, the last (empty) one too
        self._chunk_counted = False

    def on_body(self, body: bytes) -> None:
        if self._body_left is not None:
            self._body_left -= len(body)
        elif not self._chunk_counted:  # a chunk's data may come in several calls, one per read: counted once
            self._chunk_counted = True
            self._chunks += 1
            if self._chunks > MAX_CHUNKS and self._refusal is None:
                self._refuse(400, f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. Send "
                                  "fewer or larger HTTP chunks.")
        if self._refusal is None:  # a refused request's body goes nowhere
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head, self._reading, self._deadline = True, False, None
        if self._refusal is None:
            super().on_message_complete()

    def _start_asgi_task(self, cycle, app) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        done = self._running
        if done is not None and done.scope.get(CLOSE) and self._refusal is None:
            self.server_state.total_requests += 1
            return self._close_unread()
        super().on_response_complete()  # starts the next pipelined request, if any
        if self._refusal is not None and not self._owed() and not self.transport.is_closing():
            self._send_refusal()
        elif self._held and not self.transport.is_closing():  # uvicorn resumed reading: the held bytes first
            self.flow.pause_reading()
            if len(self.pipeline) < MAX_PIPELINED:
                self.loop.call_soon(self._parse_held)

    def _parse_held(self) -> None:
        """Parse what was held back, now that the pipeline has room; read on where it all fits."""
        if self.transport.is_closing() or self._refusal is not None or not self._held:
            return
        held, self._held = self._held, b""
        self.data_received(held)
        if not self._held and not self.pipeline and (self.cycle is None or len(self.cycle.body) <= HIGH_WATER_LIMIT):
            self.flow.resume_reading()

    def _close_unread(self) -> None:
        """End the connection after a response that refused the request's body while it still
        streamed in (413): nothing more is parsed; what the client still sends is read and
        dropped for LINGER seconds, so that it reads the answer instead of a reset."""
        self._refusal, self._held, self._deadline = b"", b"", None  # nothing after this is parsed
        self.pipeline.clear()
        if not self.transport.can_write_eof() or self.transport.is_closing():
            self.transport.close()
            return
        self.flow.resume_reading()
        self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)

    # ------------------------------------------------------------ read deadline

    def _check_deadline(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._refusal is not None:
            return
        now = self.loop.time()
        if self._deadline is not None and now >= self._deadline:
            if self.flow.read_paused:  # the server holds reading (a pipelined request waits its turn): not the client
                self._deadline = now + self.limits.read_timeout
            elif self._reading:
                return self._refuse(408, f"the request did not arrive whole within {self.limits.read_timeout:g} s "
                                         "of its first byte")
            else:
                return self.transport.close()
        # nothing being read (an answer in the works, an idle keep-alive that uvicorn closes): look again later
        self._timer = self.loop.call_at(self._deadline or now + self.limits.read_timeout, self._check_deadline)

    # ------------------------------------------------------------ refusals

    def _refuse(self, status: int, message: str, extra: bytes = b"") -> None:
        """Answer `status` with `{"error": message}` and close the connection, once the
        responses owed to the requests before the refused one are out (at most
        `read_timeout` more: a response that never ends does not hold the connection).
        The first refusal of a connection is its answer."""
        if self._refusal is not None:
            return
        self._deadline = None
        bad = None if self._in_head else self.cycle  # the refused request, when its headers were complete
        if bad is not None:
            self.pipeline = type(self.pipeline)(entry for entry in self.pipeline if entry[0] is not bad)
            if bad.response_started:  # it was answered (or is being answered): nothing can follow
                self.transport.close()
                return
            bad.disconnected = True  # its application, if running, reads a disconnect; its answer is this
            bad.message_event.set()
        body = json.dumps({"error": message}).encode()
        head = [STATUS_LINE[status]]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: " + str(len(body)).encode() + b"\r\n",
                 extra, b"connection: close\r\n", b"\r\n"]
        self._refusal = b"".join(head) + body
        if self._owed():
            self.flow.pause_reading()  # sent from on_response_complete
            self.loop.call_later(self.limits.read_timeout, self.transport.close)
            return
        self._send_refusal()

    def _send_refusal(self) -> None:
        """The refusal, then end of file; what the client still sends (the rest of a head
        over the limit) is read and dropped for LINGER seconds before the close, so that the
        client reads the answer instead of a reset (closing with unread bytes sends RST)."""
        self.transport.write(self._refusal)
        if not self.transport.can_write_eof() or len(self.connections) > self.limits.max_connections:
            self.transport.close()  # over the cap: its descriptor is wanted back at once
            return
        self.flow.resume_reading()
        self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)

    def _owed(self) -> bool:
        """Whether a request before the refused one still waits for its response."""
        running = self._running
        return bool(self.pipeline) or running is not None and not running.response_complete \
            and not running.disconnected
