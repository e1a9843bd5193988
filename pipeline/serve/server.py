"""Running the app on uvicorn: SIGTERM (or SIGINT, SIGHUP, SIGUSR1/2: every stop signal of the other
commands) stops accepting, drains in-flight requests, and the process exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import httptools
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from petal.pipeline.reliability.errors import ConfigError
from petal.pipeline.reliability.signals import STOP_SIGNALS, HeldSignals, not_ignored
from petal.pipeline.serve.app import (
    ANSWERED_BY_SERVER,
    CLIENT_CLOSED,
    NOT_ANSWERED,
    SERVER_ALLOW,
    UNMATCHED,
    build_app,
    connect_refusal,
    error_body,
    method_refusal,
    scope_route,
    version_refusal,
)
from petal.pipeline.serve.batcher import SHUTTING_DOWN
from petal.pipeline.serve.encoding import dumps
from petal.pipeline.serve.metrics import ServeMetrics
from petal.pipeline.serve.service import ServeState
from petal.pipeline.serve.startup import Startup

try:  # NOTE: the socket's send queue (SIOCOUTQ): Unix only; elsewhere the transport's buffer alone
    import fcntl
    import termios
except ImportError:  # pragma: no cover - depends on the platform
    fcntl = termios = None  # type: ignore[assignment]


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
        # NOTE: not one the process was started ignoring (nohup's SIGHUP): HeldSignals left it ignored too
        original = {sig: signal.signal(sig, self.handle_exit) for sig in not_ignored()}
        if self.held is not None and self.held.signum is not None:
            self.handle_exit(self.held.signum, None)
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        # NOTE: a second stop signal of any kind cuts the drain short (uvicorn's own: only a second SIGINT), as a
        # scheduler escalates: SIGTERM, then SIGTERM or SIGKILL; the first one of any kind drains
        if self.should_exit and sig in STOP_SIGNALS:
            self.force_exit = True
            return
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # NOTE: a second signal: uvicorn stops waiting for requests and skips the app's shutdown, whose task
            # would then be cancelled (a traceback); the app's shutdown stops the threads (bounded by a step)
            await self.lifespan.shutdown()


# Requests pipelined on one connection (sent back to back, the answers not read yet): while one of them waits for its
# turn, what arrives after it is held unparsed, up to PIPELINE_BACKLOG_BYTES (then the connection is read no further),
# and parsed PIPELINE_PIECE_BYTES at a time once the queue has emptied. NOTE: uvicorn pauses reading when it queues
# such a request but resumes it after every answer: a client that sent requests without reading the answers had a
# whole socket read (up to 256 KiB: thousands of small requests, or bodies counted by no --max-body-bytes-in-flight)
# parsed and queued per answer, without limit (600,000 pipelined GET /health: the server from 406 MB to 1.7 GB).
# Reading on up to the backlog's bound (rather than pausing) keeps a client's close seen while its requests wait.
PIPELINE_BACKLOG_BYTES = 256 << 10
PIPELINE_PIECE_BYTES = 16 << 10


class _PipelineFlow(FlowControl):
    """uvicorn's read flow control, which does not resume reading while the connection's unparsed backlog is full
    (``PIPELINE_BACKLOG_BYTES``): uvicorn resumes it after every answer and at every ``receive``."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if len(self._protocol._backlog) > PIPELINE_BACKLOG_BYTES:
            return
        super().resume_reading()


# An answer given before the request's body has all arrived (413 by Content-Length or while streaming, 401, 415,
# 404, ... before the body is read) says `Connection: close`; the server then half-closes and reads on, discarding,
# until the body ends, the client closes, LINGER_BYTES more have come or LINGER_S have passed, then closes. Without
# it the server read and discarded a body of any size to keep the connection; a close at once instead resets a
# connection with unread bytes (RST), and a client still sending (httpx, requests) may see the reset, not the answer.
LINGER_BYTES = 1 << 20
HEAD_STARTED = "petal.head_started"  # a scope key: when the request's first byte was read (perf_counter)
LINGER_S = 1.0

NOT_HTTP = ("the request is not valid HTTP/1.1 (a malformed request line, header, Content-Length or chunked body); "
            "the connection is closed")

# A request head (request line and headers) is held by the parser until it ends: one over MAX_HEAD_BYTES is refused
# as it arrives (431; 414 when the request line's URL is what is too long), the connection closed. Without a bound a
# client's endless header or URL grew one bytes object (httptools and uvicorn append each piece: quadratic copying on
# the event loop) for as long as it sent: 300 MB of one header took 370 MB of memory and minutes of the loop's CPU.
# NOTE: nginx holds 32 KiB of headers by default, uvicorn's h11 parser 16 KiB; a head is fed in HEAD_SLICE pieces,
# counted from the first piece after the one it begins in, so a head up to the limit is never refused
MAX_HEAD_BYTES = 64 << 10
MAX_URL_BYTES = (64 << 10) - 1  # httptools' URL parser refuses a longer one
HEAD_SLICE = 4096
TAIL_BYTES = 32


def raw_error(status: int, reason: bytes, message: str, default_headers: list[tuple[bytes, bytes]],
              kind: str = "invalid_request_error") -> bytes:
    """The server's JSON error answer as raw HTTP/1.1 bytes (``Connection: close``), for what the parser refuses
    before any request reaches the app."""
    body = dumps(error_body(status, message, kind))
    head = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
    return b"".join(head) + body


def url_route(url: bytes) -> str:
    """The route label of a request to ``url`` (its path as uvicorn reads it) that never reaches the app."""
    try:
        raw = httptools.parse_url(url).path
    except httptools.HttpParserInvalidURLError:
        return UNMATCHED
    path = raw.decode("latin-1")
    return scope_route({"raw_path": raw, "path": urllib.parse.unquote(path) if "%" in path else path})


# RFC 9110 §5.6.2: a method is a token; one followed by a space and a request line's target and version
REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) [^ \r\n]+ HTTP/\d")


def unknown_method(data: bytes) -> str | None:
    """The method of the first request line in ``data`` that the HTTP parser (llhttp: a fixed list of methods) does
    not know, if ``data`` holds one whole, else ``None`` (not HTTP: a TLS handshake, a broken line, or too little of
    it yet)."""
    for found in REQUEST_LINE.finditer(data):
        method = found.group(1)
        try:
            httptools.HttpRequestParser(None).feed_data(method + b" / HTTP/1.1\r\n")
        except httptools.HttpParserInvalidMethodError:
            return method.decode("ascii")
        except httptools.HttpParserError:
            continue
    return None


def cancel(timer: asyncio.TimerHandle | None) -> None:
    """Cancel ``timer`` if there is one."""
    if timer is not None:
        timer.cancel()


def http_protocol(metrics: ServeMetrics, header_timeout_s: float = 30.0,
                  send_timeout_s: float = 60.0, retry_after_s: int = 1) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) whose answer to a request its parser refuses (a bad
    Content-Length or chunk, a forbidden character in a header, a broken request line) is the server's JSON
    error, counted in ``/metrics`` as route ``unmatched``, instead of uvicorn's text/plain "Invalid HTTP request
    received." (such a request never reaches the app, so the app cannot answer it).

    A connection is held only while it makes progress: a new one that sends nothing is closed after uvicorn's
    keep-alive timeout (5 s), as an idle keep-alive one is, and a request head (line and headers) not complete
    ``header_timeout_s`` after it began is answered 408 (``--header-timeout-s``). NOTE: without them a client that
    connected and sent nothing, or a head a byte at a time, held its connection (a file descriptor and its state)
    for ever: enough of them and the server accepted no one. Likewise an answer the client stops reading: once the
    connection's send buffer is full, the connection is aborted if the client takes nothing for ``send_timeout_s``
    (``--send-timeout-s``); before, its request held the whole answer (tens of MB for 256 queries of k 1000 with
    text) and the connection for ever."""
    async def refuse_draining(scope: Scope, receive: Receive, send: Send) -> None:
        """The answer of a request whose head came after the drain began, behind one still answering: 503 with
        Retry-After, counted by its route; its connection closes after it (``JsonErrorProtocol._refuse_draining``)."""
        body = dumps(error_body(503, f"{SHUTTING_DOWN}: this request arrived after it began draining the requests in "
                                     "flight and is not served; retry", "shutting_down"))
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"retry-after", str(retry_after_s).encode())]})
        await send({"type": "http.response.body", "body": body})
        started = scope.get(HEAD_STARTED)
        metrics.count(scope_route(scope), 503, 0.0 if started is None else time.perf_counter() - started)

    class JsonErrorProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]  # httptools' or h11's, at import
        _head_started: float | None = None  # when the request being read began (its first byte), for its latency

        def _count(self, route: str, status: int, started: float | None = None) -> None:
            """A request the HTTP layer answers or drops itself, counted as the app counts its own
            (``ServeMetrics.count``), its time from its first byte (``started``, else the request being read's)."""
            started = self._head_started if started is None else started
            metrics.count(route, status, 0.0 if started is None else time.perf_counter() - started)

        if issubclass(AutoHTTPProtocol, HttpToolsProtocol):  # NOTE: serve needs httptools; h11 keeps uvicorn's way
            _lingering = False
            _linger_timer: asyncio.TimerHandle | None = None
            _lingered = 0
            _stopping = False
            _held: Any = None  # the cycle whose keep-alive waits for its request's body

            _replaying = False  # a request head fed to a fresh parser only to frame a body (_ignore_upgrade)
            _connect = False  # the head just parsed is a CONNECT's (answered 405 where llhttp stops at its end)
            _in_body = False  # between a request's head and its end (its body is fed as it comes, unsliced)
            _head_open = False  # a request head has begun and not ended
            _head_begun = False  # ... in the piece being fed (not counted: part of that piece came before it)
            _head_bytes = 0  # the head's bytes counted so far (MAX_HEAD_BYTES)
            _url_in_piece = False  # the piece being fed held URL bytes (the head is still in its request line)
            _head_refused = False  # a head over MAX_HEAD_BYTES was answered: the connection only lingers

            _head_timer: asyncio.TimerHandle | None = None  # --header-timeout-s of the head begun

            _running: Any = None  # the cycle whose task was started last (pipelined ones wait in self.pipeline)
            _closing = False  # a request that closes the connection (Connection: close, HTTP/1.0) has been read
            _refusal: Callable[[], None] | None = None  # a refusal (400, 414, 431) waiting for the answers before it
            _ignored = False  # the request being read came after it: never served (NOT_ANSWERED)
            _peer_closed = False  # the client closed its side (or reset the connection)
            _backlog = b""  # what arrived while a pipelined request waited its turn, unparsed (PIPELINE_BACKLOG_BYTES)
            _feeding = False  # the backlog is being parsed (_parse_backlog, shutdown)
            _tail = b""  # the last TAIL_BYTES received: a request line's method begun in them (``unknown_method``)
            expect_100_continue: bool  # uvicorn's: the request being read said "Expect: 100-continue"

            def connection_made(self, transport: asyncio.Transport) -> None:
                super().connection_made(transport)
                self.flow = _PipelineFlow(transport, self)
                self.parser = self._new_parser()
                # NOTE: silent from the start: closed as an idle keep-alive connection is (the first byte stops it)
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)

            def _new_parser(self) -> httptools.HttpRequestParser:
                """A parser of this connection. NOTE: uvicorn's skips, unparsed, whatever follows a request that
                closes the connection (lenient_data_after_close): requests pipelined behind it were counted nowhere.
                This one reads them on (lenient_keep_alive), to count each (``on_headers_complete``), never to serve
                it (RFC 9112 §9.6)."""
                parser = httptools.HttpRequestParser(self)
                # NOTE: lenient_version: any HTTP/D.D reaches the app, which answers an unsupported version 505
                # (``refused_head``); llhttp refused 1.2 or 3.0 as malformed (400) and served 2.0 or 0.9 as HTTP/1.1
                parser.set_dangerous_leniencies(lenient_data_after_close=True, lenient_keep_alive=True,
                                                lenient_version=True)
                return parser

            def _start_asgi_task(self, cycle: Any, app: Any) -> None:
                self._running = cycle
                super()._start_asgi_task(cycle, app)

            def on_message_begin(self) -> None:
                if not self._replaying:
                    self._head_open = self._head_begun = True
                    self._head_bytes = 0
                    self._head_started = time.perf_counter()
                    self._stop_head_timer()
                    self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)
                    super().on_message_begin()

            def _stop_head_timer(self) -> None:
                cancel(self._head_timer)
                self._head_timer = None

            def _head_too_slow(self) -> None:
                self._head_timer = None
                if not self._head_open or self._lingering or self.transport.is_closing():
                    return
                if self.cycle is not None and not self.cycle.response_complete:
                    # NOTE: a head pipelined behind a request still answering: an answer now would come before that
                    # one's; its time is counted again
                    self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)
                    return
                self._refuse_head(408, b"Request Timeout", f"the request line and headers did not arrive within "
                                  f"{header_timeout_s:g} s of their start (--header-timeout-s); the connection is "
                                  "closed")

            def on_url(self, url: bytes) -> None:
                if not self._replaying:
                    self._url_in_piece = True
                    super().on_url(url)

            def on_header(self, name: bytes, value: bytes) -> None:
                if not self._replaying:
                    super().on_header(name, value)

            def on_headers_complete(self) -> None:
                if not self._replaying:
                    self._head_open = False
                    self._in_body = True
                    self._stop_head_timer()
                before = self.cycle
                if not self._replaying and (self._lingering or self._closing):
                    # NOTE: a request pipelined behind one whose answer closes the connection (the discarded body of a
                    # lingering close, or a request that said close): not served, counted; nothing more is read
                    self._ignored = True
                    self._count(url_route(self.url), NOT_ANSWERED)
                    if not self._lingering:
                        self.flow.pause_reading()
                if self._lingering or self._replaying or self._ignored:
                    return
                if self.parser.get_method() == b"CONNECT":
                    # NOTE: a CONNECT (to host:port, as a client configured to use this server as a proxy sends) was a
                    # 400 "not valid HTTP/1.1" (uvicorn cannot parse its target as a URL); what follows its head is a
                    # tunnel's bytes to llhttp (HttpParserUpgrade, below): 405 with the server's Allow, once the
                    # answers before it are out, the rest discarded (a lingering close)
                    self._connect = True
                    return
                if self.expect_100_continue and self.parser.get_http_version() < "1.1":
                    # NOTE: an HTTP/1.0 client's "Expect: 100-continue" MUST be ignored (RFC 9110 §10.1.1): uvicorn sent
                    # it "HTTP/1.1 100 Continue", which such a client takes for its answer (the real one then trails)
                    self.expect_100_continue = False
                super().on_headers_complete()
                cycle = self.cycle
                if cycle is before:  # an upgrade: no cycle
                    return
                cycle.transport = _LingeringClose(self.transport, self, cycle)
                cycle.scope[HEAD_STARTED] = self._head_started
                if cycle.keep_alive:  # NOTE: until the body has arrived, an answer says close (restored below)
                    cycle.keep_alive = False
                    self._held = cycle
                if self._stopping and before is not None and not before.response_complete:
                    self._refuse_draining(cycle, before)

            def on_body(self, body: bytes) -> None:
                if not self._ignored:
                    super().on_body(body)

            def on_message_complete(self) -> None:
                self._in_body = False
                if self._ignored:
                    self._ignored = False
                    return
                if self._connect:  # NOTE: no cycle (uvicorn's would fail on None: a 400); answered in data_received
                    return
                if not self._replaying and (self.parser.get_http_version() == "1.0" or
                                            not self.parser.should_keep_alive()):
                    self._closing = True  # (uvicorn's rule for closing after the answer)
                super().on_message_complete()
                cycle = self.cycle
                if cycle is self._held:
                    self._held = None
                    if not cycle.response_started and not self._stopping:
                        cycle.keep_alive = True  # answered after its body: keep-alive, as before
                if self._lingering:  # the body has ended: nothing unread, a clean close
                    self.end_linger()

            def _parse_backlog(self) -> None:
                """What arrived while a pipelined request waited (``PIPELINE_BACKLOG_BYTES``), parsed a piece at a
                time while no request waits for its turn; reading resumes once the backlog is within its bound."""
                while self._backlog and not self.pipeline and self._refusal is None \
                        and not self.transport.is_closing():
                    piece = self._backlog[:PIPELINE_PIECE_BYTES]
                    self._backlog = self._backlog[PIPELINE_PIECE_BYTES:]
                    self._feeding = True
                    try:
                        self._parse(piece)
                    finally:
                        self._feeding = False
                if len(self._backlog) <= PIPELINE_BACKLOG_BYTES and not self.transport.is_closing():
                    self.flow.resume_reading()

            def data_received(self, data: bytes) -> None:
                if self._refusal is not None:  # nothing after what is refused is read
                    return
                if self._feeding:
                    # NOTE: the rest of a backlog piece handed back by the parser (_ignore_upgrade): before what came
                    # after it (appended, it was parsed out of order)
                    self._backlog = data + self._backlog
                    return
                if not self._lingering and (self._backlog or self.pipeline):
                    self._backlog += data  # NOTE: a request waits its turn: parsed after it (_parse_backlog)
                    if len(self._backlog) > PIPELINE_BACKLOG_BYTES:
                        self.flow.pause_reading()
                    return
                self._parse(data)

            def _parse(self, data: bytes) -> None:
                idle = self.timeout_keep_alive_task
                deadline = idle.when() if idle is not None else None  # (cancelled by the read: _parse_data)
                self._parse_data(data)
                if not self._lingering and not self._head_open and not self._in_body and not self._answering() \
                        and self._refusal is None and self.timeout_keep_alive_task is None \
                        and not self.transport.is_closing():
                    # NOTE: bytes that began no request (blank lines, which the parser skips before a request line)
                    # stopped the keep-alive timer and started no head timer: two bytes held a connection for good.
                    # The idle deadline is the one the connection had: re-armed for a whole --keep-alive-s, a CRLF
                    # sent a little more often held it just the same
                    self.timeout_keep_alive_task = (
                        self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
                        if deadline is None else self.loop.call_at(deadline, self.timeout_keep_alive_handler))

            def _parse_data(self, data: bytes) -> None:
                if not self._lingering:
                    self._unset_keepalive_if_required()
                    before, self._tail = self._tail, data[-TAIL_BYTES:]
                    done = 0  # how much of `data` the parser has been fed
                    try:
                        # NOTE: outside a body (where a head may begin or goes on) in pieces, the head's bytes counted
                        # as they come; a body (the rest of the data) at once
                        while not self._in_body:
                            piece = data[done:done + HEAD_SLICE]
                            self._head_begun = self._url_in_piece = False
                            self.parser.feed_data(piece)
                            done += len(piece)
                            if self._head_open and not self._head_begun:
                                self._head_bytes += len(piece)
                                if self._head_bytes > MAX_HEAD_BYTES:
                                    self._after_answers(self._big_head_refusal())
                                    return
                            if done >= len(data) or self.transport.is_closing():
                                return
                        self.parser.feed_data(data[done:] if done else data)
                    except httptools.HttpParserError as exc:
                        self.logger.warning("Invalid HTTP request received.")
                        method = (unknown_method(before + data[:MAX_HEAD_BYTES])
                                  if isinstance(exc, httptools.HttpParserInvalidMethodError) else None)
                        if method is not None:
                            # NOTE: a method llhttp does not know (BREW, a lower-case "post") was a 400 "not valid
                            # HTTP/1.1"; RFC 9110 §9.1: 501, as the app answers one llhttp knows (PROPFIND)
                            self._after_answers(functools.partial(
                                self._send_closing, 501, b"Not Implemented",
                                method_refusal(method) + "; the connection is closed", "not_implemented"))
                        elif len(getattr(self, "url", b"")) > MAX_URL_BYTES:
                            # NOTE: a URL the HTTP layer cannot parse for its length (64 KiB), whose head is still
                            # under MAX_HEAD_BYTES as counted: 414 as one over it, not a 400 "not valid HTTP/1.1"
                            self._after_answers(functools.partial(
                                self._refuse_head, 414, b"URI Too Long", f"the URL is over the limit of "
                                f"{MAX_URL_BYTES} bytes (send the request's fields in its JSON body); the connection "
                                "is closed"))
                        elif self._http2_preface():
                            self._after_answers(functools.partial(
                                self._send_closing, 505, b"HTTP Version Not Supported", version_refusal("2.0"),
                                "http_version_not_supported"))
                        else:
                            self._refuse_not_http()
                    except httptools.HttpParserUpgrade as exc:
                        if self._connect:
                            self._connect = False
                            self._after_answers(functools.partial(
                                self._refuse_head, 405, b"Method Not Allowed",
                                connect_refusal(self.url.decode("latin-1")), "method_not_allowed",
                                [(b"allow", SERVER_ALLOW.encode())]))
                        elif self._should_upgrade():  # a WebSocket, a WebSocket library installed: uvicorn's way
                            self.handle_websocket_upgrade()
                        else:
                            end = len(data) if not exc.args else min(len(data), done + int(exc.args[0]))
                            self._ignore_upgrade(data[end:])
                    return
                self._lingered += len(data)
                if self._lingered > LINGER_BYTES:
                    self.end_linger()
                    return
                if self._head_refused:  # a head over MAX_HEAD_BYTES: nothing after it is parsed
                    return
                try:
                    self.parser.feed_data(data)  # only to see where the body ends (on_body discards it)
                except Exception:  # anything the parser refuses now (httptools errors): stop reading
                    self.end_linger()

            def _http2_preface(self) -> bool:
                """The parser stopped at HTTP/2's connection preface (``PRI * HTTP/2.0``: prior knowledge, as ``curl
                --http2-prior-knowledge`` or gRPC send): an HTTP/2.0 request line, 505 as any (``refused_head``), not a
                400 "not valid HTTP/1.1"."""
                try:
                    return self.parser.get_method() == b"PRI" and self.parser.get_http_version() == "2.0"
                except Exception:  # NOTE: nothing parsed yet (llhttp's state): not the preface
                    return False

            def _ignore_upgrade(self, rest: bytes) -> None:
                """A request asking to switch protocols (``Connection: Upgrade``; ``curl --http2`` sends ``Upgrade:
                h2c``) is served in HTTP/1.1, the upgrade ignored (RFC 9110 §7.8). NOTE: llhttp ends such a message
                at its headers and hands everything after them over as the new protocol's bytes: its body was lost
                (a POST answered 400 'the body is not valid JSON'), and what followed it on the connection too. The
                parser is replaced by a fresh one, primed with the request's own body framing (Content-Length or
                Transfer-Encoding; its callbacks skipped: the request is already under way, its task not started
                yet), and fed the rest: its body reaches the request, the next requests parse as usual."""
                cycle = self.cycle
                self.parser = self._new_parser()
                framing = [(name, value) for name, value in self.headers
                           if name in (b"content-length", b"transfer-encoding")]
                self._in_body = False  # NOTE: what comes next is a new request's head (counted), or this one's body
                if framing and cycle is not None and not cycle.response_started:
                    self._in_body = True
                    cycle.more_body = True  # NOTE: llhttp said the message was complete: it is not, yet
                    cycle.message_event.clear()
                    if cycle.keep_alive:  # until its body has arrived, an answer says close (on_message_complete)
                        cycle.keep_alive = False
                        self._held = cycle
                    head = b"POST / HTTP/1.1\r\n" + b"".join(b"%s: %s\r\n" % pair for pair in framing) + b"\r\n"
                    self._replaying = True
                    try:
                        self.parser.feed_data(head)
                    finally:
                        self._replaying = False
                if rest:
                    self.data_received(rest)

            def linger(self) -> None:
                """The answer is out but its request's body is still coming: half-close, read on and discard
                (bounded), then close (``LINGER_BYTES``, ``LINGER_S``)."""
                if self._lingering or self.transport.is_closing():
                    return
                self._lingering = True
                if self.transport.can_write_eof():
                    self.transport.write_eof()  # the client's read sees the answer end
                self.flow.resume_reading()
                self._linger_timer = self.loop.call_later(LINGER_S, self.end_linger)

            def end_linger(self) -> None:
                if self._linger_timer is not None:
                    self._linger_timer.cancel()
                    self._linger_timer = None
                if not self.transport.is_closing():
                    self.transport.close()

            def on_response_complete(self) -> None:
                super().on_response_complete()
                self._parse_backlog()
                if self._head_open:
                    # NOTE: a head begun while the answer before it was being made (sent in part, or from the
                    # backlog): uvicorn armed its keep-alive timer (the pipeline empty), which closed the connection
                    # with no answer once it passed; the head's own timer (--header-timeout-s, 408) bounds it
                    self._unset_keepalive_if_required()
                if self._lingering:
                    self._unset_keepalive_if_required()  # NOTE: the linger's own bounds close it
                refusal = self._refusal
                if refusal is not None and not self.transport.is_closing() and not self._answering():
                    self._refusal = None
                    refusal()

            def _answering(self) -> bool:
                """A request of this connection is running or waits to (pipelined)."""
                return bool(self.pipeline) or (self._running is not None and not self._running.response_complete)

            def _after_answers(self, refusal: Callable[[], None]) -> None:
                """``refusal`` (an answer that closes the connection: what came is not taken) now, or once the
                requests before it are answered; nothing more is read meanwhile. NOTE: before, a malformed request
                (400) or a head over the limit (414, 431) pipelined behind a valid request still running was refused
                at once: the client took that answer as its valid request's, whose own never came (its work cut off,
                counted 499). When an answer before it closes the connection, the refusal is never sent and is
                counted as not answered (444; 499 when the client closed)."""
                if not self._answering():
                    refusal()
                    return
                self._refusal = refusal
                self.flow.pause_reading()

            def _refuse_not_http(self) -> None:
                """The parser refused what came: 400 (``NOT_HTTP``), the connection closed, after the answers before
                it (``_after_answers``)."""
                if self._in_body and self.cycle is not None and self.cycle is self._running:
                    # NOTE: the running request's own body is what is refused: this is its answer, counted here (its
                    # handler then sees the connection lost: counted 499 too, before)
                    self.cycle.scope[ANSWERED_BY_SERVER] = True
                    self.send_400_response(NOT_HTTP)
                    return
                if self._in_body and self.pipeline and self.pipeline[0][0] is self.cycle:
                    self.pipeline.popleft()  # a pipelined request's own body: it is never started; the 400 answers it
                self._after_answers(lambda: self.send_400_response(NOT_HTTP))

            def eof_received(self) -> None:
                self._peer_closed = True
                if self._lingering:  # the client closed its side
                    self.end_linger()
                super().eof_received()

            def connection_lost(self, exc: Exception | None) -> None:
                self._drop_pipelined(exc is not None or self._peer_closed)
                if self._refusal is not None:
                    status = CLIENT_CLOSED if exc is not None or self._peer_closed else NOT_ANSWERED
                    self._count(UNMATCHED, status)
                self._stop_head_timer()
                self._stop_send_timer()
                if self._linger_timer is not None:
                    self._linger_timer.cancel()
                    self._linger_timer = None
                super().connection_lost(exc)

            def _drop_pipelined(self, client_closed: bool) -> None:
                """The connection is lost: the request running and those pipelined behind it are answered to nobody.
                NOTE: uvicorn tells only its newest request (``self.cycle``) that the client went away: with requests
                pipelined, that is one never started, so the running one was still embedded and searched (counted
                200) and those behind it were never counted at all. Now the running one sees the disconnect
                (``unless_gone``: 499, its queued work dropped) and each never started is counted by its route: 499
                when the client closed, 444 when the server did (after an answer that said ``Connection: close``, the
                client's own ``Connection: close`` or HTTP/1.0 included; such a request is never served, RFC 9112
                §9.6). NOTE: the 444s were counted nowhere before."""
                running = self._running
                if running is not None and not running.response_complete:
                    running.disconnected = True
                    running.message_event.set()
                status = CLIENT_CLOSED if client_closed else NOT_ANSWERED
                while self.pipeline:
                    cycle, _ = self.pipeline.pop()
                    cycle.disconnected = True
                    self._count(scope_route(cycle.scope), status, cycle.scope.get(HEAD_STARTED))

            def shutdown(self) -> None:
                if self._backlog and not self._lingering and self._refusal is None and not self.transport.is_closing():
                    # NOTE: requests that came before the drain, held unparsed behind a pipelined one, are queued now
                    # (bounded: the backlog's size) and served as pipelined ones are; parsed after the drain began,
                    # they were refused 503 as having arrived after it
                    # NOTE: the parser hands the rest of what it was fed back to the backlog's front after a request
                    # asking to switch protocols (_ignore_upgrade): that rest came before the drain too
                    while self._backlog and self._refusal is None and not self.transport.is_closing():
                        held, self._backlog = self._backlog, b""
                        self._feeding = True
                        try:
                            self._parse(held)
                        finally:
                            self._feeding = False
                self._stopping = True
                if self._head_open and not self._lingering and not self.transport.is_closing():
                    # NOTE: a request arriving as the drain begins (its head begun, not complete): uvicorn closed its
                    # connection with no answer (behind a request still answering: after that answer, which said
                    # close), which a client cannot tell from a crash; it is answered 503 with Retry-After, after the
                    # answers before it (they keep the connection for it), its connection closed (lingering: no reset)
                    self._after_answers(functools.partial(
                        self._refuse_head, 503, b"Service Unavailable", f"{SHUTTING_DOWN}: this request arrived "
                        "after it began draining the requests in flight and is not served; retry", "shutting_down",
                        [(b"retry-after", str(retry_after_s).encode())]))
                    return
                super().shutdown()

            def _refuse_draining(self, cycle: Any, before: Any) -> None:
                """``cycle``, a request whose head came after the drain began, behind ``before`` (still answering), is
                answered 503 (``refuse_draining``) after it, its connection closed then; ``before`` keeps the
                connection for it. NOTE: ``before``'s answer said close (``shutdown``) and this request was dropped
                unanswered (counted 444): a client that had sent it before that answer came saw its connection
                closed with no answer. Once ``before``'s answer has begun (saying close) it is too late: this one is
                not answered (RFC 9112 §9.6), as before."""
                if before.response_started:
                    return
                before.keep_alive = True  # NOTE: False only by ``shutdown`` (a client's close never gets here)
                assert self.pipeline and self.pipeline[0][0] is cycle
                self.pipeline[0] = (cycle, refuse_draining)

            def _big_head_refusal(self) -> Callable[[], None]:
                """The refusal of a request head over ``MAX_HEAD_BYTES`` so far: 414 when the URL is what is still
                arriving, else 431."""
                if self._url_in_piece:  # NOTE: the parser is still in the request line
                    status, reason = 414, b"URI Too Long"
                    what = "the URL (send the request's fields in its JSON body)"
                else:
                    status, reason = 431, b"Request Header Fields Too Large"
                    what = "the headers (a header too large, or too many)"
                return functools.partial(self._refuse_head, status, reason, f"the request line and headers are over "
                                         f"the limit of {MAX_HEAD_BYTES} bytes: {what}; the connection is closed")

            def _refuse_head(self, status: int, reason: bytes, message: str, kind: str = "invalid_request_error",
                             headers: list[tuple[bytes, bytes]] | None = None) -> None:
                """Answer a request head that is not taken (too large, too slow) with the JSON error ``status``,
                counted as route ``unmatched``; what was held of it is dropped, the rest discarded unparsed while the
                connection lingers, then closes."""
                self._stop_head_timer()
                self._head_open = False
                self.logger.warning("Request head refused: %d %s.", status, reason.decode())
                self.transport.write(raw_error(status, reason, message,
                                               [*self.server_state.default_headers, *(headers or [])], kind))
                self._count(UNMATCHED, status)
                self.url = b""
                self.headers: list[tuple[bytes, bytes]] = []
                self.parser = self._new_parser()  # NOTE: drops the part of the head it held
                self._head_refused = True  # the rest of the head is discarded unparsed
                # NOTE: a close at once, with the head still arriving, resets the connection: a client still sending
                # may see the reset, not the answer
                self.linger()

        _send_stalled: asyncio.TimerHandle | None = None  # --send-timeout-s, while the send buffer is full
        _send_left = 0  # bytes buffered for the client when the timer was set

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_stalled is None:
                self._send_left = self._unsent()
                self._send_stalled = self.loop.call_later(send_timeout_s, self._client_not_reading)

        def _unsent(self) -> int:
            """Bytes written for the client and not yet taken by it: the transport's buffer and, where the system says
            (Linux: SIOCOUTQ), the socket's send queue (a client reading slowly drains it long before the kernel asks
            the transport for more)."""
            left = self.transport.get_write_buffer_size()
            sock = self.transport.get_extra_info("socket")
            if sock is not None and fcntl is not None and hasattr(termios, "TIOCOUTQ"):
                with contextlib.suppress(OSError, ValueError):
                    left += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
            return left

        def resume_writing(self) -> None:
            self._stop_send_timer()
            super().resume_writing()

        def _stop_send_timer(self) -> None:
            cancel(self._send_stalled)
            self._send_stalled = None

        def _client_not_reading(self) -> None:
            """``send_timeout_s`` since the send buffer filled (or since the client last took some of it): if it took
            nothing, the connection is aborted (what was buffered for it dropped, also after a close that waits for
            it) and its request sees the client gone."""
            self._send_stalled = None
            left = self._unsent()
            if left < self._send_left:  # NOTE: it took some (nothing is added while writing is paused)
                self._send_left = left
                self._send_stalled = self.loop.call_later(send_timeout_s, self._client_not_reading)
                return
            self.logger.warning("The client read nothing of its answer for %g s: connection aborted.", send_timeout_s)
            self.transport.abort()

        def send_400_response(self, msg: str) -> None:
            self._send_closing(400, b"Bad Request", NOT_HTTP)

        def _send_closing(self, status: int, reason: bytes, message: str, kind: str = "invalid_request_error") -> None:
            """The JSON error ``status`` for what the parser refuses, counted as route ``unmatched``; the connection
            closed. NOTE: raw bytes for both parsers (h11's state does not matter: the connection closes right after)"""
            self.transport.write(raw_error(status, reason, message, self.server_state.default_headers, kind))
            self.transport.close()
            self._count(UNMATCHED, status)

    return JsonErrorProtocol


class _LingeringClose:
    """A request's view of its connection's transport: ``close`` once the answer is complete while the request's
    body is still arriving lingers (``JsonErrorProtocol.linger``) instead of resetting it; any other close, and
    everything else, is the transport's."""

    def __init__(self, transport: asyncio.Transport, protocol: Any, cycle: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self._cycle = cycle
        self.write = transport.write  # NOTE: what a request calls most, without __getattr__
        self.is_closing = transport.is_closing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        cycle = self._cycle
        if cycle.response_complete and cycle.more_body and not cycle.disconnected:
            self._protocol.linger()
        else:
            self._transport.close()


def server_for(startup: Startup, host: str, port: int, log_level: str = "warning",
               access_log: bool = False) -> DrainingServer:
    config = uvicorn.Config(build_app(startup), host=host, port=port, log_level=log_level, access_log=access_log,
                            http=http_protocol(startup.metrics, startup.settings.header_timeout_s,
                                               startup.settings.send_timeout_s, startup.settings.retry_after_s),
                            timeout_graceful_shutdown=startup.settings.drain_timeout_s,  # type: ignore[arg-type]  # uvicorn annotates int; any number of seconds works
                            timeout_keep_alive=startup.settings.keep_alive_s,  # type: ignore[arg-type]  # the same
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
