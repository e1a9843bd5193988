"""``petal serve OUT`` following re-indexing, as a user sees it: a real ``petal serve`` child on a loopback port over
a copy of the session's sample index (tests/_serve_shared.py), real ``petal rebuild`` runs publishing new versions,
real HTTP (httpx).

- The version a server moved on from is let go (its memory and its lease) once its last request finished, not at
  the next request: the engine and search threads kept the last batch's requests, and so their version, referenced
  while they waited, so an idle server kept the old version loaded and leased (a ``petal index --keep-versions 1``
  run kept it on disk) until some client searched again.
- The server's own log lines (``petal serve: now serving V2 (N vectors), was V1``) are printed at ``--log-level
  info``, the default: only uvicorn's loggers were configured, so Python's last-resort handler dropped every info
  line and printed the warnings whatever ``--log-level`` said.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests._serve_shared import sample_out
from tests.test_serve_leases import current, leased, wait_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def rebuild(out, *args: str) -> str:
    """``petal rebuild OUT ARGS`` (a new version of the same vectors): the version it published."""
    run = subprocess.run([sys.executable, "-m", "petal.cli.main", "rebuild", str(out), *args], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return current(out)


@pytest.fixture
def served(tmp_path_factory, tmp_path):
    from tests.test_serve import Server

    out = tmp_path / "out"
    shutil.copytree(sample_out(tmp_path_factory), out, ignore=shutil.ignore_patterns(".lock"))
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1", "--log-level", "info")
    yield server, out
    server.stop()


@pytest.mark.parametrize("body", [{"query": "how do glaciers move", "k": 3},
                                  {"queries": ["volcano eruption"], "k": 2, "include": ["text"]}],
                         ids=["query", "queries-include"])
def test_the_old_version_is_released_after_its_last_request_without_another_request(served, body):
    server, out = served
    v1 = current(out)
    answer = server.client.post("/search", json=body)
    assert answer.status_code == 200 and answer.json()["version"] == v1, answer.text
    v2 = rebuild(out, "--index-factory", "Flat")
    wait_for(lambda: server.client.get("/ready").json()["version"] == v2, "the swap to the rebuilt version")
    # NOTE: no request after the swap: before, the lease (and the version's memory) stayed until the next one
    wait_for(lambda: not leased(out / "versions" / v1), f"the lease on {v1} to be released", timeout_s=30)
    assert leased(out / "versions" / v2)
    answer = server.client.post("/search", json=body)
    assert answer.status_code == 200 and answer.json()["version"] == v2, answer.text


def test_the_swap_is_said_in_the_log_at_log_level_info(served):
    server, out = served
    v1 = current(out)
    v2 = rebuild(out, "--index-factory", "Flat")
    wait_for(lambda: server.client.get("/ready").json()["version"] == v2, "the swap to the rebuilt version")
    line = f"petal serve: now serving {v2} (342 vectors), was {v1}"
    wait_for(lambda: line in server.log.read_text(errors="replace"), "the swap's log line", timeout_s=30)
    v3 = rebuild(out, "--metric", "l2")  # refused (another metric): a warning, said once
    wait_for(lambda: server.client.get("/ready").json().get("refused", {}).get("version") == v3, "the refusal")
    refused = f"petal serve: refused {v3}, still serving {v2}: {v3} is searched by metric l2"
    wait_for(lambda: refused in server.log.read_text(errors="replace"), "the refusal's log line", timeout_s=30)
    assert server.log.read_text(errors="replace").count(f"petal serve: refused {v3}") == 1


def test_a_version_published_while_the_server_loads_is_followed(tmp_path_factory, tmp_path):
    """CURRENT moved on after the server read it and before it served (the model's load and warm-up: minutes on
    CUDA; widened here by a sleep where the load opens the version): it served the version it had read and took
    the new CURRENT for one it had acted on, so a re-index that finished during a start-up was never followed."""
    out = tmp_path / "out"
    shutil.copytree(sample_out(tmp_path_factory), out, ignore=shutil.ignore_patterns(".lock"))
    v1 = current(out)
    v2 = rebuild(out, "--index-factory", "Flat")
    (out / "CURRENT").write_text(v1 + "\n")  # the server starts on v1
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PETAL_FAULT": "query_open:1:sleep=3"}
    env.pop("PETAL_API_KEY", None)
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0",
                                 "--reload-interval-s", "0.1"], stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        wait_for(lambda: "petal serve: loading" in log.read_text(errors="replace") or proc.poll() is not None,
                 "the server to start loading")
        (out / "CURRENT").write_text(v2 + "\n")  # published while the server loads v1 (it sleeps before opening it)
        found = wait_for(lambda: re.search(r"listening on (http://[\d.]+:\d+)", log.read_text(errors="replace"))
                         or proc.poll() is not None, "the server to serve", timeout_s=120)
        assert proc.poll() is None, log.read_text(errors="replace")
        assert f"{v1} (342 vectors), listening" in log.read_text(errors="replace")  # the version it had read
        with httpx.Client(base_url=found.group(1), timeout=60.0) as client:
            wait_for(lambda: client.get("/ready").json()["version"] == v2, f"the server to follow CURRENT to {v2}",
                     timeout_s=30)
            answer = client.post("/search", json={"query": "how do glaciers move", "k": 2})
            assert answer.status_code == 200 and answer.json()["version"] == v2, answer.text
        wait_for(lambda: not leased(out / "versions" / v1), f"the lease on {v1} to be released", timeout_s=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text(errors="replace")


def test_a_version_that_does_not_fit_in_memory_is_refused_and_tried_again(tmp_path_factory, tmp_path):
    """A new version is loaded beside the live one: a MemoryError opening it (seen with a real RLIMIT_AS on the
    server; injected here, PETAL_FAULT nomem where the follower opens it) was a traceback in the log, nothing in
    /ready or the metrics, and the version was never tried again. Now: refused ('open', out of memory), the live
    version serves, tried again after 1 s (and taken)."""
    out = tmp_path / "out"
    shutil.copytree(sample_out(tmp_path_factory), out, ignore=shutil.ignore_patterns(".lock"))
    v1 = current(out)
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PETAL_FAULT": "query_open:2:nomem"}  # 1: the load's own open
    env.pop("PETAL_API_KEY", None)
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0",
                                 "--reload-interval-s", "0.1"], stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        found = wait_for(lambda: re.search(r"listening on (http://[\d.]+:\d+)", log.read_text(errors="replace"))
                         or proc.poll() is not None, "the server to serve", timeout_s=120)
        assert proc.poll() is None, log.read_text(errors="replace")
        with httpx.Client(base_url=found.group(1), timeout=60.0) as client:
            v2 = rebuild(out, "--index-factory", "Flat")
            refused = wait_for(lambda: client.get("/ready").json().get("refused") or client.get("/ready").json()
                               ["version"] == v2, "the refusal", timeout_s=30)
            assert refused is not True, "taken at once: the fault did not fire"
            assert refused["version"] == v2 and refused["reason"] == "open", refused
            assert "out of memory" in refused["message"] and refused["retry_in_s"] == 1, refused
            metrics = client.get("/metrics").text
            assert f'petal_index_refused{{reason="open",version="{v2}"}} 1.0' in metrics
            answer = client.post("/search", json={"query": "how do glaciers move", "k": 2})
            assert answer.status_code == 200 and answer.json()["version"] == v1, answer.text
            wait_for(lambda: client.get("/ready").json()["version"] == v2, "the retry to take it", timeout_s=30)
            assert "refused" not in client.get("/ready").json()
        assert "Traceback" not in log.read_text(errors="replace")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text(errors="replace")


FAILING = [({"vectors": [[0.05] * 384], "k": 3, "where": "no_such_column = 1"}, 422),  # fails on the search thread
           ({"query": "glacier " * 600, "k": 3}, 413)]  # over the model's 256 tokens: fails on the engine thread


def test_the_old_version_is_released_after_a_request_that_failed_on_it(served):
    """A request that failed on the version swapped out since (a 'where' naming no column, a text over the token
    limit): the error's traceback kept the frames that searched, and they the request and its version, in a reference
    cycle that only a full garbage collection frees: an idle server kept the old version loaded and leased (a
    ``petal index --keep-versions 1`` run kept it on disk) indefinitely."""
    server, out = served
    for body, status in FAILING:
        v1 = current(out)
        answer = server.client.post("/search", json=body)
        assert answer.status_code == status, answer.text
        v2 = rebuild(out, "--index-factory", "Flat")
        wait_for(lambda v2=v2: server.client.get("/ready").json()["version"] == v2, "the swap to the rebuilt version")
        wait_for(lambda v1=v1: not leased(out / "versions" / v1), f"the lease on {v1} to be released after a {status}",
                 timeout_s=30)


def test_a_new_version_whose_ids_are_damaged_past_the_open_checks_is_refused_as_open(served, tmp_path):
    """A published version whose ``ids.parquet`` is damaged inside its body (its head/tail checksums signed over the
    damage: what a change past the first and last MiB of a large file looks like to an open) is found when the
    server decodes its id map before serving it. README: a file "short or corrupt" is refused as ``open``; it was
    ``prepare``, the reason of a GPU copy that cannot be made, which alerts keyed on ``open`` missed."""
    from tests._open_audit_shared import resign

    server, out = served
    v1 = current(out)
    staged = tmp_path / "staged"
    shutil.copytree(out, staged, ignore=shutil.ignore_patterns(".lock", "*.lease*"))
    v2 = rebuild(staged, "--index-factory", "Flat")
    ids = staged / "versions" / v2 / "ids.parquet"
    import pyarrow.parquet as pq

    chunk = pq.ParquetFile(ids).metadata.row_group(0)
    chunk = next(chunk.column(i) for i in range(chunk.num_columns) if chunk.column(i).path_in_schema == "id")
    end = (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size
    middle = (chunk.data_page_offset + end) // 2  # inside the id column's first data page
    data = bytearray(ids.read_bytes())
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    ids.write_bytes(bytes(data))
    resign(staged / "versions" / v2, sha256=False)
    shutil.copytree(staged / "versions" / v2, out / "versions" / v2)
    (out / "CURRENT.tmp").write_text(v2 + "\n")
    os.replace(out / "CURRENT.tmp", out / "CURRENT")
    refused = wait_for(lambda: server.client.get("/ready").json().get("refused"), "the refusal")
    assert (refused["version"], refused["reason"]) == (v2, "open"), refused
    assert "ids.parquet" in refused["message"], refused
    metrics = server.client.get("/metrics").text
    assert re.search(rf'^petal_index_refused\{{reason="open",version="{v2}"\}} 1\.0$', metrics, re.M), metrics
    answer = server.client.post("/search", json={"query": "glaciers", "k": 2})
    assert answer.status_code == 200 and answer.json()["version"] == v1, answer.text
