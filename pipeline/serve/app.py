"""The HTTP surface (Starlette): routes, API key, body limits, error bodies, metrics per route.

```
POST /v1/embeddings  OpenAI-compatible embeddings           (API key)
POST /search         embed queries (or take vectors), search (API key); an index of precomputed vectors: vectors only
GET  /v1/models      the served model (and /v1/models/{id}; none for an index of vectors without --model)  (API key)
GET  /health         the process is alive
GET  /ready          model and index loaded: version, refusals
GET  /metrics        Prometheus text
OPTIONS              any route, and ``OPTIONS *``: 204 with ``Allow`` (no key)
```

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape; ``param``: the request field the
error is about, or null; ``code``: the HTTP status): 400 bad JSON or a query string
(no route takes one), 401 wrong or missing key, 404 unknown model or route (a path with an encoded slash, ``%2F``, where
a route has a ``/``, included), 405 a standard method the route does not take, 413 body or a per-request limit, 415 a
body declared as something else than JSON (``curl -d``'s form encoding) or in another charset than UTF-8, 501 a method
the server does not implement or a body in a transfer coding other than chunked, 417 an ``Expect`` other than
``100-continue``, 422 wrong fields or
types (or a text that the model embeds to NaN or infinity, by its item), 503 queue full or still loading
(with Retry-After). A request whose client closed the connection before its answer is counted as 499 (nginx's
"client closed request"; nothing is sent): what it had queued for the engine or a search is taken out of the queue.

The app answers from the first second: while the model and index load (``Startup``), ``/health`` is 200,
``/ready`` and the API answer 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

from prometheus_client import Gauge
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from petal.pipeline.reliability.errors import quote_text
from petal.pipeline.serve.batcher import SHUTTING_DOWN, Overloaded, ShuttingDown, ThreadStopped
from petal.pipeline.serve.encoding import dumps
from petal.pipeline.serve.requests import RequestError, parse_embeddings, parse_json, parse_search
from petal.pipeline.serve.service import ServeState
from petal.pipeline.serve.startup import Startup
from petal.pipeline.serve.timing import SPANS, span
from petal.pipeline.serve.timing import header as timing_header

log = logging.getLogger("petal.serve")
Handler = Callable[[ServeState, Request], Awaitable[Any]]
T = TypeVar("T")
UNMATCHED = "unmatched"  # the route label of requests no route takes (a fixed label: paths would be unbounded)
ROUTES = ("/v1/embeddings", "/search", "/v1/models", "/health", "/ready", "/metrics")  # and /v1/models/{model}
POST_ROUTES = ROUTES[:2]
CLIENT_CLOSED = 499  # the status counted for a request whose client closed the connection first (nginx's)
# the status counted for a request pipelined behind an answer that closed the connection (nginx's "no response"): read,
# never served nor answered (RFC 9112 §9.6), the client retries it on a new connection
NOT_ANSWERED = 444
# a scope key the server sets on a request it has answered itself (its body refused by the HTTP parser: 400, counted
# there): the handler's own ending (the disconnect it then sees) is not counted again, as a 499
ANSWERED_BY_SERVER = "petal.answered_by_server"
ASTERISK = "*"  # the route label (and path) of ``OPTIONS *``: the server as a whole (RFC 9110 §9.3.7)


def allow_header(methods: set[str] | None) -> str:
    """The ``Allow`` value of a route taking ``methods`` (Starlette adds HEAD to GET): they and OPTIONS, in a fixed
    order."""
    taken = (methods or set()) | {"OPTIONS"}
    return ", ".join(m for m in ("GET", "HEAD", "POST", "OPTIONS") if m in taken)


class NoRoute(RequestError):
    """A 404 for a path that a route's pattern matched but that names nothing it serves (``/v1/models/``): counted as
    ``unmatched``, as a path no route takes."""


def route_label(path: str) -> str:
    """The ``route`` label ``/metrics`` counts a request to ``path`` under (as its endpoint or Starlette's 404/405)."""
    if path in ROUTES:
        return path
    # NOTE: "/v1/models/" (and "//"...) names no model: a path no route takes, answered 404 "no route" as such; so
    # does "/v1/models/ID/" (a trailing slash, as on every other route: its GET was "no route", its OPTIONS 204 with
    # an Allow of GET, its DELETE 405)
    model_path = path.startswith("/v1/models/") and path[11:].strip("/") and not path.endswith("/")
    return "/v1/models/{model}" if model_path else UNMATCHED


# RFC 9110 §9: the standard methods (and PATCH, RFC 5789): on a route that does not take one, 405 with Allow; any other
# method (WebDAV's PROPFIND, BREW, a lower-case "post": methods are case-sensitive) is one the server does not implement
STANDARD_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"))
SERVER_ALLOW = "GET, HEAD, POST, OPTIONS"  # the methods some route takes: the Allow of ``OPTIONS *``


def method_refusal(method: str) -> str:
    """The 501 message of a request whose method the server does not implement."""
    return (f"the method {quote_text(method, 40)} is not implemented by this server (it takes {SERVER_ALLOW}; "
            "methods are case-sensitive)")


def connect_refusal(target: str) -> str:
    """The 405 message of a ``CONNECT`` (to ``target``): a method this server knows and no route takes, whatever the
    target (RFC 9110 §9.3.6: asks for a tunnel; this server is no proxy)."""
    return (f"CONNECT {quote_text(target, 80)} is not allowed: this server is no proxy and opens no tunnel (it takes "
            f"{SERVER_ALLOW}); the connection is closed")


def routed_path(raw_path: bytes, path: str) -> str | None:
    """The path a request is routed by: ``path`` (uvicorn's decoding of ``raw_path``, every ``%XX`` undone), or
    ``None`` (no route: 404) when ``raw_path`` holds an encoded slash (``%2F``) that the decoding made a separator.

    NOTE: ``/v1%2Fembeddings`` was served as ``/v1/embeddings`` (RFC 3986 §2.2: an encoded reserved character is data,
    not a delimiter). Within the model id of ``/v1/models/{id}`` it is the id's own slash, as the openai client sends
    ``BAAI/bge-small`` (``/v1/models/BAAI%2Fbge-small``): taken."""
    if b"%2f" not in raw_path.lower():
        return path
    parts = raw_path.split(b"/", 3)  # NOTE: b"", b"v1", b"models", the id (its slashes, encoded or not)
    model = len(parts) == 4 and [urllib.parse.unquote_to_bytes(part) for part in parts[:3]] == [b"", b"v1", b"models"]
    return path if model else None


def scope_route(scope: Scope) -> str:
    """The ``route`` label of the request of ``scope`` (``route_label`` of the path it is routed by)."""
    path = routed_path(scope.get("raw_path") or scope["path"].encode(), scope["path"])
    return UNMATCHED if path is None else route_label(path)


def query_refusal(scope: Scope, route: str) -> str | None:
    """The 400 message of a request to ``route`` with a query string, else ``None``. No route reads one: its fields
    are the JSON body's (``/search``, ``/v1/embeddings``), and the other routes take none. NOTE: ``POST /search?k=5``
    was answered with the default ``k`` (10), the parameter silently ignored; an empty query (``/search?``) is none."""
    query = scope.get("query_string", b"")
    if not query:
        return None
    text = query.decode("latin-1")
    names = list(dict.fromkeys(name for name, _ in urllib.parse.parse_qsl(text, keep_blank_values=True)))
    given = (f"the query parameter(s) {', '.join(quote_text(n, 40) for n in names)}" if names
             else f"the query string {quote_text(text, 80)}")
    where = (f"{route} reads its fields from the JSON body only, never from the URL" if route in POST_ROUTES
             else f"{route} takes no query parameters")
    return f"{given} cannot be taken: {where}; send the URL without '?...'"


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # NOTE: dates or decimals of metadata columns are written as str() (encoding.dumps)
    content = body if isinstance(body, bytes) else dumps(body)
    return Response(content, status_code=status, headers=headers, media_type="application/json")


MESSAGE_CHARS = 1024  # the longest error message: what a client sent is quoted in it, cut past this


def bounded(message: str, limit: int = MESSAGE_CHARS) -> str:
    """``message`` cut in the middle to at most ``limit`` characters: its start names the field, its end the limit
    or the form to use; between them is what the client sent (a model name, a filter, unknown fields), which
    can be megabytes."""
    if len(message) <= limit:
        return message
    room = limit - len(f" ... ({len(message)} characters cut) ... ")  # NOTE: the widest count the marker can state
    head = room * 2 // 3
    tail = room - head
    return f"{message[:head]} ... ({len(message) - head - tail} characters cut) ... {message[len(message) - tail:]}"


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """The JSON error of every answer that is one, in OpenAI's shape (what the ``openai`` client reads into its
    exception's ``message``, ``type``, ``param`` and ``code``). NOTE: ``param`` was missing: a client that reads
    ``exc.param`` (or checks the shape) got nothing to say which field was wrong."""
    # NOTE: a field's name is the client's: cut as the message is bounded (a repeated 200,000-character key was
    # echoed whole, a 200 KB answer)
    return {"error": {"message": bounded(message), "type": kind, "param": None if param is None else param[:MAX_PARAM],
                      "code": status}}


MAX_PARAM = 100  # characters of error.param: a field's name, as the client sent it


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None,
           param: str | None = None) -> Response:
    return _json(error_body(status, message, kind, param), status, headers)


JSON_CHARSETS = ("utf-8", "utf8", "us-ascii")  # a charset a JSON body may declare: UTF-8, or ASCII (its subset)


def require_json(request: Request) -> None:
    """415 for a body declared as something else than JSON: ``application/json`` and ``application/*+json`` are
    taken (with any parameters but a ``charset`` other than UTF-8, ``JSON_CHARSETS``: 415 naming it), and so is a body
    without a Content-Type (raw HTTP clients; read as JSON, as before). ``curl -d`` declares
    ``application/x-www-form-urlencoded`` (and Python's ``urllib`` too): the message says what to send. A
    ``Content-Encoding`` other than ``identity`` (gzip, ...) is 415 too, with ``Accept-Encoding: identity``; a
    ``Transfer-Encoding`` other than chunked is 501 (RFC 9112 §6.1)."""
    # NOTE: no content coding is decoded: a gzip body read as JSON was a misleading 400 ("can't decode byte 0x8b"),
    # and a plain body labelled gzip was taken; 415 with Accept-Encoding (RFC 7694), the body unread
    # NOTE: the HTTP parser undoes chunked only: a body in another transfer coding (gzip, chunked) reached the JSON
    # reader still compressed (a misleading 400 "can't decode byte 0x8b"); RFC 9112 §6.1: 501 for a coding not known
    # NOTE: every Transfer-Encoding header (identity, then "gzip, chunked": the first alone was judged)
    transfer = [c.strip().lower() for header in request.headers.getlist("transfer-encoding")
                for c in header.split(",") if c.strip()]
    unknown = [c for c in transfer if c not in ("chunked", "identity")]
    if unknown:
        raise RequestError(501, f"the body is sent with Transfer-Encoding {quote_text(', '.join(transfer), 80)}; this "
                                "server decodes only chunked: send the JSON uncompressed", kind="not_implemented")
    # NOTE: every Content-Encoding header (two of them, identity then gzip, were judged by the first: the gzip body a
    # misleading 400 "not valid JSON")
    codings = [c.strip() for header in request.headers.getlist("content-encoding") for c in header.split(",")]
    coding = ", ".join(c for c in codings if c)
    if any(c.lower() != "identity" for c in codings if c):
        raise RequestError(415, f"the body is declared as Content-Encoding {quote_text(coding, 80)}; this server "
                                "decodes no content coding: send the JSON uncompressed (no Content-Encoding)",
                           headers={"Accept-Encoding": "identity"})
    declared = request.headers.get("content-type", "").strip()
    media, *params = declared.split(";")
    media = media.strip().lower()
    if not declared or media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        # NOTE: a body declared in another charset (requests' data=text.encode("latin-1") with its charset said) was
        # read as UTF-8: a misleading 400 "not valid JSON (UTF-8)", or, where its bytes happen to be UTF-8, another text
        charset = next((value.strip().strip('"') for name, is_, value in (p.partition("=") for p in params)
                        if is_ and name.strip().lower() == "charset"), None)
        if charset is not None and charset.lower() not in JSON_CHARSETS:
            raise RequestError(415, f"the body is declared in charset {quote_text(charset, 40)}; this server reads "
                                    "JSON as UTF-8 only (RFC 8259): send it UTF-8 encoded, as 'Content-Type: "
                                    "application/json' (or '; charset=utf-8')",
                               headers={"Accept-Post": "application/json"})
        return
    hint = (" (curl -d sends application/x-www-form-urlencoded: add -H 'Content-Type: application/json', or use "
            "curl --json)") if media == "application/x-www-form-urlencoded" else ""
    raise RequestError(415, f"the body is declared as Content-Type {quote_text(declared, 80)}; this route takes JSON: "
                            f"send 'Content-Type: application/json'{hint}", headers={"Accept-Post": "application/json"})


# RFC 9112 §3.2, RFC 3986 §3.2.2: Host is uri-host [":" port]: an IP literal in brackets, or a reg-name (maybe empty)
HOST_VALUE = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]*)?")


# request headers that the server reads and that are one value each (RFC 9110 §5.3: never repeated): two of them are
# 400, whichever a proxy in front would have taken (its check of one, petal's use of the other)
SINGLE_HEADERS = (b"host", b"content-type", b"authorization")


def version_refusal(version: str) -> str:
    """The 505 message of a request in ``HTTP/{version}``."""
    return (f"HTTP/{version} is not supported: this server speaks HTTP/1.1 (and HTTP/1.0) on this port; send the "
            "request as HTTP/1.1")


def expectation_refusal(scope: Scope) -> str | None:
    """The 417 message of an HTTP/1.1 request whose ``Expect`` holds an expectation other than ``100-continue`` (the
    only one HTTP defines, in any case), else ``None``. NOTE: such a request (``Expect: 200-ok``, ``Expect:
    100-continue, x-foo``) was served as if the header were not there, and one that waits for the expectation before
    sending its body waited until a timeout; RFC 9110 §10.1.1: 417. HTTP/1.0 predates ``Expect``: ignored there, as
    its ``100-continue`` must be."""
    if scope.get("http_version") == "1.0":
        return None
    members = [member.strip() for name, value in scope["headers"] if name == b"expect"
               for member in value.decode("latin-1").split(",") if member.strip()]
    unmet = list(dict.fromkeys(m for m in members if m.lower() != "100-continue"))
    if not unmet:
        return None
    return (f"the expectation(s) {', '.join(quote_text(m, 40) for m in unmet)} of the Expect header cannot be met: "
            "this server meets only 'Expect: 100-continue' (RFC 9110 §10.1.1); send the request without the others")


def refused_head(scope: Scope) -> tuple[int, str, str] | None:
    """``(status, message, kind)`` for a request head the server refuses whatever its route, else ``None``: 505 for an
    HTTP major version other than 1 (RFC 9110 §15.6.6: ``HTTP/2.0``, ``HTTP/3.0`` or ``HTTP/0.9`` on an HTTP/1.1
    connection was served as HTTP/1.1); 400 for an HTTP/1.1 request without a Host header, with more than one, or with
    one that is not ``host[:port]`` (RFC 9112 §3.2: the server MUST), and for a repeated Content-Type or Authorization
    (``SINGLE_HEADERS``: the first was taken, where a proxy may check the last); 417 for an expectation other than
    ``100-continue`` (``expectation_refusal``). NOTE: HTTP/1.0 needs no Host; an HTTP/1.x of a higher minor (1.2) is
    served as 1.1 (RFC 9110 §2.5)."""
    version = scope.get("http_version", "1.1")
    if not version.startswith("1."):
        return 505, version_refusal(version), "http_version_not_supported"
    headers = scope["headers"]
    single = [(name, value) for name, value in headers if name in SINGLE_HEADERS]
    names = [name for name, _ in single]
    if len(set(names)) < len(names):
        name = next(name for name in SINGLE_HEADERS if names.count(name) > 1)
        return (400, f"the request has {names.count(name)} {name.decode().title()} headers: send exactly one "
                     "(RFC 9110 §5.3, RFC 9112 §3.2)", "invalid_request_error")
    host = dict(single).get(b"host")
    if host is None:
        if version == "1.0":
            return None
        return (400, f"an HTTP/{version} request must carry a Host header (RFC 9112 §3.2): add 'Host: HOST[:PORT]'",
                "invalid_request_error")
    if HOST_VALUE.fullmatch(host) is None:
        return (400, f"the Host header {quote_text(host.decode('latin-1'), 80)} is not HOST[:PORT] "
                     "(RFC 9112 §3.2)", "invalid_request_error")
    unmet = expectation_refusal(scope)
    if unmet is not None:
        return 417, unmet, "expectation_failed"
    return None


def refused_request(scope: Scope) -> tuple[int, str, str, dict[str, str]] | None:
    """``(status, message, kind, headers)`` for a request no route takes whatever its path matches, else ``None``:
    501 for a method the server does not implement (``STANDARD_METHODS``: RFC 9110 §9.1; it was a 405, or a 400 "not
    valid HTTP/1.1" where the HTTP parser knows no such method, ``JsonErrorProtocol``); 405 for ``CONNECT``
    (``connect_refusal``: was a 404 "no route", or a 400 "not valid HTTP/1.1" for its usual target, ``host:port``);
    404 for a path whose encoded
    slash a route would take for a separator (``routed_path``)."""
    method = scope["method"]
    if method not in STANDARD_METHODS:
        return 501, method_refusal(method), "not_implemented", {}
    if method == "CONNECT":  # NOTE: the HTTP layer answers it first (``JsonErrorProtocol``): here for any other server
        return 405, connect_refusal(scope["path"]), "method_not_allowed", {"Allow": SERVER_ALLOW, "Connection": "close"}
    raw = scope.get("raw_path") or scope["path"].encode()
    if routed_path(raw, scope["path"]) is None:
        sent = raw.decode("latin-1")
        return (404, f"no route {sent!r} (an encoded slash, %2F, is part of a path segment, never a separator)",
                "not_found", {})
    return None


class ClientGone(Exception):
    """The client closed the connection before its answer (``CLIENT_CLOSED``): nobody reads one."""


def _uncancel() -> None:
    """Take back one ``cancel()`` of the running task, once its ``CancelledError`` is handled (Python 3.11+: a task
    still counted as cancelling is cancelled again by ``asyncio.timeout`` and the like)."""
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    if uncancel is not None:
        uncancel()


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work`` (the request's handling, once its body is read), cancelled as soon as the client closes the connection:
    ``ClientGone``. The cancellation reaches what ``work`` awaits (``TokenBatcher``, ``SearchBatcher``): what it
    queued and no thread has started leaves the queue; an engine step or a search already running finishes, and its
    answer is dropped. Without it a request whose client had gone (a short timeout, then a retry: overload) was still
    embedded and searched, and counted 200.

    NOTE: not uvicorn's cancellation at the end of the drain (``--drain-timeout-s``): that ``CancelledError`` goes up
    as it is, and is answered 503 (``cut off``)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        try:
            # NOTE: the body has been read: the server's next message is http.disconnect, when the connection is
            # lost (or once the answer is complete, when this watcher is cancelled already)
            while (await request.receive())["type"] != "http.disconnect":
                pass
        except Exception:  # NOTE: a receive that fails says nothing of the client: the request runs on
            return
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise  # the drain's (503), or both: the client is gone either way
        _uncancel()
        raise ClientGone() from None
    finally:
        watcher.cancel()


class Take(Protocol):
    """``BodyBudget.claim``'s ``take``."""

    def __call__(self, n: int, coming: int = 0, parsed: bool = False) -> None: ...


class BodyBudget:
    """The bytes of request bodies held at once by every request together (``--max-body-bytes-in-flight``): a body
    counts from its first byte until its request is answered (read, parsed, served), and once parsed, what the parsed
    request holds (``held_bytes``) when that is more. A body that would take the total past the limit is refused, 503
    with Retry-After (``Overloaded``): before it is read when its Content-Length would not fit now, else as it streams,
    or once parsed.

    NOTE: ``--max-body-bytes`` bounds one request only: before, N connections sending large bodies (slowly, or queued
    behind a busy engine) held N bodies, memory without bound under load. Bytes are counted as they arrive, never by
    the length a client declares: connections that declare large bodies and send nothing hold nothing, so they cannot
    keep other requests out. NOTE: a request holds its parsed form until answered, up to ~4x its body (token ids
    ``7,`` as int64, texts of 4-byte characters): counting the body only let 16 bodies of 4 MB hold 375 MB more than
    the 64 MB bound said. One event loop takes and gives: no lock."""

    def __init__(self, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.held = 0
        self.gauge = gauge  # petal_body_bytes

    @contextlib.contextmanager
    def claim(self) -> Iterator[Take]:
        """``take(n, coming)`` for one request's body: ``n`` bytes more are held, ``coming`` more are declared (refused
        now if they would not fit); all it took is given back at the end. ``parsed``: ``n`` is what the parsed request
        holds beyond its body (``held_bytes``), refused only when other requests hold bytes too: alone, a request
        whose body fits always goes."""
        taken = 0

        def take(n: int, coming: int = 0, parsed: bool = False) -> None:
            nonlocal taken
            if self.held + n + coming > self.limit and not (parsed and self.held == taken):
                if parsed:
                    raise Overloaded(f"requests in flight hold {self.held - taken} bytes and this one's body of "
                                     f"{taken} bytes holds {taken + n} parsed (texts as Python strings, token ids as "
                                     f"8-byte integers) (limit {self.limit} bytes, --max-body-bytes-in-flight)")
                raise Overloaded(f"requests in flight hold {self.held} bytes (their bodies, or these parsed when "
                                 f"more) and this one needs {n + coming} more (limit {self.limit} bytes, "
                                 "--max-body-bytes-in-flight)")
            self.held += n
            taken += n
            self.gauge.set(self.held)

        try:
            yield take
        finally:
            if taken:
                self.held -= taken
                self.gauge.set(self.held)


ANSWER_PIECE = 1 << 20  # an answer is handed to the connection this many bytes at a time


class HeldAnswer(Response):
    """An answer whose bytes count in ``AnswerBudget`` until its client has taken all but its last piece (or is
    gone): it is sent ``ANSWER_PIECE`` bytes at a time, each after the connection's send buffer has drained.

    NOTE: a whole answer written at once sits in the transport's buffer until the client reads it (up to
    --send-timeout-s when it reads nothing): the piece at a time is what makes "sent" mean "taken"."""

    def __init__(self, answer: Response, release: Callable[[], None]) -> None:
        self.__dict__.update(answer.__dict__)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            body = self.body
            for start in range(0, max(len(body), 1), ANSWER_PIECE):
                end = start + ANSWER_PIECE
                await send({"type": "http.response.body", "body": body[start:end], "more_body": end < len(body)})
        finally:
            self.body = b""
            self.release()


class AnswerBudget:
    """The bytes of /search and /v1/embeddings answers held at once until their clients take them
    (``--max-answer-bytes-in-flight``). An answer that would take the total past the limit is refused, 503 with
    Retry-After (``Overloaded``), unless no other answer is held: one answer of any size always goes.

    NOTE: a request of 4 KB (256 queries, k 1000, include text) is answered in tens of MB: before, clients that sent
    it and read nothing held one such answer each for --send-timeout-s, memory without bound (12 clients: +1.2 GB on
    the 2-core machine). One event loop takes and gives: no lock."""

    def __init__(self, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.held = 0
        self.gauge = gauge  # petal_answer_bytes

    def hold(self, answer: Response) -> HeldAnswer:
        size = len(answer.body)
        if self.held and self.held + size > self.limit:
            raise Overloaded(f"answers of {self.held} bytes are held for clients that have not taken them yet and "
                             f"this one has {size} (limit {self.limit} bytes, --max-answer-bytes-in-flight)")
        self.held += size
        self.gauge.set(self.held)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.held -= size
                self.gauge.set(self.held)

        return HeldAnswer(answer, release)


async def read_body(request: Request, limit: int, timeout_s: float = 60.0,
                    take: Callable[[int, int], None] | None = None) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (by Content-Length, or while streaming), and with 408 when it
    has not all arrived ``timeout_s`` after the handler began reading it (``--body-timeout-s``). ``take(n, coming)``
    (``BodyBudget.claim``) is told of each byte before it is held, and of the declared length first.

    NOTE: without a time bound a client that sent a head and then its body a byte at a time (or not at all) held its
    connection and the request's task for ever: enough of them and the server accepted no one."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body has {declared} bytes, over the limit of {limit} (--max-body-bytes)")
    take = take or (lambda n, coming: None)
    expected = int(declared) if declared is not None and declared.isdigit() else 0
    take(0, expected)
    chunks: list[bytes] = []
    size = 0
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout_s, expire)  # NOTE: a timer, not a task: the hot path
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the body is over the limit of {limit} bytes (--max-body-bytes)")
            take(len(chunk), 0)
            chunks.append(chunk)
    except ClientDisconnect as exc:  # NOTE: the client's doing, not a server error (no 500, no traceback), nor a 400
        raise ClientGone() from exc
    except asyncio.CancelledError:
        if not expired:
            raise  # the drain's (503)
        _uncancel()
        raise RequestError(408, f"the body did not all arrive within {timeout_s:g} s (--body-timeout-s; {size} "
                                "bytes came); send it at once", kind="request_timeout") from None
    finally:
        timer.cancel()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def build_app(startup: Startup | ServeState) -> ASGIApp:
    """The ASGI app of ``startup`` (which the app starts and stops with its lifespan); a ``ServeState``
    already loaded serves at once."""
    if isinstance(startup, ServeState):
        startup = Startup(startup.settings, startup.metrics, state=startup)
    boot = startup
    settings, metrics = boot.settings, boot.metrics
    # NOTE: the key's own bytes: a command-line or environment byte that is not UTF-8 (a lone surrogate after
    # surrogateescape) is that byte, as a client sends it (it was a UnicodeEncodeError traceback after the bind)
    key = settings.api_key.encode("utf-8", "surrogateescape") if settings.api_key else None
    retry_after = {"Retry-After": str(settings.retry_after_s)}

    def authorized(request: Request) -> bool:
        if key is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # NOTE: the header's own bytes (Starlette decodes headers as latin-1), so a UTF-8 key matches too
        given = token.strip().encode("latin-1") if scheme.lower() == "bearer" else b""
        return hmac.compare_digest(given, key)  # NOTE: constant time, whatever the length of `given`

    def finish(route: str, response: Response, started: float, spans: dict[str, float] | None = None) -> Response:
        elapsed = time.perf_counter() - started
        # NOTE: every answer of the embeddings and search routes, a refusal's included (its only span: app)
        if spans or (spans is not None and route in POST_ROUTES):
            spans["app"] = elapsed
            response.headers["server-timing"] = timing_header(spans)
        metrics.count(route, response.status_code, elapsed)
        return response

    def cut_off() -> Response:
        """The answer of a request the server stopped before it finished."""
        boot.cut_off += 1
        return _error(503, f"{SHUTTING_DOWN}: the request was cut off before it finished (the drain timeout, "
                           f"{settings.drain_timeout_s:g} s, passed, or a second stop signal came); retry",
                      "shutting_down", retry_after)

    def endpoint(route: str, fn: Handler, auth: bool = True, loaded: bool = True) -> Callable[[Request], Any]:
        """``fn(state, request)`` behind the key check; ``loaded``: 503 until the model and index are loaded."""

        async def handle(request: Request) -> Response:
            started = time.perf_counter()
            spans: dict[str, float] = {}
            SPANS.set(spans)  # NOTE: this request's task only (a copy of the context per task)
            try:
                state = boot.state
                if auth and not authorized(request):
                    response = _error(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                                      "authentication_error", {"WWW-Authenticate": "Bearer"})
                elif (refusal := query_refusal(request.scope, route)) is not None:
                    response = _error(400, refusal, "invalid_request_error")
                elif loaded and state is None:
                    response = _error(503, f"not ready: {boot.phase()}; retry later", "not_ready", retry_after)
                else:
                    result = await fn(state, request)  # type: ignore[arg-type]  # None only where not `loaded`
                    with span("encode"):  # bytes: JSON already
                        response = result if isinstance(result, Response) else _json(result)
                    if route in POST_ROUTES:
                        response = unsent.hold(response)  # NOTE: last: given back once sent (HeldAnswer)
            except RequestError as exc:
                response = _error(exc.status, exc.message, exc.kind, exc.headers, exc.param)
                if isinstance(exc, NoRoute):  # NOTE: a path this route matched but that names nothing it serves
                    return finish(UNMATCHED, response, started, None)
            except ClientGone:  # NOTE: counted as such, logged nowhere: the client's doing, and nobody reads this
                response = _error(CLIENT_CLOSED, "the client closed the connection before its answer",
                                  "client_closed_request")
            except asyncio.CancelledError:
                # NOTE: uvicorn cancels the requests still running when --drain-timeout-s passes (or at a second
                # stop signal): an answer a client can act on (retry elsewhere), not a 500 and a traceback
                _uncancel()
                response = cut_off()
            except ShuttingDown:  # queued when the threads stopped (after the drain)
                response = cut_off()
            except Overloaded as exc:
                metrics.overloaded.inc()
                response = _error(503, f"overloaded: {exc}; retry later", "overloaded", retry_after)
            except ThreadStopped as exc:  # a bug that stopped a serving thread (logged there): the server stops
                response = _error(500, str(exc), "server_error")
            except Exception as exc:  # a bug: answer 500, keep serving
                log.exception("petal serve: %s failed", route)
                response = _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
            if request.scope.get(ANSWERED_BY_SERVER):
                return response
            return finish(route, response, started, spans)

        return handle

    limits = settings.limits
    body_timeout_s = settings.body_timeout_s
    bodies = BodyBudget(settings.max_body_bytes_in_flight, metrics.body_bytes)
    unsent = AnswerBudget(settings.max_answer_bytes_in_flight, metrics.answer_bytes)

    async def embeddings(state: ServeState, request: Request) -> Any:
        state.require_model()  # an index of precomputed vectors served without --model: 404, the body unread
        require_json(request)  # NOTE: before the body is read: a form-encoded one is refused whatever its size
        with bodies.claim() as take:
            body = await read_body(request, limits.max_body_bytes, body_timeout_s, take)
            req = parse_embeddings(parse_json(body), limits)
            take(max(0, req.held_bytes - len(body)), parsed=True)
            del body
            return await unless_gone(request, state.embeddings(req))

    async def search(state: ServeState, request: Request) -> Any:
        state.require_index()
        require_json(request)
        with bodies.claim() as take:
            body = await read_body(request, limits.max_body_bytes, body_timeout_s, take)
            req = parse_search(parse_json(body), limits)
            take(max(0, req.held_bytes - len(body)), parsed=True)
            del body
            return await unless_gone(request, state.search(req))

    def model_card(state: ServeState) -> dict[str, Any]:
        assert state.model is not None
        return {"id": state.model_id, "object": "model", "created": 0, "owned_by": "petal", "dim": state.model.dim,
                "max_tokens": state.model.max_tokens}

    async def models(state: ServeState, request: Request) -> Any:
        # NOTE: no model (an index of precomputed vectors without --model): an empty list, /ready says what is served
        return {"object": "list", "data": [model_card(state)] if state.model is not None else []}

    async def model(state: ServeState, request: Request) -> Any:
        name = request.path_params["model"]
        near = name.rstrip("/")
        # NOTE: "/v1/models/" asks for no model named '': a trailing slash, as on every other route (any model's:
        # route_label counts it unmatched)
        if not near or near != name:
            wanted = "/v1/models" + (f"/{near}" if near else "")
            raise NoRoute(404, f"no route {request.url.path!r} (did you mean {wanted!r}?)", kind="not_found")
        if state.model is None:
            raise RequestError(404, f"model {request.path_params['model']!r} is not served here (this server has no "
                                    "model: it serves an index of precomputed vectors, /search by 'vectors')",
                               kind="model_not_found")
        if request.path_params["model"] != state.model_id:
            raise RequestError(404, f"model {request.path_params['model']!r} is not served here "
                                    f"(this server serves {state.model_id!r})", kind="model_not_found")
        return model_card(state)

    async def health(state: ServeState | None, request: Request) -> Any:
        return {"status": "ok"}

    async def ready(state: ServeState | None, request: Request) -> Any:
        if state is None:  # loading (or the load failed and the server is stopping)
            return _json({"status": boot.phase()}, 503, retry_after)
        return state.ready()

    async def metrics_text(state: ServeState | None, request: Request) -> Any:
        body = metrics.render() if state is None else state.metrics_body()  # NOTE: one version's series
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's own 404 (no route) and 405 (a method the route does not take), in the JSON error shape."""
        assert isinstance(exc, HTTPException)
        route = request.scope.get("route")
        label = getattr(route, "path", UNMATCHED) if route is not None else UNMATCHED
        label = label.replace("{model:path}", "{model}")  # as its endpoint counts it
        path = request.scope["path"]  # NOTE: as sent ("*" of a GET *; request.url.path says "/*")
        status = exc.status_code
        if status == 405 and route_label(path) == UNMATCHED:
            # NOTE: "/v1/models/" (no model named) matches Starlette's model route: a DELETE or an OPTIONS of it was a
            # 405 whose Allow listed the method refused; it is no route's path, 404 as a GET of it
            status, label = 404, UNMATCHED
        kind = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid_request_error")
        headers = dict(exc.headers or {}) if status == exc.status_code else {}
        if status == 405:  # NOTE: Starlette's Allow lacks OPTIONS, which every route answers
            headers["Allow"] = allow_header(getattr(route, "methods", None))
        if status == 404:
            # NOTE: "/search/", or "//search" (a base URL ending in "/" joined to "/search"): no redirect (see
            # below), a hint
            near = re.sub("//+", "/", path).rstrip("/")
            message = f"no route {path!r}" + (f" (did you mean {near!r}?)" if near != path and
                                               route_label(near) != UNMATCHED else "")
        else:
            message = f"{request.method} is not allowed on {path}" + (
                f" (allowed: {headers['Allow']})" if "Allow" in headers else "")
        return finish(label, _error(status, message, kind, headers), time.perf_counter())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await boot.start()
        try:
            yield
        finally:
            await boot.stop()

    posts = {"/v1/embeddings": endpoint("/v1/embeddings", embeddings), "/search": endpoint("/search", search)}
    routes = [
        *(Route(path, handle, methods=["POST"]) for path, handle in posts.items()),
        Route("/v1/models", endpoint("/v1/models", models), methods=["GET"]),
        Route("/v1/models/{model:path}", endpoint("/v1/models/{model}", model), methods=["GET"]),
        Route("/health", endpoint("/health", health, auth=False, loaded=False), methods=["GET"]),
        Route("/ready", endpoint("/ready", ready, auth=False, loaded=False), methods=["GET"]),
        Route("/metrics", endpoint("/metrics", metrics_text, auth=False, loaded=False), methods=["GET"]),
    ]
    routed = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    # NOTE: "/search/" is a 404 that names the route, not Starlette's 307 to "/search" (an empty body that
    # most clients do not follow for a POST)
    routed.router.redirect_slashes = False

    # NOTE: OPTIONS (RFC 9110 §9.3.7) was 405 on every route and `OPTIONS *` a 404 "no route '/*'": a client or proxy
    # asking what the server takes got an error. Each route (and `*`: the server as a whole) answers 204 with its
    # Allow, no key needed (it says nothing a 405 would not), counted by its route; an unknown path stays 404
    allowed = {route_label(route.path.replace("{model:path}", "x")): allow_header(route.methods) for route in routes}
    allowed[ASTERISK] = SERVER_ALLOW

    async def options(state: ServeState | None, request: Request) -> Response:
        return Response(status_code=204, headers={"Allow": allowed[option_label(request.scope["path"])]})

    def option_label(path: str) -> str:
        return ASTERISK if path == ASTERISK else route_label(path)

    answers = {label: endpoint(label, options, auth=False, loaded=False) for label in allowed}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/embeddings and /search, and OPTIONS of a route or of `*`, straight to their handler; everything
        else through Starlette.

        The handlers answer every error themselves, so Starlette's middleware and router (for these two
        routes: error pages they never raise, matching every route) only cost time: about a tenth of the
        event loop's CPU of a lone request."""
        if scope["type"] == "http" and (refused := refused_head(scope)) is not None:
            # NOTE: the connection is closed after it (an unknown version's framing, a request no one addressed)
            status, message, kind = refused
            response = finish(option_label(scope["path"]), _error(status, message, kind, {"Connection": "close"}),
                              time.perf_counter())
            await response(scope, receive, send)
            return
        if scope["type"] == "http" and (unrouted := refused_request(scope)) is not None:
            # NOTE: before the router: a method no route implements is 501 whatever the path; an encoded slash is
            # no route's (``routed_path``), where Starlette's router would match the decoded path
            status, message, kind, headers = unrouted
            response = finish(UNMATCHED, _error(status, message, kind, headers), time.perf_counter())
            await response(scope, receive, send)
            return
        if scope["type"] == "http" and not scope.get("root_path"):
            method = scope["method"]
            handle = (posts.get(scope["path"]) if method == "POST"
                      else answers.get(option_label(scope["path"])) if method == "OPTIONS" else None)
            if handle is not None:
                response = await handle(Request(scope, receive))
                await response(scope, receive, send)
                return
        await routed(scope, receive, send)

    return app
