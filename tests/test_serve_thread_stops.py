"""``petal serve`` whose engine or search thread or version follower ends on an unexpected error (a bug past every
guard, injected with ``PETAL_FAULT=serve_engine_batch:1:raise`` / ``serve_search_batch`` / ``serve_follow``): the
request waiting on it is answered 500 naming the thread, the log holds the traceback, and the server stops with exit 1
(a supervisor starts a new one), rather than leaving a dead thread behind an open port: every later request waiting
forever (or, the follower gone, the version served forever, whatever a re-index publishes) while ``/ready`` still
said ready.

Real server on loopback, the packaged MiniLM, the session's copy of the sample index."""

from __future__ import annotations

import httpx
import pytest

from tests.test_serve import Server

pytest.importorskip("uvicorn")


def _stops_with_exit_1(server: Server, thread: str) -> str:
    """The server's exit code is 1 within 60 s; its log (checked: the thread named, the traceback, the last line)."""
    try:
        code = server.proc.wait(60)
    except Exception:
        server.stop()
        raise AssertionError(f"the server kept running:\n{server.log.read_text(errors='replace')}") from None
    log = server.log.read_text(errors="replace")
    assert code == 1, log
    assert "Traceback" in log and "InjectedFault: injected fault" in log, log
    last = log.strip().splitlines()[-1]
    assert last.startswith("petal: error: internal error: the ") and f"{thread} stopped on InjectedFault" in last, log
    return log


def test_the_engine_thread_stopping_answers_500_and_stops_the_server_with_exit_1(tmp_path, monkeypatch):
    from petal.engine.loader import default_model_dir

    monkeypatch.setenv("PETAL_FAULT", "serve_engine_batch:1:raise")
    server = Server(tmp_path / "log", "--model", default_model_dir())
    try:
        assert server.client.get("/ready").status_code == 200
        response = httpx.post(f"{server.url}/v1/embeddings", json={"input": ["a", "b"]}, timeout=30)
        assert response.status_code == 500, response.text
        error = response.json()["error"]
        assert error["type"] == "server_error" and "the engine thread stopped on InjectedFault" in error["message"]
        _stops_with_exit_1(server, "engine thread")
    finally:
        server.stop()


def test_the_search_thread_stopping_answers_500_and_stops_the_server_with_exit_1(tmp_path, tmp_path_factory,
                                                                                  monkeypatch):
    from tests._serve_shared import copy_sample_out

    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    monkeypatch.setenv("PETAL_FAULT", "serve_search_batch:1:raise")
    server = Server(tmp_path / "log", out)
    try:
        # embeddings do not touch the search thread: served as usual
        assert httpx.post(f"{server.url}/v1/embeddings", json={"input": "x"}, timeout=30).status_code == 200
        response = httpx.post(f"{server.url}/search", json={"query": "how do glaciers move", "k": 3}, timeout=30)
        assert response.status_code == 500, response.text
        assert "the search thread stopped on InjectedFault" in response.json()["error"]["message"]
        _stops_with_exit_1(server, "search thread")
    finally:
        server.stop()


def test_the_version_follower_stopping_stops_the_server_with_exit_1(tmp_path, tmp_path_factory, monkeypatch):
    """A follower that no longer looks at CURRENT would serve its version forever, whatever a re-index publishes."""
    from tests._serve_shared import copy_sample_out

    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    monkeypatch.setenv("PETAL_FAULT", "serve_follow:3:raise")
    server = Server(tmp_path / "log", out, "--reload-interval-s", "0.1")
    try:
        _stops_with_exit_1(server, "version follower")
    finally:
        server.stop()
