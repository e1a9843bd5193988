"""``petal serve``'s HTTP surface against what a search backend's client sends, probed with raw sockets on loopback.

- A query string (``POST /search?k=5``) was ignored, the request answered with the body's fields (k 10): no route
  reads one, so any is 400 naming the parameter, on every route (``/health?x`` too); an empty one (``?``) is none.
- An encoded slash (``/v1%2Fembeddings``) was routed as ``/``: now 404; within a model id it is the id's own slash
  (the openai client sends ``/v1/models/BAAI%2Fbge-small``).
- A body declared in another charset than UTF-8 (``application/json; charset=latin-1``) was read as UTF-8 (200, or
  400 "not valid JSON"): 415 naming it.
- A body declared ``application/json; charset`` (a parameter without a value) was 415 (charset ""): taken.
- ``//search`` (a base URL ending in "/" joined to a route) is a 404 that names the route, as ``/search/`` is.
- A method the server does not implement was 400 "not valid HTTP/1.1" (BREW, a lower-case ``post``: llhttp knows no
  such method) or 405 (PROPFIND): 501, counted ``unmatched``; a standard method a route does not take stays 405.
- A request that came behind one still answering after the drain began was dropped unanswered (the answer before it
  said close): it is answered 503 with Retry-After and ``Connection: close``.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests._serve_shared import default_server
from tests.test_serve_http_conformance import connect, counted_since, counts, exchange, get, post, read_all, statuses
from tests.test_serve_http_rfc import answer_of

pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def closing(request: bytes) -> bytes:
    return request.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n", 1)


def test_a_query_string_is_400_naming_it_on_every_route(server):
    before = counts(server)
    for request, route, name in ((post("/search?k=5", {"query": "glaciers"}), "/search", '"k"'),
                                 (post("/v1/embeddings?model=x&dimensions=8", {"input": "a"}), "/v1/embeddings",
                                  '"model", "dimensions"'),
                                 (get("/health?probe=1"), "/health", '"probe"'),
                                 (get("/v1/models?limit=2"), "/v1/models", '"limit"'),
                                 (get("/metrics?name[]=x"), "/metrics", '"name[]"'),
                                 (b"OPTIONS /search?x HTTP/1.1\r\nHost: x\r\n\r\n", "/search", '"x"')):
        status, _, body = answer_of(exchange(server, closing(request)))
        assert status == 400, (request, body)
        message = body["error"]["message"]
        assert name in message and route in message, message
        assert ("JSON body" in message) == (route in ("/search", "/v1/embeddings")), message
    status, _, body = answer_of(exchange(server, closing(post("/search?", {"query": "glaciers", "k": 2}))))
    assert status == 200 and len(body["results"][0]["hits"]) == 2, body  # an empty query string is none
    assert counted_since(server, before) == {"/search 400": 2, "/v1/embeddings 400": 1, "/health 400": 1,
                                             "/v1/models 400": 1, "/search 200": 1}  # (/metrics: not counted here)


def test_an_encoded_slash_is_no_path_separator(server):
    before = counts(server)
    for request in (post("/v1%2Fembeddings", {"input": "a"}), post("/v1%2fembeddings", {"input": "a"}),
                    get("/v1%2Fmodels"), get("/v1/models%2Fall-MiniLM-L6-v2"),
                    b"OPTIONS /v1%2Fembeddings HTTP/1.1\r\nHost: x\r\n\r\n"):
        status, _, body = answer_of(exchange(server, closing(request)))
        assert status == 404 and "%2" in body["error"]["message"], (request, body)
    # other encoded characters are the characters they encode (RFC 3986 §2.3): /%73earch is /search
    status, _, body = answer_of(exchange(server, closing(post("/%73earch", {"query": "glaciers", "k": 1}))))
    assert status == 200 and len(body["results"][0]["hits"]) == 1, body
    assert counted_since(server, before) == {"unmatched 404": 5, "/search 200": 1}


def test_a_doubled_slash_is_a_404_naming_the_route(server):
    """A base URL ending in "/" joined to "/search" sends "//search": a 404 with a hint, as for a trailing slash (it was
    a 404 without one)."""
    for request, near in ((post("//search", {"query": "x"}), "/search"), (get("//v1//models/"), "/v1/models")):
        status, _, body = answer_of(exchange(server, closing(request)))
        assert status == 404 and f"did you mean '{near}'?" in body["error"]["message"], body


@pytest.mark.parametrize("charset", ["latin-1", "ISO-8859-1", '"utf-16"', "windows-1252"])
def test_a_body_in_another_charset_than_utf8_is_415_naming_it(server, charset):
    data = json.dumps({"query": "café glacé"}, ensure_ascii=False).encode("latin-1")
    for media in ("application/json", "application/vnd.api+json"):
        request = (f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: {media}; charset={charset}\r\nContent-Length: "
                   f"{len(data)}\r\nConnection: close\r\n\r\n").encode() + data
        status, headers, body = answer_of(exchange(server, request))
        assert status == 415 and charset.strip('"') in body["error"]["message"], body
        assert "UTF-8" in body["error"]["message"] and headers["accept-post"] == "application/json", headers


@pytest.mark.parametrize("parameter", ["charset=utf-8", "charset=UTF-8", 'charset="utf-8"', "charset=utf8",
                                       "charset=us-ascii", "charset", "v=1"])
def test_a_body_declared_utf8_or_ascii_is_taken(server, parameter):
    data = json.dumps({"query": "glaciers", "k": 1}).encode()
    request = (f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json;{parameter}\r\n"
               f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data
    status, _, body = answer_of(exchange(server, request))
    assert status == 200, body


def test_a_method_the_server_does_not_implement_is_501(server):
    before = counts(server)
    for method, path in (("BREW", "/search"), ("post", "/search"), ("PROPFIND", "/health"), ("MKCOL", "/nope"),
                         ("SEARCH", "/search"), ("X-CUSTOM", "/v1/models")):
        status, headers, body = answer_of(exchange(server, closing(post(path, {"query": "x"}).replace(
            b"POST ", method.encode() + b" ", 1))))
        assert status == 501 and body["error"]["type"] == "not_implemented", (method, body)
        assert f'"{method}"' in body["error"]["message"] and "GET, HEAD, POST, OPTIONS" in body["error"]["message"]
    # a standard method a route does not take: 405 with Allow, as before
    status, headers, body = answer_of(exchange(server, closing(post("/search", {}).replace(b"POST ", b"PUT ", 1))))
    assert status == 405 and headers["allow"] == "POST, OPTIONS", (headers, body)
    assert counted_since(server, before) == {"unmatched 501": 6, "/search 405": 1}
    # pipelined behind a keep-alive request: its answer first, then the 501, the connection closed
    answer = exchange(server, get("/health") + b"BREW /search HTTP/1.1\r\nHost: x\r\n\r\n" + get("/ready"))
    assert statuses(answer) == [200, 501], answer
    # not HTTP at all (a TLS handshake sent to the plain port): 400, as before
    assert answer_of(exchange(server, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64))[0] == 400


def test_a_request_coming_behind_one_in_flight_after_the_drain_began_is_answered_503(tmp_path):
    from petal.engine.loader import default_model_dir
    from tests.test_serve import Server, _wait_port_closed

    # NOTE: --max-wait-ms holds the lone request in the queue: in flight for 4 s, so the drain lasts that long
    server = Server(tmp_path / "log", "--model", default_model_dir(), "--max-wait-ms", "4000",
                    "--served-model-name", "org/mini")
    try:
        # a model id with a slash, as the openai client sends it (encoded) and as curl does (not)
        for target in (b"/v1/models/org%2Fmini", b"/v1/models/org/mini"):
            status, _, body = answer_of(exchange(server, closing(get(target.decode()))))
            assert status == 200 and body["id"] == "org/mini", (target, body)
        running = post("/v1/embeddings", {"input": "in flight as the drain begins"})
        late = post("/v1/embeddings", {"input": "sent after the drain began"})
        with connect(server) as whole, connect(server) as split:
            whole.sendall(running)
            split.sendall(running + late[:25])  # the late request's head begun as the drain begins
            time.sleep(0.5)
            server.proc.send_signal(signal.SIGTERM)
            _wait_port_closed(server)
            whole.sendall(late + get("/health"))  # both whole, behind the request in flight
            split.sendall(late[25:])
            for sock, late_ones in ((whole, 2), (split, 1)):
                answer = read_all(sock)
                assert statuses(answer) == [200] + [503] * late_ones, answer
                last = answer[answer.rindex(b"HTTP/1.1 503"):]
                status, headers, body = answer_of(last)
                assert headers["connection"] == "close" and headers["retry-after"] == "1", headers
                assert body["error"]["type"] == "shutting_down", body
                assert b"connection: close" not in answer[:answer.index(b"HTTP/1.1 503")], answer
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
