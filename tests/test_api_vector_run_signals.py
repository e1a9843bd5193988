"""``petal.index(..., vectors_column=...)`` run in a program's main thread caught no stop signal, though the README
promises that SIGINT and SIGTERM stop an API run cleanly at the next batch boundary (``petal.Interrupted``, 130/143)
and a text run does: the vector run made a ``StopSignals`` it never entered, so SIGTERM killed the process outright
(the lock file's holder gone, no report) and SIGINT was a ``KeyboardInterrupt`` reported as an internal error (exit 1).
Real Parquet and FAISS; the run in a fresh interpreter that signals itself at ``after_lock`` (``PETAL_FAULT``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

RUN = """
import json, sys
import petal
from tests.fake_engine import fake_engine_factory, make_fake_model_dir
src, out, report, kind = sys.argv[1:5]
settings = {"vectors_column": "vec"} if kind == "vectors" else {
    "model": str(make_fake_model_dir(__import__("pathlib").Path(out + "-model"))),
    "engine_factory": fake_engine_factory(None)}
try:
    petal.index(src, out, quiet=True, json_report=report, **settings)
    print(json.dumps({"raised": None}))
except petal.Interrupted as exc:
    print(json.dumps({"raised": "Interrupted", "exit_code": exc.exit_code}))
except BaseException as exc:
    print(json.dumps({"raised": type(exc).__name__}))
"""


@pytest.mark.parametrize("kind", ["vectors", "text"])
@pytest.mark.parametrize("action, code", [("term", 143), ("int", 130)])
def test_a_signal_stops_an_api_run_cleanly(tmp_path, kind, action, code):
    vectors = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(20)], "text": [f"t{i} words" for i in range(20)],
                             "vec": list(vectors)}), tmp_path / "s.parquet")
    out, report = tmp_path / "out", tmp_path / "report.json"
    env = {**os.environ, "PETAL_FAULT": f"after_lock:1:{action}", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "s.parquet"), str(out), str(report), kind],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.returncode, signal.Signals(-done.returncode).name if done.returncode < 0
                                  else "", done.stderr[-2000:])
    assert json.loads(done.stdout.splitlines()[-1]) == {"raised": "Interrupted", "exit_code": code}
    written = json.loads(report.read_text())
    assert (written["status"], written["exit_code"]) == ("interrupted", code)
    assert not (out / "CURRENT").exists()  # stopped before anything was published
