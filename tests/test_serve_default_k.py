"""``/search`` without ``k`` answers at most ``--max-k`` hits: the default (10) is bounded by the server's limit as a
given ``k`` is. Before, a server started with ``--max-k 3`` answered 10 hits to every request that left ``k`` out, past
the limit its operator set (and 422 to one asking for 4).

Real components: ``petal index --vectors-column`` over real Parquet and ``petal serve`` in a child process on a loopback
port (``tests/test_serve_upgrade_ignored.serve_vectors``: 12 vectors, no model)."""

from __future__ import annotations

import json

import pytest

from tests.test_serve_upgrade_ignored import serve_vectors

pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    running = serve_vectors(tmp_path_factory.mktemp("serve-default-k"), "--max-k", "3")
    yield running
    running[0].stop()


def test_a_search_without_k_answers_at_most_max_k_hits(capped):
    server, body, _ = capped
    request = json.loads(body)
    request.pop("k")
    for omitted in (request, {**request, "k": None}):  # null means absent
        answer = server.client.post("/search", json=omitted)
        assert answer.status_code == 200, answer.text
        hits = answer.json()["results"][0]["hits"]
        assert [hit["rank"] for hit in hits] == [1, 2, 3]
    given = server.client.post("/search", json={**request, "k": 3}).json()
    assert given["results"][0]["hits"] == hits
    over = server.client.post("/search", json={**request, "k": 4})
    assert over.status_code == 422 and "--max-k" in over.json()["error"]["message"]
