"""``petal query``/``info``/``serve`` on an OUT whose first ``petal index`` run has begun but not published (it
holds the lock and is embedding): 78 saying no version is published yet, not 'not a petal index; build one', which
sent a user to start a second run. An empty directory keeps the old wording.

Real components: ``petal index`` over real Parquet with the packaged model, held after its lock by a fault point
(``PETAL_FAULT=after_lock:1:sleep=S``), the commands in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def _petal(*args: object, env: dict[str, str] | None = None, **popen: object):
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120, **popen)


@pytest.mark.usefixtures("minilm_dir")
def test_an_out_being_indexed_for_the_first_time_is_said_so(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers melt", "tides turn"]}), tmp_path / "a.parquet")
    out = tmp_path / "out"
    env = {**os.environ, "PETAL_FAULT": "after_lock:1:sleep=30"}
    run = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "index", str(tmp_path / "a.parquet"), "--out",
                            str(out), "-q"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / ".lock").exists():
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        clean = {k: v for k, v in os.environ.items() if k != "PETAL_FAULT"}
        for args in (("query", out, "glaciers"), ("info", out), ("serve", out, "--port", "0")):
            said = _petal(*args, env=clean)
            assert said.returncode == 78, (args, said.stderr)
            assert "holds no published version yet" in said.stderr and "not a petal index" not in said.stderr, \
                said.stderr
    finally:
        run.kill()
        run.wait()
    empty = tmp_path / "empty"
    empty.mkdir()
    said = _petal("info", empty)
    assert said.returncode == 78 and "is not a petal index" in said.stderr, said.stderr
