"""A request that asks to switch protocols (``Connection: Upgrade``, ``Upgrade: h2c``: what ``curl --http2`` sends
over ``http://``) is served in HTTP/1.1 with its body, the upgrade ignored (RFC 9110 §7.8). The HTTP parser (llhttp)
ended such a message at its headers and took the rest for the new protocol's bytes: ``curl --http2 -d '{...}'`` got
400 'the body is not valid JSON' for a valid body, a body sent after the headers was parsed as the next request
(a second 400), and requests pipelined behind it were lost.

Real components: ``petal index --vectors-column`` over real Parquet (no model: the server is ready in a second),
``petal serve`` in a child process on a loopback port, raw sockets."""

from __future__ import annotations

import json
import re
import socket
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_serve import Server, cli_run

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 8
UPGRADE = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


def serve_vectors(root, *flags: object):
    """``petal serve`` (with ``flags``) on an index of 12 precomputed vectors built in ``root`` (no model: ready in a
    second); with a ``/search`` body and its answer: ``(server, body, expected)``."""
    vectors = np.random.default_rng(0).standard_normal((12, DIM)).astype(np.float32)
    (root / "data").mkdir()
    pq.write_table(pa.table({"doc": np.arange(12), "body": [f"document {i}" for i in range(12)],
                             "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   root / "data" / "a.parquet")
    cli_run("index", root / "data", "--out", root / "out", "-q", "--vectors-column", "vec", "--id-column", "doc",
            "--text-column", "body", "--index-factory", "Flat")
    server = Server(root / "server.log", root / "out", *flags)
    body = json.dumps({"vectors": vectors[[3]].tolist(), "k": 2}).encode()
    expected = server.client.post("/search", content=body, headers={"Content-Type": "application/json"})
    assert expected.status_code == 200, expected.text
    return server, body, expected.json()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = serve_vectors(tmp_path_factory.mktemp("serve-upgrade"))
    yield running
    running[0].stop()


def _conversation(server: Server, parts: list[bytes], answers: int) -> list[tuple[int, bytes]]:
    """Send ``parts`` on one connection (a short pause between them, so each arrives on its own), then read
    ``answers`` answers (status, body) from it."""
    host, port = server.url.removeprefix("http://").split(":")
    found: list[tuple[int, bytes]] = []
    data = b""
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(0.2)
            sock.sendall(part)
        while len(found) < answers:
            head, sep, rest = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: *(\d+)", head) if sep else None
            if length is not None and len(rest) >= int(length.group(1)):
                found.append((int(head.split()[1]), rest[:int(length.group(1))]))
                data = rest[int(length.group(1)):]
                continue
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed after {len(found)} answer(s): {data!r}"
            data += chunk
    return found


def _post(body_framing: bytes) -> bytes:
    return b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + UPGRADE + body_framing + b"\r\n"


READY = b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("case", ["one send", "body later", "body split, a request behind it", "chunked"])
def test_a_post_asking_for_h2c_is_served_with_its_body(served, case):
    server, body, expected = served
    length = b"Content-Length: %d\r\n" % len(body)
    parts = {
        "one send": [_post(length) + body],
        "body later": [_post(length), body],
        "body split, a request behind it": [_post(length) + body[:5], body[5:] + READY],
        "chunked": [_post(b"Transfer-Encoding: chunked\r\n"), b"%x\r\n%s\r\n" % (len(body), body),
                    b"0\r\n\r\n" + READY],
    }[case]
    answers = _conversation(server, parts, 2 if READY in parts[-1] else 1)
    status, answer = answers[0]
    assert status == 200, answer
    assert json.loads(answer) == expected
    if len(answers) > 1:  # the request behind it, on the same connection
        assert answers[1][0] == 200 and json.loads(answers[1][1])["status"] == "ready"


def test_a_get_asking_for_h2c_keeps_the_connection_for_the_next_request(served):
    server, _, _ = served
    answers = _conversation(server, [b"GET /health HTTP/1.1\r\nHost: x\r\n" + UPGRADE + b"\r\n" + READY], 2)
    assert [status for status, _ in answers] == [200, 200]
    assert json.loads(answers[1][1])["status"] == "ready"
