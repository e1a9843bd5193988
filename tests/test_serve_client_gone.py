"""``petal serve``: a client that closes the connection while its request waits is counted as 499 (nginx's "client
closed request") and its queued work is dropped; it was still embedded and searched, and counted 200 (or, held for
--max-wait-ms, kept the drain waiting, then counted "cut off"). Keep-alive and pipelined connections are answered
as before."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import numpy as np
import pytest

from tests._serve_shared import copy_sample_out

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

HANG_S = 60  # a hang guard only: every wait below is for a condition


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of ``name{labels}`` in Prometheus text (0.0 when the series is not there)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{re.escape(name)}{re.escape('{' + wanted + '}') if wanted else ''} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _wait_for(server, what: str, check) -> str:
    """``/metrics`` once ``check(text)`` holds (``what`` names it for a hang's message)."""
    deadline = time.monotonic() + HANG_S
    while True:
        text = server.client.get("/metrics").text
        if check(text):
            return text
        assert time.monotonic() < deadline, f"{what}:\n{text}"
        assert server.proc.poll() is None, server.log.read_text()
        time.sleep(0.02)


def _raw(server, route: str, body: dict) -> socket.socket:
    """A connection that has sent ``POST route`` with ``body`` (its answer unread)."""
    host, port = server.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=HANG_S)
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _read_answers(sock: socket.socket, count: int) -> list[tuple[int, dict]]:
    """``count`` HTTP/1.1 answers (status, JSON body) read from ``sock`` (Content-Length framed)."""
    data, answers = b"", []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1")
            length = int(re.search(r"(?im)^content-length: *(\d+)", head).group(1))
            if len(data) >= head_end + 4 + length:
                answers.append((int(head.split()[1]), json.loads(data[head_end + 4 : head_end + 4 + length])))
                data = data[head_end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {len(answers)} answers: {data!r}"
        data += chunk
    return answers


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """A server whose batches wait --max-wait-ms 60000 for more texts, unless the token budget (2048 on the CPU)
    fills: a lone query stays queued for a minute, so its client closes while it is certainly queued."""
    from tests.test_serve import Server

    root = tmp_path_factory.mktemp("serve-client-gone")
    server = Server(root / "server.log", copy_sample_out(tmp_path_factory, root / "out"), "--max-wait-ms", "60000")
    yield server
    server.stop()


def test_a_client_gone_while_queued_is_499_and_its_texts_leave_the_queue(held):
    server = held
    query = "how do glaciers move"
    kept: dict = {}

    def waiting() -> None:  # a keep-alive client that waits: answered once the batch launches
        with httpx.Client(base_url=server.url, timeout=HANG_S) as client:
            kept["first"] = client.post("/search", json={"query": query, "k": 3})
            kept["again"] = client.post("/search", json={"vectors": [[0.0] * 383 + [1.0]], "k": 2})  # same connection

    thread = threading.Thread(target=waiting, daemon=True)
    thread.start()
    _wait_for(server, "the first query queued", lambda t: _metric(t, "petal_queue_texts") == 1)
    # a /search and a /v1/embeddings whose clients close while their texts are queued (a minute before their batch)
    for route, body, texts in (("/search", {"query": "espresso and coffee"}, 1),
                               ("/v1/embeddings", {"input": ["one text", "another text"]}, 2)):
        gone = _raw(server, route, body)
        _wait_for(server, f"{route} queued", lambda t, n=texts: _metric(t, "petal_queue_texts") == 1 + n)
        gone.close()
        text = _wait_for(server, f"{route} counted 499",
                         lambda t, r=route: _metric(t, "petal_requests_total", route=r, status="499") == 1)
        # NOTE: the 499 is counted after its texts were taken out: nothing of it is embedded (before: they stayed
        # queued, and were embedded and searched with the batch, counted 200)
        assert _metric(text, "petal_queue_texts") == 1, text
        assert _metric(text, "petal_batch_texts_count") == 0, text  # no step has run
    # texts enough to fill the token budget launch the batch at once: the waiting query's answer comes with it
    filler = [query] + [f"filler {n}: " + "glaciers slide on meltwater and grind the rock below them " * 8
                        for n in range(19)]
    embedded = server.client.post("/v1/embeddings", json={"input": filler})
    assert embedded.status_code == 200, embedded.text
    thread.join(HANG_S)
    first = kept["first"]
    assert first.status_code == 200, first.text
    vector = embedded.json()["data"][0]["embedding"]
    by_vector = server.client.post("/search", json={"vectors": [vector], "k": 3}).json()["results"][0]["hits"]
    hits = first.json()["results"][0]["hits"]
    assert [h["id"] for h in hits] == [h["id"] for h in by_vector] and len(hits) == 3
    np.testing.assert_allclose([h["score"] for h in hits], [h["score"] for h in by_vector], atol=1e-5)
    assert kept["again"].status_code == 200 and len(kept["again"].json()["results"][0]["hits"]) == 2
    text = server.client.get("/metrics").text
    assert _metric(text, "petal_requests_total", route="/search", status="499") == 1
    assert _metric(text, "petal_requests_total", route="/v1/embeddings", status="499") == 1
    assert _metric(text, "petal_requests_total", route="/search", status="200") == 3
    assert _metric(text, "petal_batch_texts_sum") == len(filler) + 1  # the waiting query and the filler only
    assert _metric(text, "petal_queue_texts") == 0


def test_pipelined_and_keep_alive_requests_are_answered_in_order(held):
    """Requests sent back to back on one connection (pipelined: the second before the first is answered) and a
    client that closes after reading its answers: every answer comes, in order, none counted 499."""
    server = held
    before = server.client.get("/metrics").text
    rows = [[1.0] + [0.0] * 383, [0.0] * 383 + [1.0]]
    host, port = server.url.removeprefix("http://").split(":")
    requests = b""
    for k, row in enumerate(rows, start=2):
        data = json.dumps({"vectors": [row], "k": k}).encode()
        requests += (f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    requests += b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=HANG_S) as sock:
        sock.sendall(requests)
        answers = _read_answers(sock, 3)
    assert [status for status, _ in answers] == [200, 200, 200], answers
    assert [len(body["results"][0]["hits"]) for _, body in answers[:2]] == [2, 3]
    for (_, body), row in zip(answers[:2], rows):
        alone = server.client.post("/search", json={"vectors": [row], "k": len(body["results"][0]["hits"])})
        assert body["results"] == alone.json()["results"]
    after = server.client.get("/metrics").text
    for route in ("/search", "/v1/embeddings"):
        assert _metric(after, "petal_requests_total", route=route, status="499") == \
            _metric(before, "petal_requests_total", route=route, status="499")
    assert _metric(after, "petal_requests_total", route="/search", status="200") == \
        _metric(before, "petal_requests_total", route="/search", status="200") + 4


def test_pipelined_requests_whose_client_closes_are_each_499_and_none_is_embedded(held):
    """Requests pipelined on one connection whose client closes while the first is queued: before, only uvicorn's
    newest request (one never started) was told the client had gone, so the first stayed queued, was embedded and
    searched and counted 200, and the ones behind it were counted nowhere. Now each of them is 499 by its route and
    the first's text leaves the queue."""
    server = held
    before = server.client.get("/metrics").text
    host, port = server.url.removeprefix("http://").split(":")
    requests = b""
    for query in ("volcano eruption", "espresso and coffee", "sourdough bread starter"):
        data = json.dumps({"query": query}).encode()
        requests += (f"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    requests += b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=HANG_S) as sock:
        sock.sendall(requests)
        _wait_for(server, "the first query queued", lambda t: _metric(t, "petal_queue_texts") == 1)
    searched = _metric(before, "petal_requests_total", route="/search", status="499") + 3
    text = _wait_for(server, "every pipelined request counted 499",
                     lambda t: _metric(t, "petal_requests_total", route="/search", status="499") == searched)
    assert _metric(text, "petal_requests_total", route="/health", status="499") == 1, text
    assert _metric(text, "petal_queue_texts") == 0, text
    assert _metric(text, "petal_batch_texts_count") == _metric(before, "petal_batch_texts_count"), text
    assert _metric(text, "petal_requests_total", route="/search", status="200") == \
        _metric(before, "petal_requests_total", route="/search", status="200")


def test_the_server_log_holds_nothing_alarming_and_the_drain_waits_for_nobody_gone(held):
    """A request whose client went away neither logs a traceback nor holds the drain: the server stops at once
    (before: the gone request's batch waited --max-wait-ms, the drain its 30 s, then it was counted cut off)."""
    server = held
    gone = _raw(server, "/search", {"query": "volcano eruption"})
    _wait_for(server, "queued", lambda t: _metric(t, "petal_queue_texts") == 1)
    gone.close()
    _wait_for(server, "counted 499", lambda t: _metric(t, "petal_queue_texts") == 0)
    server.stop()
    assert server.proc.returncode == 0
    log = server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log and "Exception" not in log, log
    assert "stopped (in-flight requests drained)" in log, log


def test_a_cancelled_search_leaves_the_search_queue(tmp_path_factory, minilm_spec):
    """In process: a search by vectors queued behind one that is running, whose request is cancelled (its client
    went away), leaves the search queue at once, its rows' place given back, and is never searched; the running
    one is answered."""
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    out = copy_sample_out(tmp_path_factory, tmp_path_factory.mktemp("search-queue") / "out")
    index = SearchIndex.open(out, minilm_spec)
    lock = SharedExclusiveLock()
    searcher = SearchBatcher(lock, max_queue_rows=8)
    rows = np.eye(2, index.reader.dim, dtype=np.float32)
    searched: list[int] = []
    search = index.reader.search

    def counted(vectors, k, where=None):
        searched.append(len(vectors))
        return search(vectors, k, where=where)

    index.reader.search = counted  # NOTE: this reader only: which rows reach FAISS

    async def scenario():
        with lock.exclusive():  # the search thread takes the first search and waits here
            first = asyncio.ensure_future(searcher.search(index, rows[:1], False, 3))
            deadline = time.monotonic() + 30
            while searcher._searching == 0:  # taken by the search thread
                assert time.monotonic() < deadline, "the search thread never took the first search"
                await asyncio.sleep(0.01)
            second = asyncio.ensure_future(searcher.search(index, rows, False, 3))
            await asyncio.sleep(0)  # queued
            assert searcher.outstanding == 3
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            assert searcher.outstanding == 1  # its two rows' place given back before any search ran
        return await first

    searcher.start()
    try:
        hits = asyncio.run(scenario())
    finally:
        searcher.close()
    assert len(hits) == 1 and len(hits[0]) == 3
    assert searched == [1]  # the cancelled search never reached FAISS
    assert searcher.outstanding == 0
