"""What the ``petal serve`` test modules build once per pytest session and share (CI time).

``sample_out``: sample_data indexed by ``petal index SAMPLE_DATA --out OUT -q`` (the packaged MiniLM, default
settings), the index each of those modules used to build for itself; it is never modified: a module or test takes
its own copy (``copy_sample_out``). ``default_server``: one ``petal serve OUT`` (default flags, a copy of that
index) for the modules that only send it requests; stopped when the session ends.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from collections.abc import Iterator
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


@contextlib.contextmanager
def served_in_process(state: Any) -> Iterator[str]:
    """``petal serve``'s app for ``state`` (a ``ServeState``) on uvicorn in a thread of this process, on a loopback
    port, until the block ends; yields its base url once ``/ready`` answers 200. Python's thread switch interval, which
    the server sets, is put back."""
    import httpx

    from petal.pipeline.serve.server import bind, serve
    from petal.pipeline.serve.startup import Startup

    startup = Startup(state.settings, state.metrics, state=state)
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    interval = sys.getswitchinterval()
    thread = threading.Thread(target=serve, args=(startup, sock), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        yield url
    finally:
        startup.request_exit()
        thread.join(60)
        sys.setswitchinterval(interval)
