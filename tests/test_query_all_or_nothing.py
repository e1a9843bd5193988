"""``petal query``: every query is checked before the first answer is written, so a refused run writes nothing on
stdout, in every output format (plain, ``--json``, ``--show-text``, ``--where``).

Before: ``--vector-file`` rows were searched one at a time as they were written, so a row whose scores overflow
float32 (65) came after the answers of the rows before it (a consumer of stdout saw a partial, successful-looking
answer). Now every row is searched and checked first (in chunks of at most ``VECTOR_CHUNK_HITS`` hits); answers
beyond ``HELD_HITS`` are searched again as they are written, so memory does not grow with the file: the answers
must be the same, in order. (Text queries given as TEXT are all embedded and searched before any is written:
tests/test_nonfinite_model.py.)

Real Parquet, real FAISS (Flat inner product, L2), real petal processes (forked from a preloaded interpreter:
tests/forkrun.py).
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
from petal.cli.query import HELD_HITS, VECTOR_CHUNK_HITS
from tests import forkrun
from tests.test_open_audit_tamper import petal as petal_cli
from tests.test_open_audit_tamper import refused

DIM = 16
ROWS = 2000
FORMATS = [[], ["--json"], ["--show-text"], ["--json", "--show-text"], ["--where", "lang = 'en'"]]


def petal_query(*argv: str) -> subprocess.CompletedProcess[str]:
    return petal_cli("query", *argv)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("all-or-nothing")
    flat = np.random.default_rng(3).standard_normal((ROWS, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(ROWS), "lang": [("en", "fr")[i % 2] for i in range(ROWS)],
                             "text": [f"document {i}" for i in range(ROWS)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), root / "v.parquet")
    built = {}
    for name, extra in {"ip": [], "l2": ["--metric", "l2"]}.items():
        out = root / name
        proc = petal_cli("index", str(root / "v.parquet"), "--out", str(out), "-q", "--vectors-column", "emb",
                         "--keep-columns", "lang", *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        built[name] = out
    return built


@pytest.mark.parametrize("name", ["ip", "l2"])
@pytest.mark.parametrize("extra", FORMATS, ids=lambda e: " ".join(e) or "plain")
def test_a_refused_row_writes_nothing(indexes, tmp_path, name, extra):
    rows = np.ones((4, DIM), np.float32)
    rows[2] = 3e38 if name == "ip" else 1e20
    np.save(tmp_path / "q.npy", rows)
    proc = petal_query(str(indexes[name]), "--vector-file", str(tmp_path / "q.npy"), "-k", "3", *extra)
    refused(proc, 65, "--vector-file", "q.npy", "row 2:", "beyond float32")
    assert proc.stdout == "", proc.stdout[:500]  # rows 0 and 1 were written before the 65


def test_a_refused_row_in_a_later_chunk_writes_nothing(indexes, tmp_path):
    """The bad row is the last of a file of several search chunks: still nothing written, the row named by its
    number in the file (not in its chunk)."""
    k = 8
    count = 3 * (VECTOR_CHUNK_HITS // k) + 5
    rows = np.random.default_rng(1).standard_normal((count, DIM)).astype(np.float32)
    rows[-1] = 3e38
    np.save(tmp_path / "q.npy", rows)
    proc = petal_query(str(indexes["ip"]), "--vector-file", str(tmp_path / "q.npy"), "-k", str(k), "--json")
    refused(proc, 65, f"row {count - 1}:")
    assert proc.stdout == ""


def test_a_long_file_is_answered_whole_and_in_order(indexes, tmp_path):
    """More answers than HELD_HITS: the chunks past it are searched again as they are written; every row is
    answered once, in file order, with the hits of one search of all rows (the Python API). A guard of the two
    passes (the one-row-at-a-time search before them answered this file as well). Two chunks past HELD_HITS (a whole
    one and the file's last 7 rows): each hit costs the searches and the renderer ~40 us (per-hit lookups)."""
    k = 8
    count = HELD_HITS // k + VECTOR_CHUNK_HITS // k + 7
    rows = np.random.default_rng(2).standard_normal((count, DIM)).astype(np.float32)
    np.save(tmp_path / "q.npy", rows)
    # NOTE: petal query runs in its own process while this one searches with the Python API, side by side
    child = forkrun.start(["query", str(indexes["ip"]), "--vector-file", str(tmp_path / "q.npy"), "-k", str(k),
                           "--json"])
    with petal.open_index(indexes["ip"]) as index:
        expected = index.search_stored(rows, k=k)
    proc = child.wait(300)
    assert proc.rc == 0, proc.stderr[-3000:]
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a["query"] for a in answers] == [f"vector {i}" for i in range(count)]
    # NOTE: scores to float32's precision, not exact ids: FAISS scores a few rows by another path (BLAS or not, by
    # how many rows one search holds) than one search of every row, which differs in the last bits (4e-7 relative)
    # and can swap two hits that tie to that precision; a row answered out of place or twice has other scores
    got = np.array([[h["score"] for h in a["hits"]] for a in answers])
    np.testing.assert_allclose(got, [[h.score for h in hits] for hits in expected], rtol=2e-6, atol=1e-6)
    same = sum([h["id"] for h in a["hits"]] == [h.id for h in hits] for a, hits in zip(answers, expected))
    assert same >= count - 5, (same, count)
