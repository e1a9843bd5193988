"""Following re-indexing (``pipeline/serve/follower.py``): what a server does with a new CURRENT it cannot serve.

- A text index's new version searched by another metric (``petal rebuild --metric l2``) was swapped in: scores
  changed meaning under the clients (an index of precomputed vectors refused it). Now refused with reason
  ``metric``, as a dim change is: the old version keeps serving; ``/ready``, ``petal_index_refused`` and the log say
  why.
- A CURRENT that holds no version id (garbage, or bytes that are no id) was retried forever with backoff, one log
  line each time. Now it is refused once with reason ``current`` (no ``retry_in_s``), the server keeps serving the
  version it has, and the next write of CURRENT is seen at the next check (``--reload-interval-s``).
- A server that starts on such an OUT exits 78 (a damaged output directory, README "Running unattended") naming
  CURRENT, before its port opens: it never waits for a version.

Real components: ``petal index`` (the packaged model, and ``--vectors-column``), ``petal rebuild``, ``petal serve`` in
child processes on loopback ports, httpx."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests._serve_shared import copy_sample_out
from tests.test_serve import Server, cli_run
from tests.test_serve_vectors_only import _wait_ready, make_data

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def _point(out: Path, text: str) -> None:
    tmp = out / ".CURRENT.tmp-test"
    tmp.write_text(text)
    os.replace(tmp, out / "CURRENT")


def _refusals(server: Server) -> float:
    """``petal_index_reloads_total{result="refused"}`` (0 before the first)."""
    found = re.search(r'^petal_index_reloads_total\{result="refused"\} (\S+)$', server.client.get("/metrics").text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_text_index_refuses_a_version_of_another_metric(tmp_path_factory, tmp_path):
    # a text index (the packaged model, Flat): a copy of sample_data's, the session's (tests/_serve_shared.py)
    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    live = (out / "CURRENT").read_text().strip()
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        before = server.client.post("/search", json={"query": "document about topic 1", "k": 3}).json()
        cli_run("rebuild", out, "--metric", "l2", "--index-factory", "Flat")
        new = (out / "CURRENT").read_text().strip()
        assert new != live
        ready = _wait_ready(server, lambda r: r.get("refused", {}).get("version") == new, "the refusal")
        assert ready["version"] == live and ready["refused"]["reason"] == "metric", ready
        message = ready["refused"]["message"]
        assert "metric l2" in message and "ip" in message and live in message, message
        assert "retry_in_s" not in ready["refused"]  # waits for CURRENT to change, as a model change does
        metrics = server.client.get("/metrics").text
        assert f'petal_index_refused{{reason="metric",version="{new}"}} 1.0' in metrics
        assert f'petal_index_version{{version="{live}"}} 1.0' in metrics
        log = (tmp_path / "server.log").read_text()
        assert f"refused {new}, still serving {live}" in log and "metric l2" in log
        after = server.client.post("/search", json={"query": "document about topic 1", "k": 3})
        assert after.status_code == 200 and after.json() == before  # the same version, the same scores
        _point(out, live + "\n")  # a rollback: the refusal clears
        _wait_ready(server, lambda r: "refused" not in r and r["version"] == live, "the refusal cleared")
    finally:
        server.stop()
    assert server.proc.returncode == 0


def _vectors_index(root: Path) -> tuple[Path, Path, np.ndarray]:
    data, vectors = make_data(root)
    out = root / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "Flat")
    return data, out, vectors


@pytest.fixture()
def vectors_out(tmp_path):
    """An index of vectors of the test's own (it indexes DATA again)."""
    return _vectors_index(tmp_path)


@pytest.fixture(scope="module")
def vectors_template(tmp_path_factory):
    return _vectors_index(tmp_path_factory.mktemp("vectors"))


@pytest.fixture()
def vectors_copy(tmp_path, vectors_template):
    """A copy of the module's index of vectors, OUT only (for a test that changes OUT, never indexes DATA)."""
    data, out, vectors = vectors_template
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    return data, copy, vectors


def test_a_current_that_names_no_version_is_said_once_and_the_server_keeps_serving(tmp_path, vectors_out):
    data, out, vectors = vectors_out
    live = (out / "CURRENT").read_text().strip()
    log = tmp_path / "server.log"
    server = Server(log, out, "--reload-interval-s", "0.1")
    try:
        for written, shown in (("garbage\n", '"garbage"'), ("\x1b[2Jv1\n", '"\\x1b[2Jv1"')):
            refused = _refusals(server)
            _point(out, written)
            ready = _wait_ready(server, lambda r, shown=shown: r.get("refused", {}).get("version") == shown,
                                "the refusal")
            assert ready["version"] == live and ready["refused"]["reason"] == "current", ready
            assert "retry_in_s" not in ready["refused"], ready  # not tried again: the same bytes fail the same way
            message = ready["refused"]["message"]
            assert "not a petal version id" in message and f"echo {live} >" in message, message
            # several follow intervals (0.1 s) later, past the first retry of a transient refusal (1 s): still one
            # refusal, one log line, and the live version answering
            time.sleep(1.5)
            assert _refusals(server) == refused + 1
            assert server.client.get("/ready").json()["refused"] == ready["refused"]
            metrics = server.client.get("/metrics").text
            label = shown.replace("\\", "\\\\").replace('"', '\\"')  # the exposition format's escapes
            assert f'petal_index_refused{{reason="current",version="{label}"}} 1.0' in metrics, metrics
            lines = [line for line in log.read_text().splitlines() if "refused" in line and shown in line]
            assert len(lines) == 1 and "trying again" not in lines[0], lines
            found = server.client.post("/search", json={"vectors": vectors[:2].tolist(), "k": 1})
            assert found.status_code == 200 and found.json()["version"] == live
            assert [r["hits"][0]["id"] for r in found.json()["results"]] == [0, 1]
            _point(out, live + "\n")  # repaired: seen at the next check, the refusal clears
            _wait_ready(server, lambda r: "refused" not in r, "the refusal cleared")
        # an empty CURRENT (a pointer truncated by hand): the same rule
        refused = _refusals(server)
        _point(out, "")
        ready = _wait_ready(server, lambda r: r.get("refused", {}).get("reason") == "current", "the empty one")
        assert "retry_in_s" not in ready["refused"] and ready["version"] == live
        time.sleep(1.5)
        assert _refusals(server) == refused + 1
        # the README's repair of a pointer that names no version: remove it, petal index --full; served at once
        (out / "CURRENT").unlink()
        cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "Flat", "--full")
        new = (out / "CURRENT").read_text().strip()
        ready = _wait_ready(server, lambda r: r["version"] == new, "the new version")
        assert "refused" not in ready
    finally:
        server.stop()
    assert server.proc.returncode == 0


@pytest.mark.parametrize("case", ["garbage", "empty", "missing version", "fifo"])
def test_a_server_starting_on_a_current_that_names_no_version_exits_78(tmp_path, vectors_copy, case):
    """No version to serve at start: exit 78 naming CURRENT, before the port opens (never a wait)."""
    _, out, _ = vectors_copy
    live = (out / "CURRENT").read_text().strip()
    (out / "CURRENT").unlink()
    if case == "fifo":
        os.mkfifo(out / "CURRENT")
    else:
        (out / "CURRENT").write_text({"garbage": "garbage\n", "empty": "",
                                      "missing version": "v000009-20200101T000000Z\n"}[case])
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 78, done.stderr
    assert time.monotonic() - started < 30
    assert "answers now" not in done.stderr and "listening" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("petal: error: ") and f"{out / 'CURRENT'}" in last, last
    if case != "fifo":
        assert f"echo {live} >" in last, last  # the version to point it back at


def test_a_version_its_manifest_refuses_is_never_loaded(tmp_path, vectors_copy, monkeypatch):
    """A new version is loaded beside the live one; one of another metric (or model, or output transform) was loaded
    whole (its index.faiss read, an unsealed one hashed) before its manifest refused it. So a large one that does not
    fit beside the live version (a MemoryError opening it: injected with PETAL_FAULT nomem at every open after the
    start's) was refused 'open ... out of memory' and loaded again every 1, 2 ... 60 s, never saying the metric. Its
    manifest is read first now: refused 'metric' at once, never opened (PETAL_FAULT_TRACE: the start's open only),
    not tried again. And CURRENT set back to the live version was loaded again beside itself to learn that (here:
    'cannot open V1: out of memory (it is loaded beside the live version, V1 ...)'); now the refusal just clears."""
    _, out, vectors = vectors_copy
    live = (out / "CURRENT").read_text().strip()
    trace = tmp_path / "trace"
    with monkeypatch.context() as env:
        env.setenv("PETAL_FAULT", "query_open:2+:nomem")
        env.setenv("PETAL_FAULT_TRACE", str(trace))
        server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.05")
    try:
        opened = trace.read_text().split().count("query_open")
        cli_run("rebuild", out, "--metric", "l2", "--index-factory", "Flat")
        new = (out / "CURRENT").read_text().strip()
        seen = []  # each refusal /ready said, in turn
        deadline = time.monotonic() + 10
        while not seen or seen[-1]["reason"] != "metric":
            refused = server.client.get("/ready").json().get("refused")
            if refused is not None and (not seen or seen[-1]["reason"] != refused["reason"]):
                seen.append(refused)
            assert time.monotonic() < deadline, seen
            time.sleep(0.02)
        assert [(r["version"], r["reason"]) for r in seen] == [(new, "metric")], seen
        assert "retry_in_s" not in seen[0] and "out of memory" not in (tmp_path / "server.log").read_text()
        time.sleep(1.5)  # past a transient refusal's first retry
        assert trace.read_text().split().count("query_open") == opened  # never opened
        assert server.client.get("/ready").json()["refused"] == seen[0]
        found = server.client.post("/search", json={"vectors": vectors[:1].tolist(), "k": 1})
        assert found.status_code == 200 and found.json()["version"] == live
        _point(out, live + "\n")  # a rollback: the refusal clears
        _wait_ready(server, lambda r: "refused" not in r and r["version"] == live, "the refusal cleared")
        assert trace.read_text().split().count("query_open") == opened
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_a_server_flag_a_new_version_ignores_is_said(tmp_path, vectors_copy):
    """The server's --nprobe that the first version's index has no use for is said at the start ('note: --nprobe 2 is
    ignored: the index is Flat ...'); a re-index that turned IVF into HNSW (--index-factory auto picks by size) was
    followed with --nprobe dropped in silence. It is said for each version swapped in that ignores it."""
    _, out, vectors = vectors_copy
    log = tmp_path / "server.log"
    server = Server(log, out, "--reload-interval-s", "0.05", "--nprobe", "2")
    try:
        assert "note: --nprobe 2 is ignored: the index is Flat" in log.read_text()
        for factory, ignored in (("IVF4,Flat", False), ("HNSW8", True)):
            cli_run("rebuild", out, "--index-factory", factory)
            new = (out / "CURRENT").read_text().strip()
            _wait_ready(server, lambda r, new=new: r["version"] == new, f"the swap to {factory}")
            said = f"note: --nprobe 2 is ignored: the index is {factory} (no inverted lists to probe) ({new})"
            deadline = time.monotonic() + (10 if ignored else 0.5)
            while said not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (said in log.read_text()) is ignored, log.read_text()
            found = server.client.post("/search", json={"vectors": vectors[:1].tolist(), "k": 1})
            assert found.status_code == 200 and found.json()["version"] == new
            assert [r["hits"][0]["id"] for r in found.json()["results"]] == [0]
    finally:
        server.stop()
    assert server.proc.returncode == 0
