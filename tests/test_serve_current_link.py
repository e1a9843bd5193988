"""A server following OUT whose CURRENT is replaced by something that names no version (``follower._no_pointer``).

Before, a CURRENT replaced by a symbolic link out of OUT, a link to nothing, a link to a version's directory or a
FIFO was refused (the live version kept serving) with one message for all: 'OUT/CURRENT is missing, empty or
cannot be read', where ``petal query OUT`` names what it is. Now ``/ready``, the log and the metric's reason
(``current``) say it as the CLI does: 'leads out of OUT (a symlink)', 'a symbolic link to nothing (TARGET)', 'a
directory, not a regular file', 'a FIFO'; a link inside OUT to a file naming a version is followed, and CURRENT
written again is followed at the next check.

Real components: ``petal index`` (the packaged model, the session's sample index), ``petal rebuild``, ``petal serve``
in a child process on a loopback port, httpx."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests._serve_shared import copy_sample_out
from tests.test_serve import Server, cli_run
from tests.test_serve_vectors_only import _wait_ready

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


def _replace(out: Path, make) -> None:
    """CURRENT replaced at once by what ``make(path)`` creates (a link, a FIFO, a directory)."""
    tmp = out / ".CURRENT.tmp-test"
    make(tmp)
    os.replace(tmp, out / "CURRENT")


def test_a_current_that_names_no_version_says_what_it_is(tmp_path_factory, tmp_path):
    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    live = (out / "CURRENT").read_text().strip()
    cli_run("rebuild", out, "--index-factory", "HNSW8")
    newer = (out / "CURRENT").read_text().strip()
    (out / "CURRENT").write_text(live + "\n")
    outside = tmp_path / "elsewhere"
    outside.write_text(newer + "\n")
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        cases = [
            (lambda p: p.symlink_to(outside), "leads out of"),
            (lambda p: p.symlink_to("nowhere"), 'a symbolic link to nothing ("nowhere")'),
            (lambda p: p.symlink_to(Path("versions") / newer), "is a directory, not a regular file"),
            (os.mkfifo, "is a FIFO"),
        ]
        for make, said in cases:
            previous = server.client.get("/ready").json().get("refused", {}).get("message")
            _replace(out, make)
            ready = _wait_ready(server, lambda r, was=previous: r.get("refused", {}).get("message") not in (None, was),
                                said)
            assert ready["version"] == live and ready["refused"]["reason"] == "current", ready
            message = ready["refused"]["message"]
            assert said in message and str(out / "CURRENT") in message, message
            assert "missing, empty or cannot be read" not in message
            assert server.client.post("/search", json={"query": "topic 1", "k": 1}).status_code == 200
        back = out / "back"  # CURRENT names the live version again: the refusal is over, and the log says so
        back.write_text(live + "\n")
        _replace(out, lambda p: os.replace(back, p))
        _wait_ready(server, lambda r: r["version"] == live and "refused" not in r, "the refusal over")
        said = (tmp_path / "server.log").read_text(errors="replace")
        assert f"CURRENT names {live} again, the version it serves; the refusal of" in said, said[-2000:]
        pointer = out / "pointer"  # a link inside OUT to a file that names a version: followed
        pointer.write_text(newer + "\n")
        _replace(out, lambda p: p.symlink_to("pointer"))
        _wait_ready(server, lambda r: r["version"] == newer and "refused" not in r, "the linked version")
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_out_removed_while_serving_is_said_as_the_cli_says_it(tmp_path_factory, tmp_path):
    """OUT removed under a server: the live version keeps serving (its files are open), and /ready says OUT is not a
    petal index, as ``petal query OUT`` does. Was: 'OUT/CURRENT is missing (it should name a version)'."""
    import shutil

    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    live = (out / "CURRENT").read_text().strip()
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        shutil.rmtree(out)
        ready = _wait_ready(server, lambda r: "refused" in r, "a refusal")
        assert ready["version"] == live and ready["refused"]["reason"] == "current", ready
        message = ready["refused"]["message"]
        assert "is not a petal index" in message and str(out) in message, message
        assert "CURRENT is missing" not in message
        assert server.client.post("/search", json={"query": "topic 1", "k": 1}).status_code == 200
    finally:
        server.stop()
    assert server.proc.returncode == 0
