"""``petal serve --max-answer-bytes-in-flight``: the answers held for clients that have not taken them yet are bounded
together; an answer past the bound is 503 with Retry-After (one answer of any size always goes), and what an answer
held is given back once its client took it or is gone. Before, an answer was written at once to the connection and
held until its client read it (up to --send-timeout-s): N clients that sent a 4 KB /search (256 queries, k 1000,
include text: a 54 MB answer on the sample index) and read nothing held N answers (12 of them: +1.2 GB of the
server's memory)."""

from __future__ import annotations

import json
import socket

import pytest

from tests._serve_shared import copy_sample_out
from tests.test_serve_client_gone import HANG_S, _metric, _wait_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

LIMIT = 1 << 20  # --max-answer-bytes-in-flight


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.test_serve import Server

    root = tmp_path_factory.mktemp("serve-answer-budget")
    server = Server(root / "server.log", copy_sample_out(tmp_path_factory, root / "out"),
                    "--max-answer-bytes-in-flight", LIMIT, "--send-timeout-s", HANG_S)
    yield server
    server.stop()


ROWS = 256
BODY = json.dumps({"vectors": [[0.001 * (i + j) for j in range(384)] for i in range(ROWS)], "k": 1000}).encode()


def _not_reading(server) -> socket.socket:
    """A connection that sent a /search whose answer is megabytes, and reads none of it."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # NOTE: before connect: the window it advertises
    sock.settimeout(HANG_S)
    sock.connect((host, int(port)))
    sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
    return sock


def test_answers_held_for_clients_not_reading_are_bounded_and_given_back(server):
    whole = server.client.post("/search", content=BODY, headers={"content-type": "application/json"})
    assert whole.status_code == 200, whole.text
    size = len(whole.content)
    assert size > 4 * LIMIT and len(whole.json()["results"]) == ROWS  # sent in pieces: all of it, in order
    assert _metric(server.client.get("/metrics").text, "petal_answer_bytes") == 0

    stalled = _not_reading(server)  # one answer of any size goes, even past the bound
    _wait_for(server, "the stalled answer held", lambda t: _metric(t, "petal_answer_bytes") == size)
    refused = [server.client.post("/search", content=BODY, headers={"content-type": "application/json"})
               for _ in range(3)]
    for answer in refused:  # not held as well: a client that reads nothing keeps the others' memory bounded
        assert answer.status_code == 503, answer.text[:300]
        assert answer.headers["retry-after"] == "1"
        error = answer.json()["error"]
        assert error["type"] == "overloaded" and "--max-answer-bytes-in-flight" in error["message"], error
    embedded = server.client.post("/v1/embeddings", json={"input": "glaciers"})  # the bound is the server's
    assert embedded.status_code == 503 and "--max-answer-bytes-in-flight" in embedded.text, embedded.text
    assert _metric(server.client.get("/metrics").text, "petal_answer_bytes") == size

    stalled.close()  # the client gone: what its answer held comes back (nothing leaks)
    _wait_for(server, "the stalled answer given back", lambda t: _metric(t, "petal_answer_bytes") == 0)
    for _ in range(3):
        again = server.client.post("/search", content=BODY, headers={"content-type": "application/json"})
        assert again.status_code == 200 and again.content == whole.content
    assert server.client.post("/v1/embeddings", json={"input": "glaciers"}).status_code == 200
    assert _metric(server.client.get("/metrics").text, "petal_answer_bytes") == 0


def test_a_bound_below_1024_is_refused_however_the_settings_are_made():
    """The CLI's ``IntRange(min=1024)`` alone: ``ServeSettings(max_answer_bytes_in_flight=0)`` from Python was taken,
    and every answer after the first one held was refused."""
    from petal.pipeline.serve.settings import ServeSettings

    with pytest.raises(ValueError, match="--max-answer-bytes-in-flight 0 < 1024"):
        ServeSettings(max_answer_bytes_in_flight=0)
    assert ServeSettings(max_answer_bytes_in_flight=1024).max_answer_bytes_in_flight == 1024
