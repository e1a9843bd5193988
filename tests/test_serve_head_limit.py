"""A request head (request line and headers) is bounded in size and time. One over 64 KiB (``MAX_HEAD_BYTES``) is
answered 431 (414 when it is the URL) in the server's JSON error shape as it arrives, counted in ``/metrics`` as route
``unmatched``, the connection closed; the server keeps serving. Before, the parser held a head of any size until it
ended: a client streaming one endless header (or URL) grew one bytes object for as long as it sent (300 MB of header:
370 MB of the server's memory and minutes of its event loop copying it), and a 1 MiB header was served.

One not complete ``--header-timeout-s`` after it began is answered 408 the same way, and a connection that sends
nothing is closed after 5 s (uvicorn's keep-alive timeout, as an idle keep-alive connection); before, both held their
connection (a file descriptor and its state) for ever, however slowly the head came: enough of them and the server
accepted no one. A body not all arrived ``--body-timeout-s`` after its request's handler began reading it (stalled, or a
byte at a time) is answered 408 by its route, for the same reason.

Real components: the vectors-only server of ``tests/test_serve_upgrade_ignored.py`` (``petal serve`` in a child
process on a loopback port), raw sockets."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from tests.test_serve_audit_http import read_answer
from tests.test_serve_upgrade_ignored import serve_vectors, served  # noqa: F401  (the fixture)

pytest.importorskip("httpx")

MIB = 1 << 20


def _count(server, status: int) -> float:
    found = re.search(rf'^petal_requests_total\{{route="unmatched",status="{status}"\}} ([\d.e+]+)',
                      server.client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def _send_head(server, start: bytes, filler: bytes, size: int, end: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``start``, ``size`` bytes of ``filler`` in 64 KiB writes and ``end`` on one connection (the server may stop
    reading), then read its answer."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            sock.sendall(start)
            piece = (filler * (65536 // len(filler) + 1))[:65536]
            for _ in range(size // len(piece)):
                sock.sendall(piece)
            sock.sendall(end)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_answer(sock)


def _search(body: bytes) -> bytes:
    return (b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body) + body)


CASES = {  # (start, filler, end): the head grows past the limit in its filler
    "one huge header": (b"POST /search HTTP/1.1\r\nHost: x\r\nX-Huge: ", b"a", b"\r\n\r\n"),
    "many small headers": (b"POST /search HTTP/1.1\r\nHost: x\r\n", b"X-Small: abcdefgh\r\n", b"\r\n"),
    "a huge cookie": (b"GET /health HTTP/1.1\r\nHost: x\r\nCookie: ", b"k=v; ", b"\r\n\r\n"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_headers_over_the_limit_are_431_as_they_arrive(served, case):  # noqa: F811
    server, body, expected = served
    start, filler, end = CASES[case]
    before = _count(server, 431)
    status, headers, answer = _send_head(server, start, filler, MIB, end)
    assert status == 431, (case, status, answer)
    assert headers["content-type"] == "application/json" and headers.get("connection") == "close"
    error = json.loads(answer)["error"]
    assert error["code"] == 431 and "65536 bytes" in error["message"] and "headers" in error["message"], error
    assert _count(server, 431) == before + 1
    answer = server.client.post("/search", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json() == expected


def test_a_url_over_the_limit_is_414(served):  # noqa: F811
    server = served[0]
    before = _count(server, 414)
    status, headers, answer = _send_head(server, b"GET /health?q=", b"x", MIB, b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 414, (status, answer)
    error = json.loads(answer)["error"]
    assert error["code"] == 414 and "URL" in error["message"] and "65536 bytes" in error["message"], error
    assert headers.get("connection") == "close"
    assert _count(server, 414) == before + 1
    assert server.client.get("/health").status_code == 200


@pytest.mark.parametrize("pieces", [1, 16])
def test_a_head_within_the_limit_is_served(served, pieces):  # noqa: F811
    """60 KiB of headers, in one write or in 16: served as before, on a connection kept for the next request."""
    server, body, expected = served
    headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 3000) for i in range(20))  # ~60 KiB
    request = _search(body).replace(b"Host: x\r\n", b"Host: x\r\n" + headers, 1)
    assert 58000 < request.index(b"\r\n\r\n") < 65536
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        size = -(-len(request) // pieces)
        for i in range(0, len(request), size):
            sock.sendall(request[i:i + size])
        status, headers_got, answer = read_answer(sock)
        assert status == 200 and json.loads(answer) == expected, answer
        assert headers_got.get("connection") != "close"
        sock.sendall(_search(body))  # the same connection serves the next request
        status, _, answer = read_answer(sock)
        assert status == 200 and json.loads(answer) == expected


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    running = serve_vectors(tmp_path_factory.mktemp("serve-head-timeout"), "--header-timeout-s", "1",
                            "--body-timeout-s", "1")
    yield running
    running[0].stop()


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (nothing more to read) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_head_not_complete_in_time_is_408_and_a_silent_connection_is_closed(impatient):
    server, body, expected = impatient
    before = _count(server, 408)
    silent = _connect(server)  # says nothing at all
    started = time.monotonic()
    with _connect(server) as stalled, _connect(server) as dribbling:
        stalled.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head, less its last line
        head = b"POST /search HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100
        for i in range(0, len(head), 8):  # a byte or so every 20 ms: active, never complete in time
            dribbling.sendall(head[i:i + 8])
            time.sleep(0.02)
        for sock in (stalled, dribbling):
            status, headers, answer = read_answer(sock)
            assert status == 408, answer
            assert headers["content-type"] == "application/json" and headers.get("connection") == "close"
            error = json.loads(answer)["error"]
            assert error["code"] == 408 and "--header-timeout-s" in error["message"], error
            assert _closed_within(sock, 5)
        assert time.monotonic() - started < 8  # ~1.3 s; without the head timer, read_answer's 30 s socket timeout
    assert _count(server, 408) == before + 2
    with silent:
        assert _closed_within(silent, 10)
        assert 4 < time.monotonic() - started < 10  # uvicorn's keep-alive timeout: 5 s
    answer = server.client.post("/search", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json() == expected


def test_a_keep_alive_connection_idle_between_requests_is_not_timed_as_a_head(impatient):
    """The head's time starts at its first byte: a keep-alive client that waits longer than --header-timeout-s
    (less than the keep-alive timeout) between requests is served; and a head sent in pieces within the time."""
    server, body, expected = impatient
    request = _search(body)
    with _connect(server) as sock:
        for pause in (0, 1.5):
            time.sleep(pause)
            sock.sendall(request[:20])
            time.sleep(0.3)
            sock.sendall(request[20:])
            status, headers, answer = read_answer(sock)
            assert status == 200 and json.loads(answer) == expected, answer
            assert headers.get("connection") != "close"


def _route_count(server, route: str, status: int) -> float:
    found = re.search(rf'^petal_requests_total\{{route="{re.escape(route)}",status="{status}"\}} ([\d.e+]+)',
                      server.client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_body_not_all_arrived_in_time_is_408(impatient):
    """(/v1/embeddings reads its body the same way: ``read_body``)"""
    server, body, expected = impatient
    route = "/search"
    before = _route_count(server, route, 408)
    head = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (route.encode(), len(body)))
    started = time.monotonic()
    with _connect(server) as stalled, _connect(server) as dribbling:
        stalled.sendall(head + body[:10])  # then nothing
        dribbling.sendall(head)
        for i in range(12):  # a byte every 0.15 s: active, never complete in time
            dribbling.sendall(body[i:i + 1])
            time.sleep(0.15)
        for sock in (stalled, dribbling):
            status, headers, answer = read_answer(sock)
            assert status == 408, answer
            assert headers.get("connection") == "close"
            error = json.loads(answer)["error"]
            assert error["code"] == 408 and "--body-timeout-s" in error["message"], error
    assert time.monotonic() - started < 5
    assert _route_count(server, route, 408) == before + 2
    answer = server.client.post("/search", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json() == expected


SEND_TIMEOUT_S = 3  # NOTE: the reading client's pause (0.5 s) plus any stall of the test process must fit in it
ABORTED = "read nothing of its answer"  # the server's warning when it drops a client that reads nothing


@pytest.fixture(scope="module")
def long_texts(tmp_path_factory):
    """``petal serve --send-timeout-s 3`` on an index of 12 vectors whose stored texts are 8 KB each: a /search of
    64 rows, k 12, with text, is an answer of ~6 MB."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.test_serve import Server, cli_run

    root = tmp_path_factory.mktemp("serve-send-timeout")
    vectors = np.random.default_rng(1).standard_normal((12, 8)).astype(np.float32)
    (root / "data").mkdir()
    pq.write_table(pa.table({"doc": np.arange(12), "body": [f"{i} " + "long text " * 800 for i in range(12)],
                             "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8)}),
                   root / "data" / "a.parquet")
    cli_run("index", root / "data", "--out", root / "out", "-q", "--vectors-column", "vec", "--id-column", "doc",
            "--text-column", "body", "--index-factory", "Flat")
    server = Server(root / "server.log", root / "out", "--send-timeout-s", str(SEND_TIMEOUT_S))
    body = json.dumps({"vectors": np.repeat(vectors[:4], 16, axis=0).tolist(), "k": 12,
                       "include": ["text"]}).encode()
    yield server, _search(body)
    server.stop()


def _read_all(sock: socket.socket) -> tuple[int, int]:
    """Read ``sock`` to its end: (the answer's Content-Length, the bytes of its body that came)."""
    data = b""
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
            head, sep, rest = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: *(\d+)", head) if sep else None
            if length is not None and len(rest) >= int(length.group(1)):
                break
    except ConnectionResetError:
        pass
    head, _, rest = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    return (int(length.group(1)) if length else -1), len(rest)


def _small_window(server, size: int) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)  # NOTE: before connecting (the window scale)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    return sock


def test_an_answer_the_client_does_not_read_is_dropped_after_send_timeout(long_texts):
    server, request = long_texts
    started = time.monotonic()
    with _small_window(server, 1 << 16) as sock:  # reads after a pause shorter than the timeout, then steadily
        sock.sendall(request)  # through a small window (seconds): the whole answer
        time.sleep(0.5)
        length, got = _read_all(sock)
        assert length > 5 << 20 and got == length, (length, got, server.log.read_text(errors="replace")[-2000:])
    assert time.monotonic() - started < 30
    assert ABORTED not in server.log.read_text(errors="replace")
    with _small_window(server, 4096) as sock:  # reads nothing: the connection is aborted, its buffer dropped
        sock.sendall(request)
        deadline = time.monotonic() + 2 * SEND_TIMEOUT_S + 30
        while ABORTED not in server.log.read_text(errors="replace"):  # NOTE: then read: a wait, not a race with it
            assert time.monotonic() < deadline, "a client that read nothing was never dropped"
            time.sleep(0.1)
        length, got = _read_all(sock)
        assert got < length, (length, got)
    assert server.client.get("/ready").status_code == 200


@pytest.mark.parametrize("url_bytes", [65_536, 66_000, 69_000])
def test_a_url_the_parser_cannot_take_within_the_head_limit_is_414(served, url_bytes):  # noqa: F811
    """A URL of 64 KiB to ~68 KiB (the head's count starts with its second 4 KiB piece): the HTTP layer cannot parse
    it, and it was a 400 'not valid HTTP/1.1'; it is the same 414 as a longer one."""
    server = served[0]
    before = _count(server, 414)
    head = b"GET /health?q=" + b"x" * (url_bytes - len(b"/health?q=")) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    status, headers, answer = _send_head(server, head, b"x", 0, b"")
    assert status == 414, (status, answer)
    assert "URL" in json.loads(answer)["error"]["message"] and headers.get("connection") == "close"
    assert _count(server, 414) == before + 1
    assert server.client.get("/health").status_code == 200
