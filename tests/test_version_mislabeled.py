"""A version directory whose manifest records another version id (``pipeline/layout.py``: ``check_version_name``).

Before, such a directory (a version copied or renamed by hand: ``cp -a versions/V2 versions/V3``, or CURRENT naming
V3 whose manifest says V2) was taken for the version its manifest names: ``petal query``/``verify``/``info`` answered
exit 0, and a ``petal serve`` following OUT swapped it in and said it served V2 (or, for a copy of the live version,
went back to it in silence while CURRENT named V3). Now every command refuses it, exit 65 naming the manifest file
and both ids; a server keeps serving its version, ``/ready`` and ``petal_index_refused`` say why (reason
``version``), and a server started on it exits 65 before its port opens. A copy under a name that is no version id
(``/srv/index``) still opens.

Real components: ``petal index`` (the packaged model, the session's sample index), ``petal rebuild``, ``petal
query``/``verify``/``info`` through the CLI, ``petal serve`` in a child process on a loopback port, httpx."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests._serve_shared import copy_sample_out
from tests.test_serve import Server, cli_run
from tests.test_serve_vectors_only import _wait_ready

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

OTHER = "v000009-20261205T000000Z"  # a version id no run handed out


def _point(out: Path, version: str) -> None:
    tmp = out / ".CURRENT.tmp-test"
    tmp.write_text(version + "\n")
    os.replace(tmp, out / "CURRENT")


def _run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_a_version_directory_under_another_id_is_refused_by_every_command(tmp_path_factory, tmp_path):
    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    live = (out / "CURRENT").read_text().strip()
    copied = out / "versions" / OTHER
    shutil.copytree(out / "versions" / live, copied)
    outside = tmp_path / OTHER  # copied out of OUT under a version's name
    shutil.copytree(out / "versions" / live, outside)
    for where in (copied, outside):
        for args in (("query", where, "topic 1", "-k", "1"), ("verify", where), ("info", where)):
            result = _run(*args)
            assert result.exit_code == 65, (args, result.output)
            said = result.output
            assert str(where / "manifest.json") in said and live in said and OTHER in said, said
            assert "Traceback" not in said
    plain = tmp_path / "index"  # a name that is no version id: the copy opens
    shutil.copytree(out / "versions" / live, plain)
    assert "doc-" in cli_run("query", plain, "topic 1", "-k", "1").output

    _point(out, OTHER)  # CURRENT names the copy
    for args in (("query", out, "topic 1", "-k", "1"), ("verify", out), ("info", out)):
        result = _run(*args)
        assert result.exit_code == 65, (args, result.output)
        assert f"CURRENT names {OTHER}" in result.output and f"records version \"{live}\"" in result.output
        assert f"echo {live} >" in result.output  # the way back
    # a server started on it never serves it: 65 before its port opens
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 65, proc.stderr
    assert OTHER in proc.stderr and live in proc.stderr and "listening on" not in proc.stderr


@pytest.mark.parametrize("copy_of", ["live", "newer"])
def test_a_server_refuses_a_published_directory_holding_another_version(tmp_path_factory, tmp_path, copy_of):
    """``live``: CURRENT names a copy of the live version (was: taken for a rollback, nothing said); ``newer``: a
    copy of a version built after it (was: swapped in and served under the name its manifest records)."""
    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    live = (out / "CURRENT").read_text().strip()
    source = live
    if copy_of == "newer":
        cli_run("rebuild", out, "--index-factory", "HNSW8")
        source = (out / "CURRENT").read_text().strip()
        assert source != live
        _point(out, live)
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        assert server.client.get("/ready").json()["version"] == live
        shutil.copytree(out / "versions" / source, out / "versions" / OTHER)
        _point(out, OTHER)
        ready = _wait_ready(server, lambda r: "refused" in r, "the refusal")
        assert ready["version"] == live, ready
        refused = ready["refused"]
        assert refused["version"] == OTHER and refused["reason"] == "version", refused
        assert "retry_in_s" not in refused  # a directory's manifest does not change: waits for CURRENT
        assert f"{OTHER}/manifest.json records version \"{source}\"" in refused["message"], refused
        metrics = server.client.get("/metrics").text
        assert f'petal_index_refused{{reason="version",version="{OTHER}"}} 1.0' in metrics
        assert f'petal_index_version{{version="{live}"}} 1.0' in metrics
        hits = server.client.post("/search", json={"query": "document about topic 1", "k": 3})
        assert hits.status_code == 200
        assert re.search(f"refused {OTHER}, still serving {live}", (tmp_path / "server.log").read_text())
        if copy_of == "newer":  # the real newer version is still followed
            _point(out, source)
            _wait_ready(server, lambda r: r["version"] == source and "refused" not in r, "the newer version")
    finally:
        server.stop()
    assert server.proc.returncode == 0
