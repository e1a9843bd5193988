"""``petal serve`` following OUT/CURRENT when CURRENT holds something that is no version id: the refusal is shown
in ``/ready``, ``petal_index_refused`` and the log. What CURRENT held (up to 256 bytes, anything a writer put
there) was echoed raw: an escape sequence reached the terminal through stderr and a metric label, a newline split
the log line. A real server (child process, loopback port) on sample_data's index."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import SAMPLE_DATA
from tests.test_serve import Server, cli_run
from tests.test_serve_leases import wait_for

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

CONTROL = {chr(c) for c in range(32)} | {"\x7f"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-reload")
    out = root / "out"
    cli_run("index", *sorted(SAMPLE_DATA.glob("*.parquet")), "--out", out, "-q")
    server = Server(root / "server.log", out, "--reload-interval-s", "0.05", "--log-level", "info")
    yield server, out
    server.stop()


def point(out, content: bytes) -> None:
    (out / "CURRENT.tmp").write_bytes(content)
    os.replace(out / "CURRENT.tmp", out / "CURRENT")


@pytest.mark.parametrize("content", [
    b"\x1b[31mred\x1b[0m\n",
    b"v000001-20991231T000000Z\x1b]0;title\x07",
    b"line one\nline two\rthree\n",
    b"\x9b31m\xff\xfe" + b"x" * 200,
])
def test_a_current_that_is_no_version_id_is_shown_quoted_and_escaped(served, content):
    server, out = served
    live = (out / "CURRENT").read_bytes()
    try:
        point(out, content)
        refused = wait_for(lambda: server.client.get("/ready").json().get("refused"), "the refusal")
        assert refused["reason"] == "open", refused
        for text in (refused["version"], refused["message"]):
            assert not CONTROL & set(text), refused
        assert refused["version"].startswith('"') and len(refused["version"]) <= 80, refused
        metrics = server.client.get("/metrics").text
        refused_lines = [line for line in metrics.splitlines() if line.startswith("petal_index_refused{")]
        assert len(refused_lines) == 1 and not CONTROL & set(refused_lines[0]), refused_lines
        log = server.log.read_bytes()
        assert b"\x1b" not in log and b"\x07" not in log and b"\x9b" not in log
        assert b"line two" not in log or b"\\nline two" in log
        # still serving the live version
        answer = server.client.post("/search", json={"query": "glaciers", "k": 1})
        assert answer.status_code == 200 and answer.json()["version"] == live.decode().strip()
    finally:
        point(out, live)
        wait_for(lambda: "refused" not in server.client.get("/ready").json(), "the refusal cleared")


def test_a_version_id_is_shown_as_it_is(served, tmp_path):
    server, out = served
    live = (out / "CURRENT").read_bytes()
    missing = "v000009-20991231T000000Z"
    try:
        point(out, missing.encode() + b"\n")
        refused = wait_for(lambda: server.client.get("/ready").json().get("refused"), "the refusal")
        assert refused["version"] == missing and refused["reason"] == "open", refused
        assert f'petal_index_refused{{reason="open",version="{missing}"}} 1.0' in server.client.get("/metrics").text
    finally:
        point(out, live)
        wait_for(lambda: "refused" not in server.client.get("/ready").json(), "the refusal cleared")
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_an_index_of_precomputed_vectors_is_refused_before_the_port_opens(tmp_path):
    """``petal serve OUT`` of a ``--vectors-column`` index (no model to embed queries with): the server bound its port,
    started uvicorn and then exited 2 (a usage error, though no flag was wrong) with ``petal query``'s hint. Now 78
    at once, naming OUT and what to use instead, and the port is never bound."""
    import socket
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(50), "emb": pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), 8)}),
                   tmp_path / "v.parquet")
    cli_run("index", tmp_path / "v.parquet", "--out", tmp_path / "out", "-q", "--vectors-column", "emb")
    with socket.socket() as probe:  # a free port, closed again: the server must not bind it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for extra in ([], ["--model", "all-MiniLM-L6-v2"]):
        done = subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", str(tmp_path / "out"), "--port",
                               str(port), *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode == 78, done.stderr
        assert "precomputed vectors" in done.stderr and "petal serve needs an index built by a model" in done.stderr
        assert "listening" not in done.stderr and "answers now" not in done.stderr, done.stderr
