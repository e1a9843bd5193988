"""An index left with no vectors (``--delete`` of every id) publishes for every index kind, as an exact one did,
and every reader answers it: ``petal query`` (no hits), ``petal info``, ``petal verify``, ``petal.open_index``,
``petal rebuild`` and the next run adding rows.

Before: ``--index-factory IVF..``/``HNSW..`` and ``--quantize int8`` (SQ8) refused the run with 78 ("needs at least
1 vectors ... this run can index at most 0", "'SQ8' needs at least 0 vectors to train, the store has 0") while
Flat and binary published; an empty IVF index, once written, was refused as corrupt on open.

Real Parquet, real FAISS, the packaged model for the int8 index, every command in its own process
(forked from a preloaded interpreter: tests/forkrun.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests import forkrun

DIM = 8


def petal_run(*argv: object) -> subprocess.CompletedProcess[str]:
    """``petal ARGV`` in its own process, forked from a preloaded interpreter (tests/forkrun.py)."""
    run = forkrun.petal([str(a) for a in argv], timeout=300)
    return subprocess.CompletedProcess(["petal", *map(str, argv)], run.rc, run.stdout, run.stderr)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    return proc.stdout


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("empty")
    rng = np.random.default_rng(3)
    for name, ids in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])):
        flat = rng.standard_normal((len(ids), DIM)).astype(np.float32).ravel()
        pq.write_table(pa.table({"id": ids, "text": [f"document number {i}" for i in ids],
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                       root / f"{name}.parquet")
    pq.write_table(pa.table({"id": [1, 2, 3, 4]}), root / "delete.parquet")
    np.save(root / "q.npy", np.ones((2, DIM), np.float32))
    return root


KINDS = {
    "ivf": ["--vectors-column", "emb", "--index-factory", "IVF2,Flat"],
    "hnsw": ["--vectors-column", "emb", "--index-factory", "HNSW8"],
    "int8": ["--quantize", "int8"],
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_index_of_no_vectors_publishes_and_answers(data, tmp_path, kind):
    out = tmp_path / "out"
    flags = KINDS[kind]
    ok(petal_run("index", data / "a.parquet", "--out", out, "-q", *flags))
    ok(petal_run("index", data / "a.parquet", "--out", out, "-q", "--delete", data / "delete.parquet", *flags))
    with petal.open_index(out) as index:
        assert index.num_vectors == 0
        dim = index.dim
        assert index.search_stored(np.ones((1, dim), np.float32), 3) == [[]]
    np.save(tmp_path / "q.npy", np.ones((2, dim), np.float32))
    answers = ok(petal_run("query", out, "--vector-file", tmp_path / "q.npy", "--json")).splitlines()
    assert [json.loads(line)["hits"] for line in answers] == [[], []]
    if kind == "int8":
        assert json.loads(ok(petal_run("query", out, "document", "--json")))["hits"] == []
    assert json.loads(ok(petal_run("info", out, "--json")))
    ok(petal_run("verify", out))
    ok(petal_run("rebuild", out))
    ok(petal_run("index", data / "a.parquet", data / "b.parquet", "--out", out, "-q", *flags))
    with petal.open_index(out) as index:
        assert index.num_vectors == 4  # b's rows; a's stay deleted
