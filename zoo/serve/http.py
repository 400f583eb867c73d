"""uvicorn's HTTP protocol with one change: a request its parser refuses (a malformed
request line or header, both Content-Length and Transfer-Encoding) is answered with the
server's JSON error body instead of uvicorn's text/plain one, so every client-facing
error has one shape, `{"error": ...}`, including those that never reach the application.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # httptools: a core dependency

MESSAGE = ("the HTTP request could not be parsed: a malformed request line or header, or both Content-Length "
           "and Transfer-Encoding")


class JsonErrorProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": MESSAGE}).encode()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: " + str(len(body)).encode() + b"\r\n",
                 b"connection: close\r\n", b"\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
