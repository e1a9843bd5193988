"""Running the app on uvicorn: SIGTERM (or SIGINT, SIGHUP, SIGUSR1/2: every stop signal of the other
commands) stops accepting, drains in-flight requests, and the process exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Iterator

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from petal.pipeline.reliability.errors import ConfigError
from petal.pipeline.reliability.signals import STOP_SIGNALS, HeldSignals
from petal.pipeline.serve.app import UNMATCHED, build_app
from petal.pipeline.serve.encoding import dumps
from petal.pipeline.serve.metrics import ServeMetrics
from petal.pipeline.serve.service import ServeState
from petal.pipeline.serve.startup import Startup


class DrainingServer(uvicorn.Server):
    """uvicorn, minus re-raising the stop signal after the graceful shutdown (which would exit 143); a stop
    signal held before it ran (``HeldSignals``) stops it as soon as it starts."""

    held: HeldSignals | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # NOTE: SIGHUP (the terminal went away) and SIGUSR1/2 drain too, as every other command stops on them
        original = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        if self.held is not None and self.held.signum is not None:
            self.handle_exit(self.held.signum, None)
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # NOTE: a second signal: uvicorn stops waiting for requests and skips the app's shutdown, whose task
            # would then be cancelled (a traceback); the app's shutdown stops the threads (bounded by a step)
            await self.lifespan.shutdown()


NOT_HTTP = ("the request is not valid HTTP/1.1 (a malformed request line, header, Content-Length or chunked body); "
            "the connection is closed")


def http_protocol(metrics: ServeMetrics) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) whose answer to a request its parser refuses (a bad
    Content-Length or chunk, a forbidden character in a header, a broken request line) is the server's JSON
    error, counted in ``/metrics`` as route ``unmatched``, instead of uvicorn's text/plain "Invalid HTTP request
    received." (such a request never reaches the app, so the app cannot answer it)."""
    body = dumps({"error": {"message": NOT_HTTP, "type": "invalid_request_error", "code": 400}})
    counter = metrics.requests.labels(route=UNMATCHED, status="400")

    class JsonErrorProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]  # httptools' or h11's, at import
        def send_400_response(self, msg: str) -> None:
            # NOTE: raw bytes for both parsers (h11's state does not matter: the connection closes right after)
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                        % len(body))
            self.transport.write(b"".join(head) + body)
            self.transport.close()
            counter.inc()

    return JsonErrorProtocol


def server_for(startup: Startup, host: str, port: int, log_level: str = "warning",
               access_log: bool = False) -> DrainingServer:
    config = uvicorn.Config(build_app(startup), host=host, port=port, log_level=log_level, access_log=access_log,
                            http=http_protocol(startup.metrics),
                            timeout_graceful_shutdown=startup.settings.drain_timeout_s,  # type: ignore[arg-type]  # uvicorn annotates int; any number of seconds works
                            lifespan="on")
    return DrainingServer(config)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``ConfigError``, exit 78, when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # NOTE: proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP; without it
    # Nagle holds a response's body behind its headers until the client's delayed ACK (40 ms a request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def serve(state: ServeState | Startup, sock: socket.socket, log_level: str = "warning",
          access_log: bool = False, held: HeldSignals | None = None) -> bool:
    """Serve on ``sock`` until a stop signal, then drain (in-flight requests finish) and return. A
    ``Startup`` loads while the port answers; a load that fails stops the server and is raised here.

    Requests still running when --drain-timeout-s passes are answered 503 (``Startup.cut_off`` counts them).
    Returns whether the engine and search threads have stopped (False: a step still ran after
    ``THREAD_STOP_S``; the process should end without waiting for it)."""
    startup = state if isinstance(state, Startup) else Startup(state.settings, state.metrics, state=state)
    host, port = sock.getsockname()[:2]
    sys.setswitchinterval(startup.settings.switch_interval_ms / 1000)  # see ServeSettings
    server = server_for(startup, host, port, log_level, access_log)
    server.held = held
    startup.request_exit = lambda: setattr(server, "should_exit", True)
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn exits 3 when its startup fails
        raise ConfigError(f"petal serve could not start on {host}:{port} (exit {exc.code}; see above)") from exc
    finally:
        startup.forced = server.force_exit
        stopped = startup.close_threads()  # NOTE: whatever ended the server (idempotent)
    if startup.error is not None:
        raise startup.error
    return stopped
