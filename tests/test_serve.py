"""``petal serve``: a real uvicorn server (a child process on a loopback port) over the packaged MiniLM
and an index that ``petal index`` built from sample_data; the official ``openai`` client and httpx."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.conftest import SAMPLE_DATA

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

KEY = "s3cret-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
QUERIES = ["how do glaciers move", "espresso and coffee", "volcano eruption", "sourdough bread starter"]
STARTUP_S = 120


class Server:
    """``petal serve ...`` in a child process; the port is read from its startup line."""

    def __init__(self, log: Path, *args: object, api_key_env: str | None = None) -> None:
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("PETAL_API_KEY", None)
        if api_key_env is not None:
            env["PETAL_API_KEY"] = api_key_env
        with open(log, "wb") as stderr:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0",
                                          "--log-level", "warning", *map(str, args)],
                                         stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        deadline = time.monotonic() + STARTUP_S
        while True:
            found = re.search(r"listening on (http://[\d.]+:\d+)", log.read_text(errors="replace"))
            if found:
                self.url = found.group(1)
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"petal serve did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.02)
        self.client = httpx.Client(base_url=self.url, timeout=60.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cli_run(*args: object):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """sample_data indexed with MiniLM (a copy of the session's index, tests/_serve_shared.py), and a server on it.
    DATA is sample_data itself: a test adds a shard in a directory of its own, indexed with it."""
    from tests._serve_shared import copy_sample_out

    root = tmp_path_factory.mktemp("serve")
    data = SAMPLE_DATA
    out = copy_sample_out(tmp_path_factory, root / "out")
    server = Server(root / "server.log", out, "--api-key", KEY, "--reload-interval-s", "0.1",
                    "--max-texts", "16", "--max-k", "50", "--max-tokens-per-text", "64",
                    "--max-body-bytes", "65536")
    yield server, out, data
    server.stop()


def search(server: Server, **body):
    response = server.client.post("/search", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def test_openai_client_gets_petal_embed_vectors(served):
    server, _, _ = served
    model_id = server.client.get("/v1/models", headers=AUTH).json()["data"][0]["id"]
    assert model_id == "all-MiniLM-L6-v2"
    openai = pytest.importorskip("openai")  # NOTE: here, not at import: 10 modules import this one's helpers
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == [model_id] and client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    texts = ["The quick brown fox", "glaciers slide on meltwater", "a third, different sentence"]
    expected = np.array([json.loads(line)["embedding"]
                         for line in cli_run("embed", *texts).stdout.splitlines()], dtype=np.float32)
    as_base64 = client.embeddings.create(model=model_id, input=texts)  # the client asks for base64
    as_float = client.embeddings.create(model=model_id, input=texts, encoding_format="float")
    for answer in (as_base64, as_float):
        got = np.array([d.embedding for d in answer.data], dtype=np.float32)
        assert [d.index for d in answer.data] == [0, 1, 2]
        np.testing.assert_allclose(got, expected, atol=2e-6)
        assert answer.usage.prompt_tokens > len(texts)
    # Matryoshka: --dim renormalises; the server's `dimensions` does the same
    expected_128 = np.array([json.loads(line)["embedding"]
                             for line in cli_run("embed", *texts, "--dim", "128").stdout.splitlines()])
    short = client.embeddings.create(model=model_id, input=texts, dimensions=128, encoding_format="float")
    got = np.array([d.embedding for d in short.data])
    assert got.shape == (3, 128)
    np.testing.assert_allclose(got, expected_128, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_token_id_input_and_raw_base64(served):
    server, _, _ = served
    from petal.engine.loader import inspect_model
    from petal.pipeline.ingest.tokens import tokenizer_for

    text = "token ids in, the same vector out"
    ids = tokenizer_for(inspect_model(None), "query").encode([text]).token_ids[0].tolist()
    by_text = server.client.post("/v1/embeddings", json={"input": text}, headers=AUTH).json()
    by_ids = server.client.post("/v1/embeddings", json={"input": ids, "encoding_format": "base64"},
                                headers=AUTH).json()
    vector = np.frombuffer(base64.b64decode(by_ids["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, by_text["data"][0]["embedding"], atol=1e-6)
    assert by_ids["usage"]["prompt_tokens"] == len(ids) == by_text["usage"]["prompt_tokens"]
    document = server.client.post("/v1/embeddings", json={"input": [ids, ids[:3]], "input_type": "document"},
                                  headers=AUTH).json()
    assert len(document["data"]) == 2 and document["usage"]["prompt_tokens"] == len(ids) + 3


def test_search_matches_petal_query(served):
    server, out, _ = served
    runner = CliRunner().invoke(cli, ["query", str(out), "--stdin", "--json", "--show-text", "-k", "5"],
                                input="\n".join(QUERIES) + "\n")
    assert runner.exit_code == 0, runner.output
    expected = [json.loads(line) for line in runner.stdout.splitlines()]
    answer = search(server, queries=QUERIES, k=5, include=["text", "metadata"])
    version = json.loads((out / "versions" / (out / "CURRENT").read_text().strip() / "manifest.json")
                         .read_text())["version"]
    assert answer["version"] == version
    assert [r["query"] for r in answer["results"]] == QUERIES
    for got, want in zip(answer["results"], expected):
        assert [h["id"] for h in got["hits"]] == [h["id"] for h in want["hits"]]
        assert [(h["shard"], h["row"], h["text"]) for h in got["hits"]] == \
            [(h["shard"], h["row"], h["text"]) for h in want["hits"]]
        np.testing.assert_allclose([h["score"] for h in got["hits"]], [h["score"] for h in want["hits"]], atol=2e-6)
        assert all(set(h["metadata"]) == {"id", "title", "topic"} for h in got["hits"])
    one = search(server, query=QUERIES[0], k=3)
    assert [h["id"] for h in one["results"][0]["hits"]] == [h["id"] for h in expected[0]["hits"][:3]]
    assert "text" not in one["results"][0]["hits"][0]
    # vectors in the index's space search directly
    vector = server.client.post("/v1/embeddings", json={"input": QUERIES[0]}, headers=AUTH).json()["data"][0]
    by_vector = search(server, vectors=[vector["embedding"]], k=5, nprobe=4)
    assert [h["id"] for h in by_vector["results"][0]["hits"]] == [h["id"] for h in expected[0]["hits"]]


def test_concurrent_clients_get_their_own_answers(served):
    server, _, _ = served
    texts = [f"{q} {n}" for q in QUERIES for n in ("", "in winter", "near the sea", "for beginners")]
    alone_search = {t: search(server, query=t, k=5)["results"][0]["hits"] for t in texts}
    alone_embed = {t: server.client.post("/v1/embeddings", json={"input": t}, headers=AUTH).json()
                   ["data"][0]["embedding"] for t in texts}

    def client(worker: int) -> int:
        checked = 0
        with httpx.Client(base_url=server.url, timeout=60.0, headers=AUTH) as c:
            for i in range(3):
                text = texts[(worker * 3 + i) % len(texts)]
                if (worker + i) % 2:
                    hits = c.post("/search", json={"query": text, "k": 5}).json()["results"][0]["hits"]
                    assert [h["id"] for h in hits] == [h["id"] for h in alone_search[text]]
                    np.testing.assert_allclose([h["score"] for h in hits],
                                               [h["score"] for h in alone_search[text]], atol=1e-5)
                else:
                    pair = [text, texts[worker % len(texts)]]
                    data = c.post("/v1/embeddings", json={"input": pair}).json()["data"]
                    for row, t in zip(data, pair):
                        np.testing.assert_allclose(row["embedding"], alone_embed[t], atol=1e-5)
                checked += 1
        return checked

    with ThreadPoolExecutor(32) as pool:
        assert sum(pool.map(client, range(32))) == 96
    metrics = server.client.get("/metrics").text
    texts_per_step = re.search(r"^petal_batch_texts_sum ([\d.e+]+)", metrics, re.M)
    steps = re.search(r"^petal_batch_texts_count ([\d.e+]+)", metrics, re.M)
    assert texts_per_step and steps and float(steps.group(1)) > 0
    for name in ("petal_queue_seconds_count", "petal_batch_tokens_sum", "petal_step_seconds_count",
                 'petal_requests_total{route="/search",status="200"}',
                 'petal_requests_total{route="/v1/embeddings",status="200"}'):
        value = re.search(rf"^{re.escape(name)} ([\d.e+]+)", metrics, re.M)
        assert value and float(value.group(1)) > 0, name
    assert re.search(r'^petal_index_version\{version="v\d{6}-[^"]+"\} 1\.0$', metrics, re.M)
    assert re.search(r"^petal_graph_replays_total ", metrics, re.M)  # CUDA-graph replays (0 on the CPU)
    # the server process's garbage collections, timed (96 requests allocate enough for young ones)
    collections = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^petal_gc_collections_total\{generation="(\d)"\} (\S+)$', metrics, re.M)}
    assert set(collections) == {"0", "1", "2"} and collections["0"] > 0, collections
    paused = re.search(r'^petal_gc_seconds_total\{generation="0"\} (\S+)$', metrics, re.M)
    assert paused and float(paused.group(1)) > 0
    # what lives as long as the process is frozen out of every collection once loaded: ~190k objects here
    # (libraries, MiniLM); without freeze_long_lived only the CLI's own modules, ~15k
    frozen = re.search(r"^petal_gc_frozen_objects (\S+)$", metrics, re.M)
    assert frozen and float(frozen.group(1)) > 100_000, frozen
    # the longest pause counts from the server's start (the load's deliberate full collection is not in it)
    longest = re.search(r'^petal_gc_longest_pause_seconds\{generation="2"\} (\S+)$', metrics, re.M)
    full = re.search(r'^petal_gc_seconds_total\{generation="2"\} (\S+)$', metrics, re.M)
    assert longest and full and float(longest.group(1)) < float(full.group(1))


def test_bad_requests_get_4xx_and_the_server_keeps_serving(served):
    server, _, _ = served
    c = server.client
    post = lambda path, **kw: c.post(path, headers={**AUTH, **kw.pop("headers", {})}, **kw)

    cases = [
        (post("/search", content=b"{not json"), 400, "not valid JSON"),
        (post("/search", json=["a list"]), 400, "JSON object"),
        (post("/search", json={"query": "x", "colour": "red"}), 422, "unknown field"),
        (post("/search", json={"query": 5}), 422, "'query' must be a string"),
        (post("/search", json={"query": "x", "k": "ten"}), 422, "'k' must be an integer"),
        (post("/search", json={"query": "x", "k": 51}), 422, "limit of 50"),
        (post("/search", json={"query": "x", "k": 0}), 422, "'k' must be >= 1"),
        (post("/search", json={"query": "x", "queries": ["y"]}), 422, "exactly one"),
        (post("/search", json={"vectors": [[0.1, 0.2]]}), 422, "384 values"),
        (post("/search", json={"queries": ["q"] * 17}), 413, "limit of 16"),
        (post("/search", json={"query": "word " * 200}), 413, "more than 64 tokens"),
        (post("/v1/embeddings", json={"input": "x", "model": "gpt-4"}), 404, "not served here"),
        (post("/v1/embeddings", json={"input": "x", "dimensions": 999}), 422, "384"),
        (post("/v1/embeddings", json={"input": "x", "encoding_format": "int"}), 422, "float, base64"),
        (post("/v1/embeddings", json={"input": [1, 2, 10**9]}), 422, "outside the vocabulary"),
        (post("/v1/embeddings", json={"input": ["ok", 3]}), 422, "list of strings"),
        (post("/v1/embeddings", json={"input": ""}), 422, "empty"),
        (post("/v1/embeddings", json={}), 422, "'input' is required"),
        (post("/v1/embeddings", content=b'{"input": "' + b"a" * 70000 + b'"}'), 413, "limit of 65536"),
        (c.post("/search", json={"query": "x"}), 401, "API key"),
        (c.post("/search", json={"query": "x"}, headers={"Authorization": "Bearer wrong"}), 401, "API key"),
        (c.get("/v1/models", headers={"Authorization": f"Basic {KEY}"}), 401, "API key"),
    ]
    for response, status, text in cases:
        assert response.status_code == status, (status, response.text)
        assert text in response.json()["error"]["message"], response.text
    assert cases[-2][0].headers["www-authenticate"] == "Bearer"
    # chunked upload without Content-Length: cut off while streaming
    chunks = (b"x" * 8192 for _ in range(10))
    assert post("/v1/embeddings", content=chunks).status_code == 413
    # over the token limit, on request: truncated like `petal index` does
    assert post("/search", json={"query": "word " * 200, "truncate": True}).status_code == 200
    assert c.get("/health").json() == {"status": "ok"}
    assert search(server, query="glaciers", k=2)["results"][0]["hits"]
    metrics = c.get("/metrics").text
    assert 'petal_requests_total{route="/search",status="401"} 2.0' in metrics
    assert 'petal_requests_total{route="/search",status="413"}' in metrics


VECTOR = b",".join([b"0.05"] * 383)
HOSTILE = [  # (route, raw body, status, in the message): each once found answering 200 or 500
    ("/search", b'{"vectors": [[NaN,' + VECTOR + b"]]}", 422, "finite float32"),
    ("/search", b'{"vectors": [[Infinity,' + VECTOR + b"]]}", 422, "finite float32"),
    ("/search", b'{"vectors": [[1e39,' + VECTOR + b"]]}", 422, "finite float32"),
    ("/search", b'{"vectors": [[1e400,' + VECTOR + b"]]}", 422, "finite float32"),
    ("/search", b'{"vectors": [[1' + b"0" * 40 + b"," + VECTOR + b"]]}", 422, "finite float32"),
    ("/search", b'{"vectors": [[' + VECTOR + b"], [" + VECTOR + b",0.1]]}", 422, "same length"),
    ("/search", b'{"query": "x", "nprobe": 2147483648}', 422, "over the limit of 2147483647"),
    ("/search", b'{"query": "x", "rescore": 100000000}', 422, "over the limit of 65536"),
    ("/search", b'{"query": "x", "k": 123456789012345678901234567890}', 422, "over the limit of 50"),
    ("/search", b'{"query": "x", "k": 2.5}', 422, "must be an integer, not 2.5"),
    ("/search", b'{"query": "x", "where": "topic = \'a\'"}', 422, "'where': unknown column 'topic'"),
    ("/search", '{"query": "\u200b\u200b"}'.encode(), 422, "'query' item 0 is empty"),
    ("/search", b'{"queries": ["fine", "\\u0001\\u0002 "]}', 422, "'queries' item 1 is empty"),
    ("/search", b'{"query": "x", "k": 1, "query": "y"}', 422, "'query' is given more than once"),
    ("/search", b'{"query": "x", "\\u0071uery": "y"}', 422, "'query' is given more than once"),
    ("/search", '{"query": "x"}'.encode("utf-16"), 400, "not valid JSON"),
    ("/search", b'{"query": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nested too deeply"),
    ("/v1/embeddings", b'{"input": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}", 400, "nested too deeply"),
    ("/v1/embeddings", b'{"input": "x", "dimensions": 1' + b"0" * 5000 + b"}", 400, "not valid JSON"),
    ("/v1/embeddings", b'{"input": [101, 123456789012345678901, 102]}', 422, "outside the vocabulary"),
    ("/v1/embeddings", b'{"input": "x", "dimensions": 18446744073709551616}', 422, "the model has 384"),
    ("/v1/embeddings", '{"input": ["ok", "\u200b"]}'.encode(), 422, "'input' item 1 is empty"),
    ("/v1/embeddings", b'{"input": "x", "input": "y"}', 422, "'input' is given more than once"),
    ("/v1/embeddings", b'{"input": "x", "encoding_format": ["float"]}', 422, "float, base64"),
    # nested 1000 deep (orjson reads up to 1024): its repr in the message was a RecursionError, a 500
    ("/v1/embeddings", b'{"input": "x", "encoding_format": ' + b"[" * 1000 + b"]" * 1000 + b"}", 422,
     "got an array"),
    ("/v1/embeddings", b'{"input": "x", "input_type": ' + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}", 422,
     "got an object"),
]


def test_hostile_bodies_get_4xx_naming_the_field(served):
    server, _, _ = served
    for route, body, status, text in HOSTILE:
        response = server.client.post(route, content=body, headers=AUTH)
        assert response.status_code == status, (body[:80], response.text)
        assert text in response.json()["error"]["message"], (body[:80], response.text)
    assert 'petal_requests_total{route="/search",status="500"}' not in server.client.get("/metrics").text
    assert search(server, query="glaciers", k=1)["results"][0]["hits"]


@pytest.mark.parametrize("field", ["query", "queries"])
def test_texts_refused_after_tokenizing_name_their_field(served, field):
    """A text refused once tokenized (empty to the model: 422; over --max-tokens-per-text 64: 413) names the
    request's own field, in the message and ``param``: ``queries`` was answered as ``query``."""
    server, _, _ = served
    for text, status, said in [("\u0301\u0301", 422, "is empty to the model"), ("ice " * 100, 413, "more than 64")]:
        body = {"query": text} if field == "query" else {"queries": ["glaciers", text]}
        response = server.client.post("/search", json=body, headers=AUTH)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        row = 0 if field == "query" else 1
        assert error["message"].startswith(f"{field} item {row} ") and said in error["message"], error
        assert error["param"] == field, error


def test_null_means_absent_and_texts_follow_the_query_rule(served):
    """null for an optional field is its default; a lone surrogate is read as U+FFFD (as petal query reads
    bytes that are not UTF-8), never a 500 for its request and the others batched with it."""
    server, _, _ = served
    answer = search(server, query="glaciers", k=None, include=None, truncate=None, queries=None, where=None)
    assert len(answer["results"][0]["hits"]) == 10
    embedded = server.client.post("/v1/embeddings", headers=AUTH,
                                  json={"input": "x", "truncate": None, "dimensions": None, "user": None})
    assert embedded.status_code == 200, embedded.text
    plain = server.client.post("/v1/embeddings", json={"input": "\ufffd abc"}, headers=AUTH).json()
    with ThreadPoolExecutor(4) as pool:  # the odd text and good ones at once: batched together
        bodies = [b'{"input": "\\udcff abc"}'] + [b'{"input": "espresso"}'] * 3
        answers = list(pool.map(lambda b: server.client.post("/v1/embeddings", content=b, headers=AUTH), bodies))
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    np.testing.assert_allclose(answers[0].json()["data"][0]["embedding"], plain["data"][0]["embedding"], atol=1e-6)
    odd = server.client.post("/search", content=b'{"query": "\\ud800 glaciers", "k": 1}', headers=AUTH)
    assert odd.status_code == 200 and odd.json()["results"][0]["query"] == "\ufffd glaciers"  # one per surrogate
    odd = server.client.post("/search", content=b'{"queries": ["a\\udc80\\ud800b", "\\ud83d\\ude00 x"], "k": 1}',
                             headers=AUTH)
    assert [r["query"] for r in odd.json()["results"]] == ["a\ufffd\ufffdb", "\U0001f600 x"], odd.text
    # a field's name written as a value is no repeated field
    assert search(server, query="query", k=1)["results"][0]["query"] == "query"


def test_unknown_routes_and_methods_answer_json_and_are_counted(served):
    server, _, _ = served
    c = server.client
    missing = c.get("/v2/embeddings", headers=AUTH)
    assert missing.status_code == 404 and "/v2/embeddings" in missing.json()["error"]["message"]
    for path in ("/search/", "/v1/embeddings/", "/ready/"):  # no 307 with an empty body: a 404 with a hint
        slashed = c.request("GET" if path == "/ready/" else "POST", path, json={"query": "x"}, headers=AUTH)
        assert slashed.status_code == 404, (path, slashed.status_code, slashed.text)
        assert f"did you mean {path.rstrip('/')!r}?" in slashed.json()["error"]["message"]
    for method, path in (("GET", "/search"), ("PUT", "/v1/embeddings"), ("POST", "/health"), ("DELETE", "/ready")):
        response = c.request(method, path, headers=AUTH)
        assert response.status_code == 405, (method, path, response.text)
        assert response.json()["error"]["type"] == "method_not_allowed"
        assert method in response.json()["error"]["message"] and "allow" in response.headers
    def count(route: str) -> float:
        found = re.search(rf'^petal_requests_total\{{route="{re.escape(route)}",status="404"\}} (\S+)',
                          c.get("/metrics").text, re.M)
        return float(found.group(1)) if found else 0.0

    before = count("unmatched"), count("/v1/models/{model}")
    for path in ("/v1/models/", "/v1/models//"):  # names no model: no route, counted as such
        assert c.get(path, headers=AUTH).status_code == 404
    assert (count("unmatched"), count("/v1/models/{model}")) == (before[0] + 2, before[1])
    metrics = c.get("/metrics").text
    assert 'petal_requests_total{route="unmatched",status="404"}' in metrics
    assert 'petal_requests_total{route="/search",status="405"}' in metrics

    # a client that hangs up halfway through its body: counted as such (499, "client closed request"), neither a
    # server error nor a bad request (400, before)
    def count() -> float:
        found = re.search(r'^petal_requests_total\{route="/v1/embeddings",status="499"\} ([\d.e+]+)',
                          c.get("/metrics").text, re.M)
        return float(found.group(1)) if found else 0.0

    before = count()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                    "Content-Length: 100\r\n\r\n{\"input\": ".encode())
    deadline = time.monotonic() + 30
    while count() == before:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert 'route="/v1/embeddings",status="500"' not in c.get("/metrics").text


def test_the_two_post_routes_taken_straight_keep_every_answer(served):
    """POST /v1/embeddings and /search skip Starlette's router (app.py): its other answers stay Starlette's."""
    server, _, _ = served
    c = server.client
    for path, body in (("/v1/embeddings", {"input": "how do glaciers move"}), ("/search", {"query": "glaciers"})):
        answer = c.post(path, json=body, headers=AUTH)
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        spans = dict(part.strip().split(";dur=") for part in answer.headers["server-timing"].split(","))
        assert {"engine", "encode", "app"} <= set(spans) and float(spans["app"]) > 0
        refused = c.post(path, json=body)  # no key
        assert refused.status_code == 401 and "app;dur=" in refused.headers["server-timing"]  # a refusal's too
        bad = c.post(path, json={**body, "k": "x"}, headers=AUTH)
        assert bad.status_code == 422 and "app;dur=" in bad.headers["server-timing"]
        slash = c.post(path + "/", json=body, headers=AUTH)  # Starlette's 404 (no redirect), in the JSON shape
        assert slash.status_code == 404 and f"did you mean {path!r}?" in slash.json()["error"]["message"]
        assert c.request("HEAD", path, headers=AUTH).status_code == 405
    metrics = c.get("/metrics").text
    assert re.search(r'^petal_request_seconds_count\{route="/v1/embeddings",status="200"\} [1-9]', metrics, re.M)
    assert 'petal_requests_total{route="/search",status="401"}' in metrics


def test_an_override_the_index_has_no_use_for_is_said(served):
    """nprobe of a Flat index, rescore of a float one: answered (an auto factory turns Flat into IVF from one
    re-index to the next) and named in `ignored`."""
    server, _, _ = served
    answer = search(server, query="glaciers", k=2, nprobe=4, rescore=3)
    assert [h["id"] for h in answer["results"][0]["hits"]] == \
        [h["id"] for h in search(server, query="glaciers", k=2)["results"][0]["hits"]]
    assert len(answer["ignored"]) == 2 and "'nprobe' 4 is ignored" in answer["ignored"][0]
    assert "ignored" not in search(server, query="glaciers", k=2)


def _publish_copy(out: Path, edit) -> tuple[str, str]:
    """A new version that is the live one with its manifest edited (files unchanged), made live."""
    live = (out / "CURRENT").read_text().strip()
    number = int(live[1:7]) + 1
    new = f"v{number:06d}{live[7:]}"
    shutil.copytree(out / "versions" / live, out / "versions" / new)
    manifest_file = out / "versions" / new / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["version"] = new
    edit(manifest)
    manifest_file.write_text(json.dumps(manifest))
    tmp = out / ".CURRENT.tmp-test"
    tmp.write_text(new + "\n")
    os.replace(tmp, out / "CURRENT")
    return live, new


def _wait_ready(server: Server, predicate, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        ready = server.client.get("/ready").json()
        if predicate(ready) or time.monotonic() > deadline:
            return ready
        time.sleep(0.05)


def test_a_version_of_another_model_or_transform_is_refused(served):
    server, out, _ = served

    def other_weights(manifest: dict) -> None:
        manifest["model"]["weights_sha256"] = "0" * 64

    def other_dim(manifest: dict) -> None:
        manifest["output"] = {"model_dim": 384, "dim": 384, "renormalize": True, "cosine": True,
                              "quantize": "none", "int8_scheme": None, "output_dtype": "float16"}

    for edit, reason in ((other_weights, "model"), (other_dim, "output")):
        live, new = _publish_copy(out, edit)
        ready = _wait_ready(server, lambda r, new=new: r.get("refused", {}).get("version") == new)
        assert ready["version"] == live and ready["refused"]["reason"] == reason, ready
        assert f'petal_index_refused{{reason="{reason}",version="{new}"}} 1.0' in server.client.get("/metrics").text
        assert search(server, query="glaciers", k=1)["version"] == live  # the old version keeps serving
        tmp = out / ".CURRENT.tmp-test"  # back to the live version, as a rollback would
        tmp.write_text(live + "\n")
        os.replace(tmp, out / "CURRENT")
        shutil.rmtree(out / "versions" / new)
        assert "refused" not in _wait_ready(server, lambda r: "refused" not in r)


def test_a_version_indexed_with_another_model_of_another_dim_is_refused_as_model(served, tmp_path, minilm_spec,
                                                                                 tiny_bert_dir):
    """`petal index --model OTHER --full` into OUT (64 dims, the server's model 384): refused for its model, once,
    and not tried again (an "open" error would be retried every minute and named as a broken version)."""
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.follower import IndexFollower
    from petal.pipeline.serve.metrics import ServeMetrics

    _, out, data = served
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("store", ".lock"))
    live = (copy / "CURRENT").read_text().strip()
    metrics = ServeMetrics()
    follower = IndexFollower(copy, minilm_spec, SearchIndex.open(copy, minilm_spec), metrics, retry_first_s=0.01)
    cli_run("index", data, "--out", copy, "--model", tiny_bert_dir, "--full", "-q")
    other = (copy / "CURRENT").read_text().strip()
    assert follower.check_once() is False and follower.live.version == live
    refused = follower.status()["refused"]
    assert (refused["version"], refused["reason"]) == (other, "model") and "retry_in_s" not in refused, refused
    assert f'petal_index_refused{{reason="model",version="{other}"}} 1.0' in metrics.render().decode()
    time.sleep(0.05)
    assert not follower.due()  # waits for CURRENT to change


def test_reindex_while_clients_search(served, tmp_path):
    """A `petal index` run publishes a new version under load: no failure, each answer from one version."""
    server, out, data = served
    old = server.client.get("/ready").json()["version"]
    new_text = "Zorblax crystals hum at night on the moons of the outer planets."
    added = tmp_path / "added"  # a shard more: indexed with DATA's (1 added, 3 unchanged)
    added.mkdir()
    pq.write_table(pa.table({"id": ["doc-new-1"], "title": ["zorblax"], "text": [new_text], "topic": ["space"]}),
                   added / "shard-003.parquet")
    answers: list[tuple[str, list[str]]] = []
    failures: list[str] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=server.url, timeout=60.0, headers=AUTH) as c:
            while not stop.is_set():
                r = c.post("/search", json={"query": "zorblax crystals humming", "k": 3})
                if r.status_code != 200:
                    failures.append(r.text)
                    continue
                body = r.json()
                answers.append((body["version"], [h["id"] for h in body["results"][0]["hits"]]))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        indexer = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(data), str(added), "--out",
                                  str(out), "-q"], capture_output=True, text=True, timeout=300)
        assert indexer.returncode == 0, indexer.stderr
        new = (out / "CURRENT").read_text().strip()
        ready = _wait_ready(server, lambda r: r["version"] == new)
        assert ready["version"] == new
        # a few answers from the new version too: awaited (a fixed 0.3 s raced the clients on a loaded machine,
        # where one search can take longer than that)
        deadline = time.monotonic() + 60
        while not (failures or (len(answers) > 4 and any(v == new for v, _ in answers))):
            assert time.monotonic() < deadline, (len(answers), failures[:1])
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures
    versions = {v for v, _ in answers}
    assert versions <= {old, new} and new in versions and len(answers) > 4
    for version, ids in answers:  # each answer is wholly one version's
        assert ("doc-new-1" in ids) == (version == new), (version, ids)
        if version == new:
            assert ids[0] == "doc-new-1"
    assert 'petal_index_reloads_total{result="loaded"}' in server.client.get("/metrics").text


def test_a_model_of_fewer_than_100_tokens_warms_up_and_serves(tmp_path):
    """`petal serve --model` of a model whose vocabulary is smaller than the warm-up's token id (a tiny test
    model: 68 tokens) starts (the warm-up once looked up token 100: IndexError, no server) and answers as
    `petal embed --query` does."""
    from tests.tiny_models import make_model

    model = tmp_path / "tiny-bert"
    make_model("bert", model)
    assert json.loads((model / "config.json").read_text())["vocab_size"] < 100
    server = Server(tmp_path / "server.log", "--model", model)
    try:
        texts = ["how do glaciers move", "bread dough rises"]
        answer = server.client.post("/v1/embeddings", json={"input": texts})
        assert answer.status_code == 200, answer.text
        expected = [json.loads(line)["embedding"]
                    for line in cli_run("embed", "--model", model, "--query", *texts).stdout.splitlines()]
        np.testing.assert_allclose([d["embedding"] for d in answer.json()["data"]], expected, atol=2e-5)
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_embeddings_only_server_drains_on_sigterm(tmp_path):
    """`--model` alone: /search is 404; SIGTERM lets an in-flight request finish, then exits 0."""
    from petal.engine.loader import default_model_dir

    server = Server(tmp_path / "log", "--model", default_model_dir(), "--max-wait-ms", "1500",
                    "--max-tokens-per-text", "1000", api_key_env="env-key")
    try:
        # a limit over the model's own is said, not silently lowered
        assert "--max-tokens-per-text 1000 is over the model's max length (256)" in (tmp_path / "log").read_text()
        assert server.client.post("/search", json={"query": "x"}).status_code == 401  # the key from PETAL_API_KEY
        server.client.headers["Authorization"] = "Bearer env-key"
        assert server.client.post("/search", json={"query": "x"}).status_code == 404
        assert server.client.post("/search", content=b"{not json").status_code == 404  # no index: said first
        assert server.client.get("/ready").json()["status"] == "ready"
        result: dict = {}

        def slow() -> None:
            result["response"] = httpx.post(f"{server.url}/v1/embeddings", json={"input": ["held in the queue"] * 4},
                                            headers={"Authorization": "Bearer env-key"}, timeout=60.0)

        thread = threading.Thread(target=slow)
        thread.start()
        deadline = time.monotonic() + 30
        while "petal_queue_texts 4.0" not in server.client.get("/metrics").text:  # it waits for --max-wait-ms
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert result["response"].status_code == 200 and len(result["response"].json()["data"]) == 4
        assert server.proc.wait(30) == 0
        assert "stopped (in-flight requests drained)" in (tmp_path / "log").read_text()
    finally:
        server.stop()


def _held_in_queue(server: Server, count: int, texts: int) -> list[dict]:
    """``count`` /v1/embeddings requests of ``texts`` texts each, sent from threads; returns once the server's
    queue holds them all (they wait for --max-wait-ms). Each thread's answer lands in its dict."""
    answers: list[dict] = [{} for _ in range(count)]

    def send(answer: dict) -> None:
        try:
            answer["response"] = httpx.post(f"{server.url}/v1/embeddings", json={"input": ["held"] * texts},
                                            timeout=60.0)
        except httpx.HTTPError as exc:
            answer["error"] = exc

    for answer in answers:
        threading.Thread(target=send, args=(answer,), daemon=True).start()
    deadline = time.monotonic() + 30
    while f"petal_queue_texts {float(count * texts)}" not in server.client.get("/metrics").text:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return answers


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT], [signal.SIGTERM, signal.SIGTERM],
                                     [signal.SIGINT, signal.SIGTERM], [signal.SIGTERM, signal.SIGHUP]],
                         ids=["timeout", "second", "term-term", "int-term", "term-hup"])
def test_requests_past_the_drain_are_answered_503_and_the_server_exits_0(tmp_path, signals):
    """Requests still running when --drain-timeout-s passes (or when a second signal of any stop kind cuts the drain
    short: only a second SIGINT did, a scheduler's SIGTERM, SIGTERM waited out the drain) get
    a JSON 503 with Retry-After, not a 500; what was queued is dropped, the engine thread stops before the
    process ends (no abort, exit 134), no traceback, and the last line says how many were cut off."""
    from petal.engine.loader import default_model_dir

    log = tmp_path / "log"
    # NOTE: with two signals the drain timeout is long, so that only the second signal can cut the drain short (with
    # 1 s, a second signal later than that on a loaded machine found the drain already over)
    drain = "1" if len(signals) == 1 else "60"
    server = Server(log, "--model", default_model_dir(), "--max-wait-ms", "60000", "--drain-timeout-s", drain)
    try:
        answers = _held_in_queue(server, 3, 2)
        stopping = time.monotonic()
        for n, sig in enumerate(signals):
            if n:
                _wait_port_closed(server)  # the first signal was handled: two at once could merge into one
            server.proc.send_signal(sig)
        assert server.proc.wait(30) == 0
        assert time.monotonic() - stopping < 15  # not the 60 s the batch would have waited
        for answer in answers:
            deadline = time.monotonic() + 10
            while "response" not in answer and "error" not in answer:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            response = answer["response"]
            assert response.status_code == 503 and response.headers["retry-after"] == "1", response.text
            error = response.json()["error"]
            assert error["type"] == "shutting_down" and "cut off" in error["message"]
        text = log.read_text()
        assert "Traceback" not in text and "terminate called" not in text, text
        why = "a second stop signal came" if len(signals) == 2 else "the drain timeout (1 s, --drain-timeout-s) passed"
        assert f"stopped before every request finished: {why}; 3 request(s) still running were answered 503" \
            in text.splitlines()[-1]
    finally:
        server.stop()


def _wait_port_closed(server: Server) -> None:
    """Until the port refuses connections: the server has begun its drain (uvicorn closes its listening socket
    first)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{server.url}/health", timeout=5)
        except httpx.TransportError:
            return
        assert time.monotonic() < deadline and server.proc.poll() is None
        time.sleep(0.02)


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: /proc's SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_stop_signal_before_the_server_runs_exits_0(tmp_path):
    """A SIGTERM in the first second or two (imports, checks: before the port answers) is held, not fatal
    (143): the server never starts and the process exits 0 saying so."""
    from petal.engine.loader import default_model_dir

    log = tmp_path / "log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0", "--model",
                                 str(default_model_dir())], stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while not _catches(proc.pid, signal.SIGTERM):  # the CLI's first line took the signal over
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        text = log.read_text()
        assert "Traceback" not in text
        # NOTE: the imports and checks between taking the signal over and binding take a second or more
        assert "petal serve: stopped (SIGTERM before the server started)" in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(log: Path, *args: object, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """``petal serve`` in a child, returned as soon as its port answers (before the model is loaded)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("PETAL_API_KEY", None)
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0", "--log-level",
                                 "warning", *map(str, args)], stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    deadline = time.monotonic() + STARTUP_S
    while not (found := re.search(r"(http://[\d.]+:\d+)/health answers now", log.read_text(errors="replace"))):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.05)
    return proc, found.group(1)


def test_the_port_answers_while_loading_then_serves_and_sighup_drains(served, tmp_path):
    """While the model and index load, /health is 200 and /ready and the API 503 (Retry-After): a liveness
    probe never kills a loading server, a readiness probe holds traffic back. SIGHUP drains like SIGTERM,
    and does not wait for a reload in progress (the sha256 of a large version can take minutes)."""
    _, out, _ = served
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("store", ".lock"))
    log, trace = tmp_path / "log", tmp_path / "trace"
    proc, url = _start(log, copy, "--api-key", KEY, "--reload-interval-s", "0.1", "--drain-timeout-s", "5",
                       env={"PETAL_FAULT": "query_open:1:sleep=5,query_open:2:sleep=300",
                            "PETAL_FAULT_TRACE": str(trace)})
    try:
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.get("/health").json() == {"status": "ok"}
            ready = c.get("/ready")
            assert ready.status_code == 503 and ready.json() == {"status": "loading"}
            embed = c.post("/v1/embeddings", json={"input": "x"}, headers=AUTH)
            assert embed.status_code == 503 and embed.headers["retry-after"] == "1"
            assert "not ready: loading" in embed.json()["error"]["message"]
            assert c.post("/search", json={"query": "x"}).status_code == 401  # the key first, loaded or not
            assert 'petal_requests_total{route="/ready",status="503"} 1.0' in c.get("/metrics").text
            deadline = time.monotonic() + STARTUP_S
            while c.get("/ready").status_code != 200:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            assert "listening on" in log.read_text()
            assert c.post("/search", json={"query": "glaciers", "k": 1}, headers=AUTH).status_code == 200
            _publish_copy(copy, lambda manifest: None)
            while trace.read_text().count("query_open") < 2:  # the new version is being opened (for 300 s)
                assert time.monotonic() < deadline
                time.sleep(0.05)
        stopping = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(60) == 0 and time.monotonic() - stopping < 20
        assert "stopped (in-flight requests drained)" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_load_that_fails_exits_with_its_code(served, tmp_path):
    """The port opens before loading, so a version that cannot be opened ends the server with the exit code
    of the contract (65: corrupt), its message and no traceback; a typo in OUT fails before any port."""
    _, out, _ = served
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("store", ".lock"))
    version = copy / "versions" / (copy / "CURRENT").read_text().strip()
    index_file = version / "index.faiss"
    index_file.write_bytes(index_file.read_bytes()[:-1])
    proc, _ = _start(tmp_path / "log", copy)
    assert proc.wait(60) == 65
    err = (tmp_path / "log").read_text()
    assert "petal: error:" in err and "index.faiss" in err and "Traceback" not in err
    typo = CliRunner().invoke(cli, ["serve", str(tmp_path / "nowhere"), "--port", "0"])
    assert typo.exit_code == 78 and "not a petal index" in typo.output


def test_api_key_from_a_file_or_an_empty_env_var():
    """A key read with its newline still matches (the header cannot carry one); PETAL_API_KEY set but empty
    is refused (exit 2), never an open server."""
    from petal.pipeline.serve.settings import ServeSettings

    assert ServeSettings(api_key="  s3cret\n").api_key == "s3cret"
    with pytest.raises(ValueError, match="control character"):
        ServeSettings(api_key="s3c\x00ret")
    for value in ("", "\n"):
        result = CliRunner().invoke(cli, ["serve", "--model", "m", "--port", "0"], env={"PETAL_API_KEY": value})
        assert result.exit_code == 2 and "is empty" in result.output, result.output


@pytest.mark.parametrize("missing", [("starlette", "uvicorn", "prometheus_client"), ("httptools",)])
def test_without_the_serve_extra_a_clear_message(tmp_path, missing):
    """Any module of the extra the server imports missing: 78 naming it (httptools alone was a ModuleNotFoundError
    traceback, exit 1, from the server's HTTP protocol)."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {missing!r}:\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from petal.cli.main import main\n"
        f"sys.argv = ['petal', 'serve', '--model', {_packaged_model_dir()!r}, '--port', '0']\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=120)
    assert result.returncode == 78, result.stderr
    assert "pip install 'petal[serve]'" in result.stderr and "Traceback" not in result.stderr
    assert all(name in result.stderr for name in missing), result.stderr


def test_texts_tokenized_together_on_the_engine_thread(minilm_spec):
    """Requests queued together are tokenized in one batch per prompt side on the engine thread: each gets
    the vectors and token count of embedding it alone, and a text over the limit refuses its own request
    only (413 naming its item; a truncating request with the same text is answered)."""
    import asyncio

    from petal.pipeline.jobs.query import QueryModel, engine_config
    from petal.pipeline.serve.batcher import TokenBatcher
    from petal.pipeline.serve.metrics import ServeMetrics
    from petal.pipeline.serve.requests import RequestError

    model = QueryModel(minilm_spec, engine_config(minilm_spec, "cpu"), max_tokens=24)
    batcher = TokenBatcher(model.engine, ServeMetrics(), tokenizers=dict(model.tokenizers))
    long = "word " * 60
    # the last: a text the tokenizer refuses (a lone surrogate, which the routes replace before it gets here)
    requests = [(("how do glaciers move",), "query", False), (("espresso", "sourdough bread"), "document", False),
                (("fine", long, "also " * 40), "query", False), ((long,), "document", True),
                (("the history of rome",), "query", False), (("ok", "\ud800 not text"), "query", False)]

    async def scenario():
        tasks = [asyncio.ensure_future(batcher.embed_texts(texts, side, truncate, "input"))
                 for texts, side, truncate in requests]
        await asyncio.sleep(0)  # every request queued
        batcher.start()  # all queued first: one take, one tokenizer call per side
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        answers = asyncio.run(scenario())
    finally:
        batcher.close()
    refused = answers[2]
    assert isinstance(refused, RequestError) and refused.status == 413
    assert "input item 1 has more than 24 tokens" in refused.message
    assert isinstance(answers[-1], TypeError)  # that request alone fails; its batch is answered
    for (texts, side, _), got in zip(requests, answers):
        if got is refused or got is answers[-1]:
            continue
        encoded = model.tokenize(list(texts), side)
        assert got.tokens == sum(len(ids) for ids in encoded.token_ids)
        np.testing.assert_allclose(got.rows, model.embed(list(texts), side), atol=1e-5)
    assert batcher.outstanding == 0


def test_overload_answers_503_not_unbounded_memory(minilm_spec):
    """The queue is bounded in texts: past it, embed() raises Overloaded (503 + Retry-After)."""
    import asyncio

    from petal.pipeline.jobs.query import QueryModel, engine_config
    from petal.pipeline.serve.batcher import Overloaded, TokenBatcher
    from petal.pipeline.serve.metrics import ServeMetrics

    model = QueryModel(minilm_spec, engine_config(minilm_spec, "cpu"))
    batcher = TokenBatcher(model.engine, ServeMetrics(), max_queue_texts=6)
    ids = model.tokenize(["one", "two", "three", "four"]).token_ids

    async def scenario() -> np.ndarray:
        first = asyncio.ensure_future(batcher.embed(ids))  # queued; the engine thread is not started yet
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="--max-queue-texts"):
            await batcher.embed(ids)
        batcher.start()
        return await first

    vectors = asyncio.run(scenario())
    np.testing.assert_allclose(vectors, model.embed(["one", "two", "three", "four"]), atol=1e-5)
    batcher.close()


def test_follower_swaps_and_frees_the_old_version(served, tmp_path, minilm_spec):
    """In process: a compatible new version is swapped in and the old one freed after its last user."""
    import gc
    import weakref

    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.follower import IndexFollower
    from petal.pipeline.serve.metrics import ServeMetrics

    _, out, _ = served
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("store", ".lock"))
    follower = IndexFollower(copy, minilm_spec, SearchIndex.open(copy, minilm_spec), ServeMetrics())
    old = weakref.ref(follower.live)
    in_flight = follower.live  # a search still running on the old version
    assert follower.check_once() is False  # nothing new
    live, new = _publish_copy(copy, lambda manifest: None)
    assert follower.check_once() is True and follower.live.version == new and in_flight.version == live
    gc.collect()
    assert old() is not None  # the in-flight search keeps it
    del in_flight
    gc.collect()
    assert old() is None  # its memory returns
    assert follower.status() == {"version": new, "vectors": follower.live.reader.ntotal}


def test_a_version_that_fails_to_open_is_tried_again_until_it_opens(served, tmp_path, minilm_spec, monkeypatch):
    """A new version whose open fails is refused and tried again while CURRENT names it, with a doubling wait,
    then served: an I/O error (injected EIO, twice), a version directory that is not there yet or arrives
    without its index file (a copy by hand: CURRENT sorts before versions/), a short index.faiss (a copy in
    progress). CURRENT written again with the same name is tried at once; an empty CURRENT is said."""
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.follower import IndexFollower
    from petal.pipeline.serve.metrics import ServeMetrics

    _, out, _ = served
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("store", ".lock"))
    follower = IndexFollower(copy, minilm_spec, SearchIndex.open(copy, minilm_spec), ServeMetrics(),
                             retry_first_s=0.2)
    live, new = _publish_copy(copy, lambda manifest: None)
    monkeypatch.setenv("PETAL_FAULT", "query_open:1:eio,query_open:2:eio")
    tried = time.monotonic()
    assert follower.check_once() is False and follower.live.version == live
    refused = follower.status()["refused"]
    assert (refused["version"], refused["reason"], refused["retry_in_s"]) == (new, "open", 0.2), refused
    assert "Input/output error" in refused["message"]
    due = follower.due()
    # NOTE: "not yet" holds only within the 0.2 s wait; a loaded machine may have taken longer to get here
    if time.monotonic() - tried < 0.2:
        assert not due and follower.check_once() is False  # not yet: no second open
    time.sleep(0.25)
    assert follower.due() and follower.check_once() is False  # the second open fails too
    assert follower.status()["refused"]["retry_in_s"] == 0.4  # the wait doubles
    time.sleep(0.45)
    assert follower.check_once() is True and follower.live.version == new
    assert "refused" not in follower.status() and not follower.due()
    monkeypatch.delenv("PETAL_FAULT")

    def retried_until(predicate, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, follower.status()
            if follower.due():
                follower.check_once()
            time.sleep(0.02)

    # a short index.faiss (a copy still arriving): refused, tried again, served once whole
    _, newer = _publish_copy(copy, lambda manifest: None)
    index_file = copy / "versions" / newer / "index.faiss"
    whole = index_file.read_bytes()
    index_file.write_bytes(whole[:-1])
    assert follower.check_once() is False and follower.live.version == new
    refused = follower.status()["refused"]
    assert refused["version"] == newer and refused["retry_in_s"] == 0.2 and "index.faiss" in refused["message"]
    time.sleep(0.25)
    assert follower.due() and follower.check_once() is False and follower.status()["refused"]["retry_in_s"] == 0.4
    index_file.write_bytes(whole)
    retried_until(lambda: follower.live.version == newer)
    assert "refused" not in follower.status()

    # CURRENT names a version that is not in versions/ yet, then arrives without its index file, then whole
    staged = tmp_path / "staged"
    _, newest = _publish_copy(copy, lambda manifest: None)
    shutil.move(copy / "versions" / newest, staged)
    follower.retry_first_s = 30.0  # so that only a change (or CURRENT written again) brings the next try
    assert follower.check_once() is False
    refused = follower.status()["refused"]
    assert refused["version"] == newest and "not in" in refused["message"] and refused["retry_in_s"] == 30.0
    shutil.copytree(staged, copy / "versions" / newest, ignore=shutil.ignore_patterns("index.faiss"))
    assert not follower.due()
    time.sleep(0.01)
    (copy / "CURRENT").write_text(newest + "\n")  # the same name written again: a new try at once
    assert follower.due() and follower.check_once() is False
    assert "index.faiss" in follower.status()["refused"]["message"]
    shutil.copy(staged / "index.faiss", copy / "versions" / newest / "index.faiss")
    time.sleep(0.01)
    (copy / "CURRENT").write_text(newest + "\n")
    assert follower.due() and follower.check_once() is True and follower.live.version == newest

    # an empty CURRENT: said in /ready's refusal (the live version keeps serving); a good name clears it
    (copy / "CURRENT").write_text("")
    assert follower.due() and follower.check_once() is False and follower.live.version == newest
    assert follower.status()["refused"]["reason"] == "current"
    (copy / "CURRENT").write_text(newest + "\n")
    assert follower.due() and follower.check_once() is False and "refused" not in follower.status()


@pytest.mark.parametrize("fixed", [False, True], ids=["recorded", "given"])
def test_a_version_recording_another_query_prompt(served, tmp_path, minilm_spec, fixed):
    """Without --query-prompt the server embeds queries with the prompt its first version recorded, so a
    version recording another one is refused, naming the prompt the server really uses; with --query-prompt
    the server's prompt is the operator's, whatever a version records (as for the first version)."""
    from dataclasses import replace

    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.follower import IndexFollower
    from petal.pipeline.serve.metrics import ServeMetrics

    _, out, _ = served
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("store", ".lock"))
    spec = replace(minilm_spec, prompts=replace(minilm_spec.prompts, query="Q: ")) if fixed else minilm_spec
    follower = IndexFollower(copy, spec, SearchIndex.open(copy, spec), ServeMetrics(), query_prompt_fixed=fixed)

    def prompt(text: str):
        def edit(manifest: dict) -> None:
            manifest["model"]["prompts"]["query"] = text
        return edit

    _, q_version = _publish_copy(copy, prompt("Q: "))  # what the server uses when it was given "Q: "
    if fixed:
        assert follower.check_once() is True and follower.live.version == q_version
    else:
        assert follower.check_once() is False
        refused = follower.status()["refused"]
        assert refused["reason"] == "prompt" and "'Q: '" in refused["message"], refused
        assert f"the server embeds queries with {minilm_spec.prompts.query!r}" in refused["message"]
    _, other = _publish_copy(copy, prompt("search: "))
    assert follower.check_once() is fixed and (follower.live.version == other) is fixed


def test_the_listening_socket_is_tcp_so_responses_are_not_held_by_nagle():
    """asyncio turns TCP_NODELAY on only for sockets whose protocol says TCP (a proto-0 socket cost
    every keep-alive request 40 ms of Nagle + delayed ACK); a taken port is a clean exit 78."""
    import socket

    from petal.pipeline.reliability.errors import ConfigError
    from petal.pipeline.serve.server import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.getsockname()[1] > 0
        with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1"):
            bind("127.0.0.1", sock.getsockname()[1])
    finally:
        sock.close()


def test_a_full_queue_answers_503_with_retry_after_over_http(tmp_path):
    """Real concurrent clients against a queue of one request's texts: the ones that do not fit get 503 with
    Retry-After (and a message naming the flag), the ones that do get their own correct vectors, and the
    server keeps serving."""
    server = Server(tmp_path / "server.log", "--max-texts", "16", "--max-queue-texts", "16", "--model",
                    _packaged_model_dir())
    try:
        texts = [f"request {n}: " + " ".join(QUERIES * 3) for n in range(16)]
        alone = server.client.post("/v1/embeddings", json={"input": texts[:1]}).json()["data"][0]["embedding"]
        barrier = threading.Barrier(24)

        def client(worker: int) -> list[tuple[int, str | None]]:
            seen = []
            with httpx.Client(base_url=server.url, timeout=120.0) as c:
                barrier.wait()
                for _ in range(3):
                    response = c.post("/v1/embeddings", json={"input": texts})
                    if response.status_code == 200:
                        data = response.json()["data"]
                        assert len(data) == 16
                        np.testing.assert_allclose(data[0]["embedding"], alone, atol=1e-5)
                    else:
                        assert response.status_code == 503, response.text
                        assert "--max-queue-texts" in response.json()["error"]["message"]
                    seen.append((response.status_code, response.headers.get("retry-after")))
            return seen

        with ThreadPoolExecutor(24) as pool:
            answers = [a for part in pool.map(client, range(24)) for a in part]
        assert (503, "1") in answers and any(status == 200 for status, _ in answers)
        assert all(retry == "1" for status, retry in answers if status == 503)
        assert server.client.post("/v1/embeddings", json={"input": texts}).status_code == 200
        metrics = server.client.get("/metrics").text
        overloaded = re.search(r"^petal_overloaded_total ([\d.e+]+)", metrics, re.M)
        assert overloaded and float(overloaded.group(1)) == sum(status == 503 for status, _ in answers)
    finally:
        server.stop()


def _packaged_model_dir() -> str:
    from petal.engine.loader import default_model_dir

    return str(default_model_dir())


def test_gc_pauses_are_timed_per_generation():
    """``/metrics``' garbage-collection series: a full collection adds (at least) one to generation 2's count,
    its time to the total, and the longest pause is one of them."""
    import gc

    from petal.pipeline.serve import gc_clock
    from petal.pipeline.serve.metrics import ServeMetrics

    def series(metrics: ServeMetrics) -> dict[str, float]:
        return {f"{m.group(1)}{m.group(2)}": float(m.group(3)) for m in re.finditer(
            r'^petal_gc_(collections_total|seconds_total|longest_pause_seconds)\{generation="(\d)"\} (\S+)$',
            metrics.render().decode(), re.M)}

    first, second = ServeMetrics(), ServeMetrics()  # two servers in one process: one hook, the same numbers
    assert gc.callbacks.count(gc.callbacks[-1]) == 1
    before = series(first)
    assert len(before) == 9, before
    junk = [[i] for i in range(50_000)]  # something for the collection to walk
    gc.collect()
    del junk
    after = series(first)
    assert after["collections_total2"] >= before["collections_total2"] + 1  # (the list may have made more)
    assert after["seconds_total2"] > before["seconds_total2"]
    assert 0 < after["longest_pause_seconds2"] <= after["seconds_total2"]
    gc_clock.restart_longest()  # (a server that becomes ready): the longest pauses start again, totals go on
    restarted = series(first)
    assert all(restarted[f"longest_pause_seconds{g}"] == 0 for g in "012")
    assert {k: v for k, v in restarted.items() if not k.startswith("longest")} == \
        {k: v for k, v in after.items() if not k.startswith("longest")}
    assert series(second) == series(first)
