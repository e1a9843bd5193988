"""A program that embeds Python (uWSGI, a C host) may handle a stop signal in C: Python's ``signal.getsignal`` then
says ``None``, a handler it cannot put back. ``petal.index`` and ``petal.rebuild`` in the main thread of such a
process took that signal for the run and restored ``None``: the run published, then raised a raw ``TypeError``
('signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable object'), and petal's handler stayed installed
for good. Such a signal is now left to its handler. Real Parquet and FAISS; the C handler is a real shared object
loaded with ``LD_PRELOAD`` (compiled here; skipped without a C compiler)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

HANDLER_C = r"""
#include <signal.h>
#include <string.h>
static void on_signal(int sig) { (void)sig; }
__attribute__((constructor)) static void install(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_signal;
    sigaction(SIGUSR1, &action, 0);
    sigaction(SIGHUP, &action, 0);
}
"""

RUN = """
import json, signal, sys
import petal
src, out = sys.argv[1:3]
before = {s.name: repr(signal.getsignal(s)) for s in (signal.SIGUSR1, signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
result = {"before": before}
try:
    result["index"] = petal.index(src, out, vectors_column="vec", quiet=True).status
    result["rebuild"] = petal.rebuild(out, index_factory="HNSW8").status
except BaseException as exc:
    result["raised"] = f"{type(exc).__name__}: {exc}"
result["after"] = {s.name: repr(signal.getsignal(s)) for s in (signal.SIGUSR1, signal.SIGHUP, signal.SIGTERM,
                                                               signal.SIGINT)}
print(json.dumps(result))
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_signal_handled_outside_python_is_left_alone(tmp_path):
    (tmp_path / "handler.c").write_text(HANDLER_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "handler.so"), str(tmp_path / "handler.c")],
                   check=True, timeout=120)
    vectors = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(20)], "vec": list(vectors)}), tmp_path / "s.parquet")
    env = {**os.environ, "LD_PRELOAD": str(tmp_path / "handler.so"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "s.parquet"), str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["before"]["SIGUSR1"] == result["before"]["SIGHUP"] == "None"  # what an embedding program shows
    assert "raised" not in result, result["raised"]
    assert (result["index"], result["rebuild"]) == ("success", "success")
    assert result["after"] == result["before"]  # every handler as it was
