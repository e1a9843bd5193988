"""``petal serve`` stopped at its edges, a real server process with the packaged model (README "Stopping": exit 0,
also while still loading):

- SIGTERM while the model loads: the server stopped, then the interpreter ended under the load's thread (torch, the
  tokenizer mid-call): "terminate called without an active exception", SIGABRT, exit 134 (10 of 11 tries).
- A stop signal just after the drain (a supervisor that repeats it): Python's finalisation had put the default
  handlers back, and the process died of it (143) after a clean stop.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.test_serve import Server, _start

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.mark.parametrize("attempt", range(3))
def test_sigterm_while_the_model_loads_exits_0(tmp_path, minilm_dir, attempt):
    log = tmp_path / "log"
    proc, url = _start(log, "--model", minilm_dir)  # as soon as the port answers, the model loading
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            ready = client.get("/ready")
        if ready.status_code != 503:
            pytest.skip("the model loaded before the first /ready: nothing to stop while loading")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        text = log.read_text(errors="replace")
        assert code == 0, text[-3000:]
        assert "terminate called" not in text and "Fatal Python error" not in text and "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stop_signal_right_after_the_drain_changes_nothing(tmp_path, minilm_dir):
    log = tmp_path / "log"
    server = Server(log, "--model", minilm_dir)
    try:
        deadline = time.monotonic() + 120
        while server.client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        while "petal serve: stopped" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and server.proc.poll() is None
            time.sleep(0.002)
        for _ in range(50):  # a supervisor repeating the signal every few ms until the process is gone
            if server.proc.poll() is not None:
                break
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.005)
        assert server.proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        server.stop()


@pytest.mark.parametrize("where", ["flag", "env"])
def test_an_api_key_byte_that_is_not_utf8_is_that_byte(tmp_path, minilm_dir, where):
    """``--api-key $'\\xff'`` (or PETAL_API_KEY): Python reads the byte as a lone surrogate; encoding the key for the
    comparison raised UnicodeEncodeError after the port was bound (a traceback, exit 1). The key is its bytes, as a
    client sends them in its header."""
    key = b"k\xff".decode("utf-8", "surrogateescape")
    args = ("--api-key", key) if where == "flag" else ()
    server = Server(tmp_path / "log", "--model", minilm_dir, *args,
                    api_key_env=key if where == "env" else None)
    try:
        assert server.client.get("/v1/models", headers={"Authorization": b"Bearer k\xff"}).status_code == 200
        assert server.client.get("/v1/models", headers={"Authorization": b"Bearer k"}).status_code == 401
    finally:
        server.stop()
    assert server.proc.returncode == 0 and "Traceback" not in (tmp_path / "log").read_text(errors="replace")


def test_a_stop_signal_the_server_was_started_ignoring_stays_ignored(tmp_path):
    """``nohup petal serve OUT &``: the terminal's SIGHUP when the session ends must not stop the server (nohup set
    it ignored; petal's own handler replaced that), nor a script's Ctrl-C its background server (SIGINT ignored);
    SIGTERM still drains and exits 0. An index of vectors (no model to load)."""
    import os
    import re
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import petal

    rows = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": [str(i) for i in range(50)], "emb": list(rows)}), tmp_path / "v.parquet")
    petal.index(tmp_path / "v.parquet", tmp_path / "out", vectors_column="emb", quiet=True)

    def ignored() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    log = tmp_path / "log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", str(tmp_path / "out"), "--port",
                                 "0"], stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=ignored,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"listening on (http://[\d.]+:\d+)", log.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.02)
        url = found.group(1)
        for sig in (signal.SIGHUP, signal.SIGINT):
            proc.send_signal(sig)
            time.sleep(0.5)
            assert proc.poll() is None, log.read_text(errors="replace")
            with httpx.Client(base_url=url, timeout=10) as client:
                assert client.get("/ready").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
