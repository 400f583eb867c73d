"""`zoo serve`: the application under uvicorn, bound to loopback unless told otherwise.

On SIGTERM or Ctrl-C both front ends stop taking work at once: uvicorn stops accepting
connections and the gRPC server new calls (open gRPC streams stop reading). In-flight
requests finish (up to the shutdown timeout), then the lifespan's shutdown drains every
model's queue before the process exits.

HTTP requests go through `http.JsonErrorProtocol`: its limits on header size, read time
and open connections, and its JSON error body for the requests it refuses.
"""

from __future__ import annotations

import ipaddress
import logging
import sys

from .app import Settings, create_app

log = logging.getLogger("zoo.serve")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(settings: Settings, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    import uvicorn

    from ..backend import prepare_serving_process

    prepare_serving_process()  # before the artifacts load and import their engines

    from .http import JsonErrorProtocol, Limits

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    log.addHandler(handler)
    log.setLevel(log_level.upper())
    log.propagate = False
    if not _loopback(host):
        log.warning("listening on %s: the server has no authentication; put it behind a proxy that has", host)
    app = create_app(settings)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            server_header=False, timeout_graceful_shutdown=int(settings.shutdown_timeout) or None,
                            lifespan="on", http=JsonErrorProtocol.with_limits(Limits.from_environment()),
                            ws="none")  # no WebSocket routes: an upgrade must not hand the socket past these limits

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            app.state.zoo.begin_shutdown()  # gRPC stops taking calls now, not once HTTP has drained
            await super().shutdown(sockets)

    Server(config).run()
