"""CURRENT written again with the same name is a new publish (README "Following re-indexing"), however it is written
(``follower._pointer_state``).

A version a server refuses without trying again (here a directory holding a copy of another version: reason
``version``) waits for CURRENT to change; once the version is repaired, ``echo V > OUT/CURRENT`` makes the server
try it at once. Before, that write was not seen when CURRENT's mtime was put back (written in place by ``cp -p``,
``rsync -t --inplace`` or ``touch -d``: same inode, size and mtime), nor when CURRENT is a symbolic link inside OUT
to the file that was written again: the server kept the refusal until CURRENT named another version. Its ctime, and
the link's target, are now part of what is compared.

Real components: ``petal index`` (the packaged model, the session's sample index), ``petal rebuild``, ``petal serve``
in a child process on a loopback port, httpx."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests._serve_shared import copy_sample_out
from tests.test_serve import Server, cli_run
from tests.test_serve_vectors_only import _wait_ready

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


def _write_in_place_keeping_mtime(path: Path, text: str) -> None:
    before = os.stat(path)
    with open(path, "r+") as f:  # the same inode (cp -p over an existing file, rsync --inplace)
        f.seek(0)
        f.write(text)
        f.truncate()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)


@pytest.mark.parametrize("current", ["file", "link"])
def test_current_written_again_is_seen_however_it_is_written(tmp_path_factory, tmp_path, current):
    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    live = (out / "CURRENT").read_text().strip()
    cli_run("rebuild", out, "--index-factory", "HNSW8")
    newer = (out / "CURRENT").read_text().strip()
    stash = tmp_path / "stash"
    (out / "versions" / newer).rename(stash)
    shutil.copytree(out / "versions" / live, out / "versions" / newer)  # newer's name, live's index
    pointer = out / "CURRENT"
    if current == "link":
        pointer = out / "pointer"
        (out / "CURRENT").unlink()
        os.symlink("pointer", out / "CURRENT")
    pointer.write_text(live + "\n")
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        assert server.client.get("/ready").json()["version"] == live
        pointer.write_text(newer + "\n")
        ready = _wait_ready(server, lambda r: "refused" in r, "the refusal")
        assert ready["refused"]["reason"] == "version" and ready["version"] == live, ready
        shutil.rmtree(out / "versions" / newer)  # repaired: the real version back in place
        stash.rename(out / "versions" / newer)
        if current == "file":
            _write_in_place_keeping_mtime(pointer, newer + "\n")
        else:
            pointer.write_text(newer + "\n")  # the link's target written again: the link itself unchanged
        _wait_ready(server, lambda r: r["version"] == newer and "refused" not in r, "the repaired version", 20)
    finally:
        server.stop()
    assert server.proc.returncode == 0
