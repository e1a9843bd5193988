"""FAISS's own printing never reaches a user's output, and catching it never moves fd 1 under another thread.

FAISS ``printf``s on fd 1 when an on-disk IVF index is opened with ``IO_FLAG_ONDISK_SAME_DIR`` ("updating ondisk
filename from <staging path> to ...") and when its list file is sized at build time ("resizing ... to N bytes").
petal used to send fd 1 to fd 2 around every read (``dup2``, process-wide): every ``petal query`` of an on-disk
index printed that line on stderr, and a thread that wrote to stdout while another thread opened an index (the
server's loader thread, Python API users) had its output moved to stderr; two threads at once could leave fd 1
pointing at stderr for good. Now the open maps the lists itself (no printing, no fd games) and the build catches
fd 1 under a lock, drops FAISS's chatter and passes anything else on to stderr.

Real FAISS, real Parquet, every command in its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

PETAL = [sys.executable, "-m", "petal.cli.main"]
DIM = 32


def run(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=REPO, timeout=300,
                          stdin=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """An on-disk IVF index (``--index-memory 1M`` below its size) and the ``petal index`` run that built it."""
    root = tmp_path_factory.mktemp("chatter")
    rows = 9000
    flat = np.random.default_rng(3).standard_normal((rows, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(rows), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "v.parquet")
    out = root / "out"
    proc = run(*PETAL, "index", str(root / "v.parquet"), "--out", str(out), "--vectors-column", "emb",
               "--index-factory", "IVF16,Flat", "--index-memory", "1M")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert next((out / "versions").glob("v*/index.ivfdata")).is_file()
    np.save(root / "q.npy", flat[: 3 * DIM].reshape(3, DIM))
    return out, proc


def test_the_on_disk_build_prints_no_faiss_chatter(built):
    _, proc = built
    assert "resizing" not in proc.stderr and ".staging-" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("petal index: success"), proc.stderr


def test_query_info_verify_of_an_on_disk_index_print_only_their_own_lines(built):
    out, _ = built
    query = run(*PETAL, "query", str(out), "--vector-file", str(out.parent / "q.npy"), "-k", "3", "--json")
    assert query.returncode == 0, query.stderr
    assert query.stderr == "", query.stderr  # was "IO_FLAG_ONDISK_SAME_DIR: updating ondisk filename from ..."
    answers = [json.loads(line) for line in query.stdout.splitlines()]
    assert [a["hits"][0]["id"] for a in answers] == [0, 1, 2]
    for argv in (["info", str(out)], ["verify", str(out)], ["info", str(out), "--json"]):
        proc = run(*PETAL, *argv)
        assert proc.returncode == 0, proc.stderr
        assert "IO_FLAG" not in proc.stderr + proc.stdout and "updating ondisk" not in proc.stderr + proc.stdout


OPEN_WHILE_PRINTING = """
import sys, threading, numpy as np, petal
out = sys.argv[1]
def opener():
    for _ in range(15):
        with petal.open_index(out) as index:
            index.search_stored(np.ones((1, index.dim), np.float32), k=2)
threads = [threading.Thread(target=opener) for _ in range(4)]
for t in threads:
    t.start()
number = 0
while any(t.is_alive() for t in threads) or number < 200:
    print(f"line {number}", flush=True)
    number += 1
for t in threads:
    t.join()
print(f"done {number}", flush=True)
"""


def test_threads_opening_on_disk_indexes_never_move_stdout(built):
    """A line printed to stdout while other threads open an on-disk index stays on stdout, every one of them
    (before: the open swapped fd 1 for fd 2 process-wide, and lines landed on stderr)."""
    out, _ = built
    proc = run(sys.executable, "-c", OPEN_WHILE_PRINTING, str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    total = int(lines[-1].split()[1])
    assert lines == [f"line {n}" for n in range(total)] + [f"done {total}"]
    assert proc.stderr == "", proc.stderr[-3000:]


CATCH_IN_THREADS = r"""
import ctypes, os, sys, threading
from petal.pipeline.index.files import faiss_stdout
libc = ctypes.CDLL(None)
before = os.fstat(1)
def noisy(n):
    for i in range(50):
        with faiss_stdout():
            libc.printf(b"resizing /x/.staging-1/index.ivfdata to 4096 bytes\n")
            libc.printf(b"IO_FLAG_ONDISK_SAME_DIR: updating ondisk filename from /a to /b\n")
            libc.printf(b"a real warning %d.%d\n", n, i)
threads = [threading.Thread(target=noisy, args=(n,)) for n in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
after = os.fstat(1)
print("same" if (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino) else "moved", flush=True)
"""


def test_faiss_stdout_drops_chatter_keeps_the_rest_and_restores_fd1_across_threads():
    proc = run(sys.executable, "-c", CATCH_IN_THREADS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "same\n"
    assert sorted(proc.stderr.splitlines()) == sorted(f"a real warning {n}.{i}" for n in range(4) for i in range(50))
