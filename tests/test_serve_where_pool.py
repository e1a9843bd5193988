"""petal serve builds a ``where`` filter's selector in its work pool, not on the one search thread: a long filter
on one client's ``vectors`` request no longer holds every other client's search (a 1 MB filter held them all for
seconds). A real server on loopback over the packaged model's index (tests/test_api_serve_audit.py's)."""

from __future__ import annotations

import threading
import time

from tests import test_api_serve_audit

built = test_api_serve_audit.built
server = test_api_serve_audit.server
DIM = test_api_serve_audit.DIM


def test_a_long_filter_does_not_hold_other_clients_searches(server):
    c = server.client
    where = " AND ".join(["year = 2019"] * 60_000)  # ~0.8 MB: seconds of selector building, every row kept
    finished: list[str] = []
    answers: dict[str, int] = {}

    def post(name: str, body: dict) -> None:
        answers[name] = c.post("/search", json=body).status_code
        finished.append(name)

    vectors = [[0.05] * DIM]
    slow = threading.Thread(target=post, args=("filtered", {"vectors": vectors, "k": 3, "where": where}))
    slow.start()
    time.sleep(0.5)  # the filtered request is in, its selector being built
    post("plain", {"vectors": vectors, "k": 3})
    slow.join(120)
    assert answers == {"filtered": 200, "plain": 200}, answers
    assert finished == ["plain", "filtered"], finished  # was: the plain search waited for the filter's selector
    # the filter still applies, and a bad one is still 422 naming it
    hits = c.post("/search", json={"vectors": vectors, "k": 6, "where": "year = 2019"}).json()["results"][0]["hits"]
    assert sorted(hit["id"] for hit in hits) == ["d0", "d3"], hits  # the rows of 2019 (year = 2019 + i % 3)
    assert c.post("/search", json={"vectors": vectors, "where": "nope = 1"}).status_code == 422
