"""``petal serve`` as an HTTP/1.1 server, probed with raw sockets on loopback.

OPTIONS: every route, and ``OPTIONS *`` (the server as a whole, RFC 9110 §9.3.7), answers 204 with its ``Allow``
(OPTIONS among them, as in every 405's ``Allow``); ``OPTIONS *`` was a 404 "no route '/*'", a route's OPTIONS a 405.

Requests pipelined behind one whose answer closes the connection (the client's ``Connection: close``, HTTP/1.0, an
answer given before the body arrived) are never served (RFC 9112 §9.6); they were counted nowhere in ``/metrics``
(the HTTP parser skipped them unread) and are now ``petal_requests_total{status="444"}`` by route, nginx's "no
response".
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from tests._serve_shared import default_server


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (or half-closes) its side."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def exchange(server, data: bytes) -> bytes:
    with connect(server) as sock:
        sock.sendall(data)
        return read_all(sock)


def counts(server) -> dict[str, float]:
    text = server.client.get("/metrics").text
    return {f"{route} {status}": float(value) for route, status, value in
            re.findall(r'^petal_requests_total\{route="(.*?)",status="(\d+)"\} (\S+)$', text, re.M)}


def counted_since(server, before: dict[str, float]) -> dict[str, float]:
    after = counts(server)
    return {key: after[key] - before.get(key, 0.0) for key in after
            if after[key] != before.get(key, 0.0) and not key.startswith("/metrics ")}


def post(path: str, body: dict, extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"{extra}\r\n").encode() + data


def get(path: str, version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: x\r\n\r\n".encode()


def test_options_answers_204_with_allow_on_every_route_and_on_asterisk(server):
    before = counts(server)
    expected = {"*": "GET, HEAD, POST, OPTIONS", "/search": "POST, OPTIONS", "/v1/embeddings": "POST, OPTIONS",
                "/v1/models": "GET, HEAD, OPTIONS", "/v1/models/all-MiniLM-L6-v2": "GET, HEAD, OPTIONS",
                "/health": "GET, HEAD, OPTIONS", "/ready": "GET, HEAD, OPTIONS", "/metrics": "GET, HEAD, OPTIONS"}
    with connect(server) as sock:  # one keep-alive connection: each answer is complete and keeps it
        stream = sock.makefile("rb")
        for target, allow in expected.items():
            sock.sendall(f"OPTIONS {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status = stream.readline()
            headers = {}
            while (line := stream.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            assert status.startswith(b"HTTP/1.1 204 "), (target, status, headers)
            assert headers["allow"] == allow, (target, headers)
            assert headers.get("content-length", "0") == "0" and "connection" not in headers, (target, headers)
    missing = exchange(server, b"OPTIONS /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 404 ") and b"'/nope'" in missing, missing
    refused = server.client.delete("/health")
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD, OPTIONS", refused.headers
    assert "(allowed: GET, HEAD, OPTIONS)" in refused.json()["error"]["message"]
    star = exchange(server, b"GET * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert star.startswith(b"HTTP/1.1 404 ") and b"no route '*'" in star, star
    # "/v1/models/" names no model: no route's path whatever the method (OPTIONS and DELETE were a 405 whose Allow
    # listed OPTIONS; GET was a 404)
    for method in ("OPTIONS", "DELETE", "GET", "PATCH"):
        bare = exchange(server, f"{method} /v1/models/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert bare.startswith(b"HTTP/1.1 404 ") and b"no route '/v1/models/'" in bare, (method, bare)
    # a model's path with a trailing slash (the served model's or another's) is no route either, whatever the method:
    # its GET was "no route", its OPTIONS a 204 with an Allow of GET, its DELETE a 405
    for path in ("/v1/models/all-MiniLM-L6-v2/", "/v1/models/other/"):
        for method in ("OPTIONS", "DELETE", "GET", "PUT"):
            slash = exchange(server, f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert slash.startswith(b"HTTP/1.1 404 ") and f"no route '{path}'".encode() in slash, (method, slash)
    counted = counted_since(server, before)
    assert counted["* 204"] == 1 and counted["/search 204"] == 1 and counted["/v1/models/{model} 204"] == 1, counted
    assert counted["unmatched 404"] == 14 and counted["/health 405"] == 1, counted


def test_requests_pipelined_behind_a_closing_answer_are_each_counted_444(server):
    before = counts(server)
    # the client says close, then pipelines three more (one with a body): one answer, the connection closed
    answer = exchange(server, post("/search", {"query": "glaciers", "k": 1}, "Connection: close\r\n") + get("/health")
                      + post("/v1/embeddings", {"input": "never embedded"}) + get("/v1/models/x"))
    assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 200 "), answer
    # HTTP/1.0: each request closes its connection
    answer = exchange(server, get("/ready", "1.0") + get("/ready", "1.0"))
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert counted_since(server, before) == {"/search 200": 1, "/health 444": 1, "/v1/embeddings 444": 1,
                                             "/v1/models/{model} 444": 1, "/ready 200": 1, "/ready 444": 1}

    # an answer given before its body arrived (415: the body is unread) says close; the body then comes, and a
    # request behind it: read while the connection lingers, never served, counted
    before = counts(server)
    with connect(server) as sock:
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n")
        refused = read_all(sock)  # the server half-closes once its answer is out
        assert refused.startswith(b"HTTP/1.1 415 ") and b"connection: close" in refused, refused
        sock.sendall(b"{}" + get("/health"))
        deadline = time.monotonic() + 30
        while counted_since(server, before).get("/health 444") != 1:
            assert time.monotonic() < deadline, counted_since(server, before)
            time.sleep(0.02)
    assert counted_since(server, before) == {"/search 415": 1, "/health 444": 1}

    # keep-alive requests pipelined are all answered, as before
    before = counts(server)
    last = get("/health").replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    answer = exchange(server, get("/health") * 2 + last)
    assert answer.count(b"HTTP/1.1 200 ") == 3, answer
    assert counted_since(server, before) == {"/health 200": 3}


def statuses(answer: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"(?:^|\r\n\r\n|\})HTTP/1\.1 (\d{3}) ", answer)]


def test_a_refusal_pipelined_behind_a_running_request_comes_after_its_answer(server):
    """A malformed request (400) or a head over the limit (431) pipelined behind a valid /search still running was
    refused at once: the client read that refusal as its /search's answer, and the /search was cut off (counted 499),
    its answer never sent. Now each answer comes in order, then the refusal, then the close."""
    search = post("/search", {"query": "how do glaciers move", "k": 1})
    bad_chunk = b"POST /search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n"
    for tail, expected, counted in (
            (b"BLAH\x01 / HTTP/1.1\r\n\r\n", [200, 400], {"/search 200": 1, "unmatched 400": 1}),
            (b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", [200, 400],
             {"/search 200": 1, "unmatched 400": 1}),
            (search + bad_chunk, [200, 200, 400], {"/search 200": 2, "unmatched 400": 1}),
            (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 10) + b"\r\n\r\n", [200, 431],
             {"/search 200": 1, "unmatched 431": 1})):
        before = counts(server)
        answer = exchange(server, search + tail)
        assert statuses(answer) == expected, answer[:2000]
        assert answer.endswith(b"}") and b'"results"' in answer.split(b"\r\n\r\n")[1], answer[:2000]
        assert counted_since(server, before) == counted, tail[:80]
    # the running request's own body refused: its answer, counted once (it was also counted 499 by its route)
    before = counts(server)
    assert statuses(exchange(server, bad_chunk)) == [400]
    assert counted_since(server, before) == {"unmatched 400": 1}
    # behind a request that said close, nothing is answered but its own; the refused one is counted not answered
    before = counts(server)
    closing = post("/search", {"query": "ice", "k": 1}, "Connection: close\r\n")
    answer = exchange(server, closing + b"BLAH\x01 /\r\n\r\n")
    assert statuses(answer) == [200], answer
    assert counted_since(server, before) == {"/search 200": 1, "unmatched 444": 1}
