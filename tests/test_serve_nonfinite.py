"""``petal serve``: a text that the model embeds to NaN or infinity (finite weights, an overflow inside the model) is
refused with a JSON 422 naming the request's field and item, as ``petal query`` refuses such a query (65) and ``petal
embed`` / ``petal index`` skip it (``non_finite_embedding``): never a ``null`` row (``/v1/embeddings`` float), NaN bytes
(base64) or a search on NaN (``/search``). Only that request fails: the others of the same engine step are answered,
and the server answers the next request.

A real tiny BERT checkpoint (tests/tiny_models.py) whose "bread" embedding row is 3e38 (finite; its LayerNorm
overflows), a real ``petal index`` of it and a real server on a loopback port.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_nonfinite_model import edited, petal_cli
from tests.tiny_models import make_model, vocab

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from tests.test_serve import Server  # noqa: E402  (after the serve extra's checks)

DOCS = ["how do glaciers move", "bread dough rises because yeast ferments", "vector search finds neighbours"]
WAIT_MS = 1500  # --max-wait-ms: requests sent together share one engine step


@pytest.fixture(scope="module")
def poisoned_out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve-nonfinite")
    make_model("bert", root / "clean")

    def poison(tensors):  # finite, but its LayerNorm overflows: every text holding "bread" embeds to NaN
        tensors["embeddings.word_embeddings.weight"][vocab()["bread"]] = 3e38

    model = edited(root / "clean", root / "poison", poison)
    pq.write_table(pa.table({"id": [1, 2, 3], "text": DOCS}), root / "docs.parquet")
    proc = petal_cli("index", str(root / "docs.parquet"), "--out", str(root / "out"), "--model", str(model), "-q")
    assert proc.returncode == 0, proc.stderr
    return root / "out"


@pytest.fixture(scope="module")
def served(poisoned_out):
    """A server that steps each request at once (the tests send one request at a time)."""
    server = Server(poisoned_out.parent / "server.log", poisoned_out)
    yield server
    server.stop()


@pytest.fixture()
def held(poisoned_out, tmp_path):
    """A server whose engine holds a partial batch for --max-wait-ms: requests sent together share one step."""
    server = Server(tmp_path / "server.log", poisoned_out, "--max-wait-ms", str(WAIT_MS))
    yield server
    server.stop()


def refused_item(response: httpx.Response, field: str, item: int) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 422
    assert error["message"].startswith(f"{field} item {item} embeds to NaN or infinite values"), error["message"]
    assert "non_finite_embedding" in error["message"]


def finite_rows(response: httpx.Response, count: int) -> np.ndarray:
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    rows = np.array([d["embedding"] if isinstance(d["embedding"], list)
                     else np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in data], dtype=np.float32)
    assert rows.shape[0] == count and np.isfinite(rows).all()
    return rows


def test_embeddings_refuse_a_text_that_embeds_to_nan(served):
    client = served.client
    for body, item in (({"input": ["glaciers move", "bread dough rises"]}, 1),  # float: was a null row, 200
                       ({"input": "bread", "encoding_format": "base64"}, 0),  # base64: was NaN bytes, 200
                       ({"input": ["vector search", "glaciers", "bread", "bread"], "dimensions": 8}, 2),
                       ({"input": [[vocab()["glaciers"]], [vocab()["bread"], vocab()["rises"]]]}, 1),  # token ids
                       ({"input": "bread rises", "input_type": "document"}, 0)):
        refused_item(client.post("/v1/embeddings", json=body), "input", item)
        # the server stays up and answers the next request
        finite_rows(client.post("/v1/embeddings", json={"input": ["glaciers move", "yeast"]}), 2)
    finite_rows(client.post("/v1/embeddings", json={"input": "glaciers", "encoding_format": "base64"}), 1)


def test_search_refuses_a_query_that_embeds_to_nan(served):
    client = served.client
    refused_item(client.post("/search", json={"query": "bread rises", "k": 2}), "query", 0)
    refused_item(client.post("/search", json={"queries": ["glaciers", "vector search", "bread"], "k": 2}), "queries", 2)
    answer = client.post("/search", json={"queries": ["glaciers", "vector search"], "k": 1})
    assert answer.status_code == 200, answer.text
    assert [r["hits"][0]["id"] for r in answer.json()["results"]] == [1, 3]
    assert all(np.isfinite(r["hits"][0]["score"]) for r in answer.json()["results"])
    metrics = client.get("/metrics").text
    assert re.search(r'^petal_requests_total\{route="/search",status="422"\} 2\.0$', metrics, re.M), metrics


def _metric(client: httpx.Client, name: str) -> float:
    found = re.search(rf"^{name} ([\d.e+]+)$", client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_the_other_requests_of_the_same_step_are_answered(held):
    """Five requests queued together (held by --max-wait-ms), two of them holding "bread": one engine step; the
    two are refused by their item, the three others answered."""
    served = held
    url = served.url
    bodies = [("/v1/embeddings", {"input": ["glaciers move", "yeast ferments"]}),
              ("/v1/embeddings", {"input": ["vector search", "bread dough", "neighbours"]}),
              ("/search", {"query": "glaciers", "k": 1}),
              ("/search", {"queries": ["neighbours", "bread"], "k": 1}),
              ("/v1/embeddings", {"input": "dough rises", "encoding_format": "base64"})]
    texts = sum(1 if isinstance(b.get("input", b.get("query")), str) else len(b.get("input", b.get("queries")))
                for _, b in bodies)
    steps_before = _metric(served.client, "petal_batch_texts_count")
    answers: list[dict] = [{} for _ in bodies]

    def send(route: str, body: dict, answer: dict) -> None:
        answer["response"] = httpx.post(f"{url}{route}", json=body, timeout=60.0)

    threads = [threading.Thread(target=send, args=(*b, a), daemon=True) for b, a in zip(bodies, answers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert _metric(served.client, "petal_batch_texts_count") - steps_before == 1  # one step held all of them
    assert _metric(served.client, "petal_batch_texts_sum") >= texts
    responses = [a["response"] for a in answers]
    finite_rows(responses[0], 2)
    refused_item(responses[1], "input", 1)
    assert responses[2].status_code == 200 and responses[2].json()["results"][0]["hits"][0]["id"] == 1
    refused_item(responses[3], "queries", 1)
    finite_rows(responses[4], 1)
    # and the next request is answered
    started = time.monotonic()
    finite_rows(served.client.post("/v1/embeddings", json={"input": "glaciers"}), 1)
    assert time.monotonic() - started < 30
