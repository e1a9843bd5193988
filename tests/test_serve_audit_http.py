"""``petal serve`` at the HTTP layer, below the app: a request that is not valid HTTP/1.1 (a bad Content-Length,
a malformed chunk, a header with a forbidden character, a broken request line) is answered by the HTTP
parser, not by a route. It still gets the server's JSON error shape (400, a message saying what to fix), is
counted in ``/metrics``, and the server keeps serving. A real server (a child process) on a loopback port,
raw sockets."""

from __future__ import annotations

import json
import re
import socket

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

KEY = "audit-key"


def start_server(root):
    """A real ``petal serve`` (packaged MiniLM, embeddings only, ``--api-key KEY``, 64 KiB bodies) logging in ``root``;
    its client sends the key."""
    from petal.engine.loader import default_model_dir
    from tests.test_serve import Server

    running = Server(root / "server.log", "--model", default_model_dir(), "--api-key", KEY,
                     "--max-body-bytes", "65536")
    running.client.headers["Authorization"] = f"Bearer {KEY}"
    return running


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("serve-audit-http"))
    yield running
    running.stop()


def _exchange(server, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` on a fresh connection; the status, headers and body of the answer (read to its end)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        return read_answer(sock)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The answer waiting on ``sock`` (status, headers, body read to its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the answer was cut short"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _count(server, route: str, status: int) -> float:
    found = re.search(rf'^petal_requests_total\{{route="{re.escape(route)}",status="{status}"\}} ([\d.e+]+)',
                      server.client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


POST = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
BODY = b'{"input": "hello"}'
NOT_HTTP = {  # each answered by uvicorn's parser as text/plain "Invalid HTTP request received." before
    "negative content-length": POST + b"Content-Length: -5\r\n\r\n" + BODY,
    "signed content-length": POST + b"Content-Length: +18\r\n\r\n" + BODY,
    "content-length beyond 64 bits": POST + b"Content-Length: 99999999999999999999999\r\n\r\n" + BODY,
    "two different content-lengths": POST + b"Content-Length: 18\r\nContent-Length: 5\r\n\r\n" + BODY,
    "chunk size not hex": POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n",
    "chunk shorter than declared": POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\n" + BODY + b"\r\n0\r\n\r\n",
    "control character in a header": POST + b"X-Note: a\x01b\r\nContent-Length: 18\r\n\r\n" + BODY,
    "space before the colon": POST + b"Content-Length : 18\r\n\r\n" + BODY,
    "not a request line": b"HELLO\r\n\r\n",
    "non-ASCII bytes in the path": b"POST /v1/embeddings\xff HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\n" + BODY,
}


@pytest.mark.parametrize("case", sorted(NOT_HTTP))
def test_a_request_that_is_not_http_gets_a_json_400_and_is_counted(server, case):
    before = _count(server, "unmatched", 400)
    status, headers, body = _exchange(server, NOT_HTTP[case])
    assert status == 400, (case, status, body)
    assert headers["content-type"] == "application/json", (case, headers, body)
    assert headers.get("connection") == "close"  # the parser's state is lost: the connection ends
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error", error
    assert "not valid HTTP/1.1" in error["message"], error
    assert _count(server, "unmatched", 400) == before + 1
    # the server keeps serving, right answers
    answer = server.client.post("/v1/embeddings", json={"input": "hello"})
    assert answer.status_code == 200 and len(answer.json()["data"][0]["embedding"]) == 384


def test_valid_http_of_the_same_shapes_is_still_served(server):
    """The well-formed neighbours of the cases above: a chunked body, a Content-Length, pipelined requests."""
    chunked = POST + b"Transfer-Encoding: chunked\r\n\r\n5\r\n" + BODY[:5] + b"\r\nd\r\n" + BODY[5:] + b"\r\n0\r\n\r\n"
    status, _, body = _exchange(server, chunked)
    assert status == 200 and len(json.loads(body)["data"]) == 1, body
    status, _, body = _exchange(server, POST + b"Content-Length: 18\r\n\r\n" + BODY)
    assert status == 200, body


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd", "GZIP", "gzip, identity"])
def test_a_body_with_a_content_coding_is_refused_with_415_not_read_as_json(server, coding):
    """A body declared ``Content-Encoding: gzip`` was read as plain JSON: a real gzip body got 400 "not valid JSON
    (UTF-8): can't decode byte 0x8b", and a plain body so labelled was taken. The server decodes no content
    coding: 415 naming the header, with ``Accept-Encoding: identity`` (RFC 7694), before the body is read."""
    import gzip

    body = gzip.compress(BODY) if coding.lower().startswith("gzip") else BODY
    before = _count(server, "/v1/embeddings", 415)
    answer = server.client.post("/v1/embeddings", content=body,
                                headers={"Content-Type": "application/json", "Content-Encoding": coding})
    assert answer.status_code == 415, (coding, answer.status_code, answer.text)
    assert answer.headers["accept-encoding"] == "identity"
    error = answer.json()["error"]
    assert "Content-Encoding" in error["message"] and coding in error["message"], error
    assert _count(server, "/v1/embeddings", 415) == before + 1
    for plain in ("identity", "Identity", ""):  # no coding at all: taken
        ok = server.client.post("/v1/embeddings", content=BODY,
                                headers={"Content-Type": "application/json", "Content-Encoding": plain})
        assert ok.status_code == 200, (plain, ok.text)


def test_a_content_coding_in_a_second_header_is_refused_too(server):
    """``Content-Encoding: identity`` then ``Content-Encoding: gzip`` (two headers): the first alone was judged, the
    gzip body read as JSON, a misleading 400 "not valid JSON"; every such header counts: 415."""
    import gzip

    answer = server.client.post("/v1/embeddings", content=gzip.compress(BODY),
                                headers=[("Content-Type", "application/json"), ("Content-Encoding", "identity"),
                                         ("Content-Encoding", "gzip")])
    assert answer.status_code == 415, answer.text
    assert "identity, gzip" in answer.json()["error"]["message"]
