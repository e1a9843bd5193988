"""What the ``petal serve`` test modules build once per pytest session and share (CI time).

``sample_out``: sample_data indexed by ``petal index SAMPLE_DATA --out OUT -q`` (the packaged MiniLM, default
settings), the index each of those modules used to build for itself; it is never modified: a module or test takes
its own copy (``copy_sample_out``). ``default_server``: one ``petal serve OUT`` (default flags, a copy of that
index) for the modules that only send it requests; stopped when the session ends.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLE_DATA

_BUILT: dict[str, Any] = {}


def sample_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT of ``petal index SAMPLE_DATA --out OUT -q``, built on the first call of the session. Read only."""
    if "out" not in _BUILT:
        from click.testing import CliRunner

        from petal.cli.main import cli

        out = tmp_path_factory.mktemp("serve-sample-index") / "out"
        result = CliRunner().invoke(cli, ["index", str(SAMPLE_DATA), "--out", str(out), "-q"])
        assert result.exit_code == 0, result.output
        _BUILT["out"] = out
    return _BUILT["out"]


def copy_sample_out(tmp_path_factory: pytest.TempPathFactory, dest: Path) -> Path:
    """A copy of ``sample_out`` at ``dest`` (its sources: SAMPLE_DATA's shards, so a re-index reuses them)."""
    shutil.copytree(sample_out(tmp_path_factory), dest, ignore=shutil.ignore_patterns(".lock"))
    return dest


def default_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``petal serve OUT`` (default flags) on a copy of ``sample_out``, started on the first call of the session
    and stopped when it ends; for tests that only send requests (no flags of their own, no change to OUT)."""
    from tests.test_serve import Server

    server = _BUILT.get("server")
    if server is None:
        root = tmp_path_factory.mktemp("serve-default")
        server = Server(root / "server.log", copy_sample_out(tmp_path_factory, root / "out"))
        request.config.add_cleanup(server.stop)
        _BUILT["server"] = server
    assert server.proc.poll() is None, f"the shared server exited:\n{server.log.read_text(errors='replace')}"
    return server
