"""``petal serve`` against RFC 9110 / 9112 at the request head, probed with raw sockets on loopback.

HTTP versions: a request line of ``HTTP/2.0``, ``HTTP/3.0``, ``HTTP/0.9`` (or the bare ``GET /path`` of HTTP/0.9) was
served as HTTP/1.1, or refused as malformed (400: ``HTTP/3.0``, ``HTTP/9.9``); an HTTP major version other than 1 is
now 505 (RFC 9110 §15.6.6), and a higher minor of 1 (``HTTP/1.2``, which was a 400) is served as HTTP/1.1 (RFC 9110
§2.5). Host: an HTTP/1.1 request without one, with two, or with one that is not ``host[:port]`` was served; it is now
400 (RFC 9112 §3.2: the server MUST). Each such answer closes the connection, is counted by its route, and the server
serves on.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests._serve_shared import default_server
from tests.test_serve_http_conformance import connect, counted_since, counts, exchange, get, post, read_all, statuses


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def answer_of(raw: bytes) -> tuple[int, dict[str, str], dict]:
    """Status, headers and JSON body of the one answer in ``raw``."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), raw[:300]
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}


def test_http_versions_other_than_1_are_505_and_higher_minors_are_served(server):
    before = counts(server)
    for version in ("2.0", "3.0", "0.9", "9.9"):
        status, headers, body = answer_of(exchange(server, f"GET /health HTTP/{version}\r\nHost: x\r\n\r\n".encode()))
        assert status == 505 and headers["connection"] == "close", (version, status, body)
        assert body["error"]["code"] == 505 and f"HTTP/{version} is not supported" in body["error"]["message"], body
    # HTTP/0.9's request line has no version at all; a POST with its body, as HTTP/2.0
    assert answer_of(exchange(server, b"GET /ready\r\n\r\n"))[0] == 505
    assert answer_of(exchange(server, post("/search", {"query": "ice", "k": 1}).replace(b"HTTP/1.1", b"HTTP/2.0")))[0] \
        == 505
    # a higher minor of HTTP/1 is HTTP/1.1 (was a 400 "not valid HTTP/1.1"), kept alive; 1.0 as before
    raw = exchange(server, b"GET /health HTTP/1.2\r\nHost: x\r\n\r\nGET /health HTTP/1.0\r\n\r\n")
    assert statuses(raw) == [200, 200] and raw.count(b'{"status":"ok"}') == 2, raw
    assert counted_since(server, before) == {"/health 505": 4, "/ready 505": 1, "/search 505": 1, "/health 200": 2}


def test_the_http2_connection_preface_is_505_after_the_answers_before_it(server):
    """``PRI * HTTP/2.0`` (HTTP/2 with prior knowledge: ``curl --http2-prior-knowledge``, gRPC) was a 400 "not valid
    HTTP/1.1": it is an HTTP/2.0 request line, 505 as any other."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    before = counts(server)
    raw = exchange(server, get("/health") + preface)
    assert statuses(raw) == [200, 505], raw
    body = json.loads(raw.rpartition(b"\r\n\r\n")[2])
    assert body["error"]["type"] == "http_version_not_supported" and "HTTP/2.0 is not supported" in \
        body["error"]["message"], body
    assert counted_since(server, before) == {"/health 200": 1, "unmatched 505": 1}
    assert server.client.get("/health").status_code == 200


@pytest.mark.parametrize("head, said", [
    (b"GET /health HTTP/1.1\r\n", "must carry a Host header"),
    (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: a\r\n", "2 Host headers"),
    (b"GET /health HTTP/1.1\r\nHost: a\r\nX: y\r\nhOsT: b:80\r\n", "2 Host headers"),
    (b"GET /health HTTP/1.1\r\nHost: a, b\r\n", "is not HOST[:PORT]"),
    (b"GET /health HTTP/1.1\r\nHost: a/b\r\n", "is not HOST[:PORT]"),
    (b"GET /health HTTP/1.1\r\nHost: a:b\r\n", "is not HOST[:PORT]"),
    (b"GET http://a.example/health HTTP/1.1\r\n", "must carry a Host header"),
    # the other headers read as one value: the first was taken, where a proxy in front may check the last
    (b"GET /health HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n",
     "2 Authorization headers"),
    (b"GET /health HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\ncontent-type: text/plain\r\n",
     "2 Content-Type headers"),
])
def test_a_missing_repeated_or_malformed_host_is_400_and_the_server_serves_on(server, head, said):
    before = counts(server)
    # pipelined behind it, a valid request: never served (the 400 closes the connection), counted 444
    raw = exchange(server, head + b"\r\n" + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = answer_of(raw)
    assert status == 400 and headers["connection"] == "close" and said in body["error"]["message"], raw
    assert statuses(raw) == [400], raw
    assert counted_since(server, before) == {"/health 400": 1, "/health 444": 1}
    assert server.client.get("/health").status_code == 200


def test_hosts_that_are_valid_are_served(server):
    for host in (b"x", b"127.0.0.1:8080", b"[::1]:80", b"my-host.example.com", b""):
        raw = exchange(server, b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        assert answer_of(raw)[0] == 200, (host, raw)
    # HTTP/1.0 needs no Host; a POST with its body through the check
    assert answer_of(exchange(server, b"GET /health HTTP/1.0\r\n\r\n"))[0] == 200
    status, _, body = answer_of(exchange(server, post("/search", {"query": "ice", "k": 1}, "Connection: close\r\n")))
    assert status == 200 and body["results"][0]["hits"], body


def series(server) -> tuple[dict[str, float], dict[str, float]]:
    """``petal_requests_total`` and ``petal_request_seconds_count`` by "route status"."""
    text = server.client.get("/metrics").text
    found = []
    for name in ("petal_requests_total", "petal_request_seconds_count"):
        found.append({f"{route} {status}": float(value) for route, status, value in
                      re.findall(rf'^{name}\{{route="(.*?)",status="(\d+)"\}} (\S+)$', text, re.M)})
    return found[0], found[1]


def test_every_request_counted_has_its_latency_under_the_same_route_and_status(server):
    """A request the HTTP layer answers or drops itself (the parser's 400, a 431, a 444 behind a closing answer, a 499
    never started) was counted in petal_requests_total with no petal_request_seconds at all (and that histogram had no
    status): the two now agree by route and status, whatever answered."""
    search = post("/search", {"query": "how do glaciers move", "k": 1})
    closing = post("/search", {"query": "ice", "k": 1}, "Connection: close\r\n")
    exchange(server, closing + get("/health") + post("/v1/embeddings", {"input": "x"}) + b"BLAH\x01 /\r\n\r\n")  # 444s
    exchange(server, search + b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")  # the parser's 400
    exchange(server, search + b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 10) + b"\r\n\r\n")  # 431
    exchange(server, get("/health", "2.0") + get("/nope") + get("/v1/models/x"))  # 505, then 444s
    with connect(server) as sock:  # requests pipelined behind a running search, the client gone: 499 (or answered)
        sock.sendall(search * 3 + get("/ready"))
    exchange(server, get("/nope").replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))  # the app's own 404
    requests, seconds = series(server)
    for status in ("444", "400", "431", "505", "404", "200"):
        assert any(key.endswith(" " + status) for key in seconds), (status, seconds)
    deadline = time.monotonic() + 30  # the 499s are counted as their connection's loss is seen
    while requests != seconds and time.monotonic() < deadline:
        time.sleep(0.05)
        requests, seconds = series(server)
    assert requests == seconds
    assert requests["/health 444"] >= 1 and requests["unmatched 400"] >= 1 and requests["unmatched 431"] >= 1


FORMS = "'input' must be a string, a list of strings, a list of token ids (integers) or a list of such lists"


@pytest.mark.parametrize("given, said", [
    ([1.0, 2], "'input' item 0 is 1.0, not a string, a token id (an integer) or a list of token ids"),
    ([True, 5], "'input' item 0 is a boolean, not a string, a token id"),
    ([101, 2.5, 102], "'input' item 1 is 2.5, not a token id (an integer), in a list of token ids"),
    ([101, True], "'input' item 1 is a boolean, not a token id (an integer)"),
    ([101, "x"], "'input' item 1 is a string, not a token id (an integer)"),
    (["a", "b", 7], "'input' item 2 is an integer, in a list of strings"),
    (["a", None], "'input' item 1 is null, in a list of strings"),
    ([[101, 102], [103, 1.5]], "'input' item 1 position 1 is 1.5, not a token id (an integer)"),
    ([[101], []], "'input' item 1 is an empty list of token ids"),
    ([[101], "x"], "'input' item 1 is a string, not a list of token ids"),
    ([None], "'input' item 0 is null"),
    ({"text": "x"}, "not an object"),
    (5, "not an integer"),
    ([], "'input' is empty"),
])
def test_each_malformed_input_says_what_is_taken_and_where_it_is_not(server, given, said):
    answer = server.client.post("/v1/embeddings", json={"input": given})
    message = answer.json()["error"]["message"]
    assert answer.status_code == 422 and said in message and FORMS in message, (given, message)


def test_an_http_1_0_expect_100_continue_is_ignored_and_1_1_still_gets_it(server):
    """RFC 9110 §10.1.1: a server MUST ignore an HTTP/1.0 request's ``Expect: 100-continue``. It was sent ``HTTP/1.1 100
    Continue``, which an HTTP/1.0 client takes for its answer; now it gets only the answer once its body is sent. An
    HTTP/1.1 request still gets its 100 Continue before the body, as before."""
    body = json.dumps({"query": "ice", "k": 1}).encode()
    for version, interim in (("1.0", b""), ("1.1", b"HTTP/1.1 100 Continue\r\n\r\n")):
        with connect(server) as sock:
            sock.sendall(f"POST /search HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                         f"{len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n".encode())
            sock.settimeout(1.0)
            try:
                first = sock.recv(65536)
            except TimeoutError:
                first = b""  # NOTE: nothing before the body: as it should be for HTTP/1.0
            assert first == interim, (version, first)
            sock.settimeout(30)
            sock.sendall(body)
            raw = read_all(sock)
        assert statuses(raw) == [200] and b'"hits"' in raw, (version, raw)
