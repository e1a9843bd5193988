"""``petal serve`` as its clients use it: what a client sends beside the body (``Expect``, ``CONNECT``) and the error
bodies the ``openai`` client reads, against a real server on loopback (the packaged MiniLM, sample_data's index)."""

from __future__ import annotations

import json

import pytest

from tests._serve_shared import default_server
from tests.test_serve_http_conformance import connect, counted_since, counts, exchange, read_all, statuses
from tests.test_serve_http_rfc import answer_of


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def _head(path: str, body: bytes, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode()


@pytest.mark.parametrize("expect, named", [
    ("200-ok", '"200-ok"'),
    ("x-foo", '"x-foo"'),
    ("100-continue, x-foo", '"x-foo"'),
    ("100-continue\r\nExpect: 200-ok", '"200-ok"'),
])
def test_an_expectation_other_than_100_continue_is_417_before_the_body(server, expect, named):
    """``Expect: 200-ok`` (or ``100-continue, x-foo``) was served as if it were not there; a client waiting for the
    expectation before sending its body got nothing until a timeout. RFC 9110 §10.1.1: 417 naming it, at once, the
    connection closed, counted by its route; the server serves on."""
    body = json.dumps({"query": "ice", "k": 1}).encode()
    before = counts(server)
    with connect(server) as sock:
        sock.sendall(_head("/search", body, f"Expect: {expect}\r\n"))  # the body is held back, as such a client does
        sock.settimeout(30)
        raw = read_all(sock)
    status, headers, error = answer_of(raw)
    assert status == 417 and headers["connection"] == "close", raw
    assert error["error"]["type"] == "expectation_failed" and named in error["error"]["message"], error
    assert "100-continue" in error["error"]["message"] and statuses(raw) == [417], raw
    assert counted_since(server, before) == {"/search 417": 1}
    # HTTP/1.0 predates Expect: ignored, as its 100-continue is; a GET's expectation is refused the same
    assert answer_of(exchange(server, b"GET /health HTTP/1.0\r\nExpect: 200-ok\r\n\r\n"))[0] == 200
    assert answer_of(exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n"))[0] == 417
    assert server.client.get("/health").status_code == 200


def test_100_continue_in_any_case_is_still_met(server):
    body = json.dumps({"query": "ice", "k": 1}).encode()
    raw = exchange(server, _head("/search", body, "Expect: 100-Continue\r\nConnection: close\r\n") + body)
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 "), raw[:200]
