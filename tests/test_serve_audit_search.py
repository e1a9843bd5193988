"""``petal serve``'s ``/search`` against hostile but well-formed requests: every answer is valid JSON whose
scores are numbers, and a request the index cannot score is refused naming its field. A real server (a
child process) on an index that ``petal index`` built from sample_data, real FAISS, httpx."""

from __future__ import annotations

import json
import math

import pytest

from tests._serve_shared import default_server

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 384


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """``petal serve OUT`` (default flags) on sample_data's index: the session's shared server
    (tests/_serve_shared.py); the tests here only send it requests."""
    return default_server(request, tmp_path_factory)


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


MESSAGE_LIMIT = 1024  # characters of an error message (app.py)


def test_an_error_message_never_echoes_a_huge_client_value_whole(server):
    """A message names the field and the limit; it quoted the client's value whole: a 1 MB model name, filter
    or list of unknown fields came back as a 1 MB error (and in the client's logs). Now a message is cut in the
    middle past a bound, keeping its start (the field) and end (the limit or the form to use)."""
    c = server.client
    huge = "a" * 1_000_000
    cases = [
        ("/v1/embeddings", {"input": "x", "model": huge}, 404, ("model 'aaa", "is not served here")),
        ("/v1/embeddings", {"input": "x", "encoding_format": huge}, 422, ("'encoding_format' must be one of",)),
        ("/v1/embeddings", {"input": "x", **{f"field{i}": 1 for i in range(50_000)}}, 422, ("unknown field",
                                                                                           "allowed: input")),
        ("/search", {"query": "x", "where": f"{huge} = 'y'"}, 422, ("'where'",)),
        ("/search", {"query": "x", "where": "(" * 100_000}, 422, ("'where'", "the form is")),
    ]
    for route, body, status, words in cases:
        answer = c.post(route, json=body)
        assert answer.status_code == status, (route, answer.status_code, answer.text[:300])
        message = answer.json()["error"]["message"]
        assert len(message) <= MESSAGE_LIMIT and len(answer.content) < 2 * MESSAGE_LIMIT, (route, len(message))
        assert all(word in message for word in words), message
        assert "characters cut" in message, message
    # a message under the bound is whole
    short = c.post("/search", json={"query": "x", "k": 0}).json()["error"]["message"]
    assert short == "'k' must be >= 1, got 0"
    assert c.post("/search", json={"query": "glaciers", "k": 2}).json()["results"][0]["hits"]
