"""``petal serve``'s ``/search`` against hostile but well-formed requests: every answer is valid JSON whose
scores are numbers, and a request the index cannot score is refused naming its field. A real server (a
child process) on an index that ``petal index`` built from sample_data, real FAISS, httpx."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import SAMPLE_DATA

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 384


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.test_serve import Server, cli_run

    root = tmp_path_factory.mktemp("serve-audit-search")
    cli_run("index", SAMPLE_DATA, "--out", root / "out", "-q")
    running = Server(root / "server.log", root / "out")
    yield running
    running.stop()


def _row(value: float, first: float | None = None) -> list[float]:
    row = [value] * DIM
    if first is not None:
        row[0] = first
    return row


def test_vectors_whose_scores_overflow_float32_are_refused_not_answered_with_null_scores(server):
    """Each value of 3e38 is a finite float32 (taken by the parser), but its product with the stored vectors is
    not: FAISS scores +-inf, which JSON has no number for (orjson wrote null; the standard library would write
    Infinity, not JSON at all), and the ranking is meaningless. Refused with 422 naming the row."""
    c = server.client
    for rows, bad in (([_row(3e38)], 0), ([_row(0.01), _row(-3e38)], 1), ([_row(0.0, first=3.4e38)] * 2, None)):
        raw = c.post("/search", json={"vectors": rows, "k": 5})
        answer = json.loads(raw.content)  # NOTE: strict: no NaN/Infinity
        if bad is None:  # one huge value against unit vectors: a finite score, answered
            assert raw.status_code == 200, raw.text
            scores = [h["score"] for r in answer["results"] for h in r["hits"]]
            assert scores and all(isinstance(s, float) and math.isfinite(s) for s in scores), scores
            continue
        assert raw.status_code == 422, (bad, raw.status_code, raw.text[:300])
        message = answer["error"]["message"]
        assert f"'vectors' row {bad}" in message and "float32" in message, message
    # the same request scaled down is answered, and the server keeps serving text queries
    fine = c.post("/search", json={"vectors": [_row(0.05)], "k": 3})
    assert fine.status_code == 200 and len(fine.json()["results"][0]["hits"]) == 3
    assert c.post("/search", json={"query": "glaciers", "k": 2}).json()["results"][0]["hits"]
