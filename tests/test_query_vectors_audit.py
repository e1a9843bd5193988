"""``petal query --vector-file`` and ``Index.search_stored`` audit: query vectors that float32 holds but whose
scores against the index do not, and files that are no ``.npy`` at all.

Real Parquet, real FAISS (Flat, IVF-PQ, HNSW, an L2 index), every command in its own process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.test_open_audit_tamper import refused

PETAL = [sys.executable, "-m", "petal.cli.main"]
DIM = 16
ROWS = 2000


def petal(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PETAL, *argv], capture_output=True, text=True, cwd=REPO, timeout=300,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vectors")
    flat = np.random.default_rng(5).standard_normal((ROWS, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(ROWS), "lang": [("en", "fr")[i % 2] for i in range(ROWS)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), root / "v.parquet")
    built = {}
    for name, extra in {"flat": [], "ivfpq": ["--index-factory", "IVF4,PQ4"], "hnsw": ["--index-factory", "HNSW8"],
                        "l2": ["--metric", "l2"]}.items():
        out = root / name
        proc = petal("index", str(root / "v.parquet"), "--out", str(out), "-q", "--vectors-column", "emb",
                     "--keep-columns", "lang", *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        built[name] = out
    return built


@pytest.mark.parametrize(("name", "value"), [(name, value) for name in ("flat", "ivfpq", "hnsw", "l2")
                                             for value in (3e38, -3e38)] + [("l2", 1e20)])
def test_a_row_whose_scores_overflow_float32_is_65_naming_the_row(indexes, tmp_path, name, value):
    """Each value is finite as float32, so the file passed the checks; its products with the stored vectors (inner
    product), or its squared norm (L2: 1e20 in 16 dims is 1.6e41) are not. Before: exit 0, every score inf
    (``"score": Infinity`` in --json, which is no JSON) and the hits an arbitrary pick; on L2, no hits at all."""
    rows = np.ones((3, DIM), np.float32)
    rows[1] = value
    np.save(tmp_path / "q.npy", rows)
    for extra in ([], ["--json"], ["--where", "lang = 'en'"]):
        proc = petal("query", str(indexes[name]), "--vector-file", str(tmp_path / "q.npy"), "-k", "3", *extra)
        refused(proc, 65, "--vector-file", "q.npy", "row 1", "beyond float32")
        assert "Infinity" not in proc.stdout and "inf" not in proc.stdout.split(), proc.stdout
        assert proc.stdout == ""  # every row is checked before the first answer: row 0 is not written either


API = """
import sys, numpy as np, petal
from petal.pipeline.reliability.errors import UsageError
with petal.open_index(sys.argv[1]) as index:
    rows = np.ones((2, index.dim), np.float32)
    rows[1] = 3e38
    try:
        index.search_stored(rows, k=3)
    except UsageError as exc:
        print("refused:", exc)
    ok = index.search_stored(np.ones((1, index.dim), np.float32), k=3)
    print("answered:", len(ok[0]), all(np.isfinite(hit.score) for hit in ok[0]))
"""


@pytest.mark.parametrize("name", ["flat", "l2"])
def test_the_api_refuses_such_a_row_with_a_usage_error(indexes, name):
    proc = subprocess.run([sys.executable, "-c", API, str(indexes[name])], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: query vector 1: its scores against this index are beyond float32" in proc.stdout, proc.stdout
    assert "answered: 3 True" in proc.stdout


@pytest.mark.parametrize("content", [b"hello\n", b"PAR1\x00\x00\x00\x00PAR1", b"\x80\x04K\x01.", b"\x93NUM"])
def test_a_file_that_is_no_npy_is_said_so(indexes, tmp_path, content):
    """Before: numpy took any file without the .npy magic for a pickle: 'not a readable .npy file (This file contains
    pickled (object) data. If you trust the file you can load it unsafely using the allow_pickle= keyword ...)'."""
    path = tmp_path / "q.npy"
    path.write_bytes(content)
    last = refused(petal("query", str(indexes["flat"]), "--vector-file", str(path)), 65, "q.npy", "not a .npy file")
    assert "pickle" not in last, last
