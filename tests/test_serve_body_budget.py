"""``petal serve --max-body-bytes-in-flight``: the request bodies held at once by every request together are bounded;
a body that would go past the bound is 503 with Retry-After (by its Content-Length before it is read, or as a chunked
one streams), and what a request held is given back however it ends. Before, only one request's body was bounded
(``--max-body-bytes``): N connections sending large bodies held N of them."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests._serve_shared import copy_sample_out
from tests.test_serve_client_gone import HANG_S, _metric, _read_answers, _wait_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

BODY = 65536  # --max-body-bytes
IN_FLIGHT = 3 * BODY  # --max-body-bytes-in-flight


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.test_serve import Server

    root = tmp_path_factory.mktemp("serve-body-budget")
    server = Server(root / "server.log", copy_sample_out(tmp_path_factory, root / "out"),
                    "--max-body-bytes", BODY, "--max-body-bytes-in-flight", IN_FLIGHT)
    yield server
    server.stop()


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=HANG_S)


HEAD = b'{"query": "glaciers"'  # a body's start: the rest is spaces, then "}"


def _almost_sent(server, length: int) -> socket.socket:
    """A connection that has sent all but the last byte of a ``/search`` body of ``length`` bytes."""
    sock = _connect(server)
    sock.sendall(f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode() + HEAD + b" " * (length - len(HEAD) - 1))
    return sock


def _held(server, n: int) -> str:
    return _wait_for(server, f"{n} body bytes held", lambda t: _metric(t, "petal_body_bytes") == n)


def test_bodies_past_the_total_are_503_and_what_a_request_held_comes_back(server):
    # connections that declare bodies and send nothing hold nothing: they keep no one out
    idle = [_connect(server) for _ in range(8)]
    for sock in idle:
        sock.sendall(f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n".encode())
    assert server.client.post("/search", json={"query": "how do glaciers move"}).status_code == 200
    for sock in idle:
        sock.close()

    slow = [_almost_sent(server, BODY) for _ in range(3)]  # together, 3 bytes short of the bound
    before = _held(server, IN_FLIGHT - 3)
    refused = server.client.post("/search", json={"query": "how do glaciers move"})  # would not fit: refused unread
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["type"] == "overloaded" and "--max-body-bytes-in-flight" in error["message"], error
    text = server.client.get("/metrics").text
    assert _metric(text, "petal_overloaded_total") == _metric(before, "petal_overloaded_total") + 1
    embedded = server.client.post("/v1/embeddings", json={"input": "glaciers"})  # the bound is the server's
    assert embedded.status_code == 503 and "--max-body-bytes-in-flight" in embedded.text, embedded.text

    slow.pop().close()  # a client gone while sending (499): its body's bytes come back
    _held(server, 2 * (BODY - 1))
    smaller = _almost_sent(server, 40001)
    _held(server, 2 * (BODY - 1) + 40000)
    # a chunked body (no length declared) is taken as it streams: its second chunk would pass the bound
    chunk = b" " * 20000
    with _connect(server) as sock:
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2)
        [(status, body)] = _read_answers(sock, 1)
    assert status == 503 and "--max-body-bytes-in-flight" in body["error"]["message"], body
    _held(server, 2 * (BODY - 1) + 40000)

    finished = slow.pop()  # a body that arrives whole: answered, then its bytes come back
    finished.sendall(b"}")
    [(status, body)] = _read_answers(finished, 1)
    assert status == 200 and body["results"][0]["query"] == "glaciers", body
    finished.close()
    _held(server, BODY - 1 + 40000)
    slow.pop().close()
    smaller.close()
    _held(server, 0)
    # once they are gone, bodies of most of --max-body-bytes one after another are all taken (nothing leaks)
    row = [0.001 * i for i in range(384)]
    assert BODY // 2 < len(json.dumps({"vectors": [row] * 14, "k": 2})) < BODY
    for _ in range(5):
        answer = server.client.post("/search", json={"vectors": [row] * 14, "k": 2})
        assert answer.status_code == 200 and len(answer.json()["results"]) == 14, answer.text
    assert _metric(server.client.get("/metrics").text, "petal_body_bytes") == 0


def test_a_bound_below_one_body_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--max-body-bytes", "200000",
                                      "--max-body-bytes-in-flight", "100000"])
    assert result.exit_code == 2, result.output
    assert "--max-body-bytes-in-flight 100000 is below --max-body-bytes 200000" in result.output


@pytest.fixture(scope="module")
def held_server(tmp_path_factory):
    """A partial batch waits a minute (texts of 64 tokens, the CPU's budget of 2048): a request with one text stays
    queued until its client goes; one with 32 texts fills the budget and runs at once."""
    from tests.test_serve import Server

    root = tmp_path_factory.mktemp("serve-parsed-budget")
    server = Server(root / "server.log", copy_sample_out(tmp_path_factory, root / "out"),
                    "--max-body-bytes", 1 << 20, "--max-body-bytes-in-flight", 2 << 20, "--max-wait-ms", 60000,
                    "--max-tokens-per-text", 64)
    yield server
    server.stop()


def _ids_body(*lengths: int) -> bytes:
    """A /v1/embeddings body of token-id lists (``7,``: 2 bytes of JSON a token id, 8 once parsed), truncated."""
    return b'{"truncate":true,"input":[%s]}' % b",".join(b"[" + b"7," * (n - 1) + b"7]" for n in lengths)


def test_a_request_counts_what_its_parsed_body_holds(held_server):
    # before, only the body's bytes counted (1 MB here) while its 500,000 token ids held 4 MB as int64 until it was
    # answered: 16 such bodies of 4 MB at the defaults held ~375 MB more than the 64 MB the bound said
    server = held_server
    queued = _ids_body(500_000)
    assert len(queued) < 1 << 20
    sock = _connect(server)
    sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(queued), queued))
    text = _wait_for(server, "the request queued", lambda t: _metric(t, "petal_queue_texts") == 1)
    assert _metric(text, "petal_body_bytes") == 500_000 * 8  # alone, over the bound of 2 MiB: it goes
    refused = server.client.post("/v1/embeddings", json={"input": "glaciers"})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
    message = refused.json()["error"]["message"]
    assert "hold 4000000 bytes" in message and "--max-body-bytes-in-flight" in message, message
    sock.close()  # its client gone: it leaves the queue, its bytes come back
    _wait_for(server, "the request gone", lambda t: _metric(t, "petal_body_bytes") == 0
              and _metric(t, "petal_queue_texts") == 0)
    # alone, a body that parses past the bound is answered (32 lists of 64 tokens: a full batch, run at once)
    answer = server.client.post("/v1/embeddings", content=_ids_body(*[15_000] * 32),
                                headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert [len(row["embedding"]) for row in answer.json()["data"]] == [384] * 32
    assert answer.json()["usage"]["prompt_tokens"] == 32 * 64
    assert _metric(server.client.get("/metrics").text, "petal_body_bytes") == 0
