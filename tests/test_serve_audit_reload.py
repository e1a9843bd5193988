"""``petal serve`` following OUT/CURRENT when CURRENT holds something that is no version id: the refusal is shown
in ``/ready``, ``petal_index_refused`` and the log. What CURRENT held (up to 256 bytes, anything a writer put
there) was echoed raw: an escape sequence reached the terminal through stderr and a metric label, a newline split
the log line. A real server (child process, loopback port) on sample_data's index."""

from __future__ import annotations

import os
import shutil

import pytest

from tests._serve_shared import copy_sample_out
from tests.test_serve import Server
from tests.test_serve_leases import wait_for

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

CONTROL = {chr(c) for c in range(32)} | {"\x7f"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server on a copy of sample_data's index (the session's, tests/_serve_shared.py: its CURRENT is changed)."""
    root = tmp_path_factory.mktemp("serve-reload")
    out = copy_sample_out(tmp_path_factory, root / "out")
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
        # no version id: reason "current", said once and not tried again (tests/test_serve_reload_rules.py)
        assert refused["reason"] == "current" and "retry_in_s" not in refused, refused
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
