"""``--index-factory`` is judged against the vectors the index will hold: the live rows, less those ``--delete``
removed and those a later shard's same id supersedes.

Before: ``petal rebuild OUT --index-factory PQ8`` over 300 rows of which 50 deleted checked the factory against
the 300 rows embedded (``report.rows["reused"]``), so it passed, and the build's own check (250 vectors) failed as 78
"FAISS cannot build index 'PQ8' from 300 vectors ... this run can index at most 250 vectors" (two counts, and no
usage error for a flag given); ``IVF301,Flat`` was 2 but said "at most 300". A rebuild now says 2 before any work,
with the live count. ``petal index`` with the same factory over the same shards can only count the rows read before
any work: its build's check is 78 (README: a FAISS error during the build), now with the count of the vectors left.
Real ``petal`` processes (forked), real Parquet and FAISS; precomputed vectors (``--vectors-column``) and the fake
engine for a text run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests.fake_engine import make_fake_model_dir

DIM = 8


def petal(*argv: object, env: dict[str, str | None] | None = None) -> forkrun.Result:
    proc = forkrun.petal(list(map(str, argv)), env, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def vectors_shard(path: Path, ids: range, seed: int) -> None:
    flat = np.random.default_rng(seed).standard_normal((len(ids), DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": list(ids), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), path)


@pytest.fixture
def live12(tmp_path) -> dict[str, Path]:
    """20 rows in two shards: ids 8-11 in both (b.parquet sorts later: a's four are superseded), ids 0-3 deleted;
    12 vectors in the live version."""
    src = tmp_path / "src"
    src.mkdir()
    vectors_shard(src / "a.parquet", range(0, 12), 1)
    vectors_shard(src / "b.parquet", range(8, 16), 2)
    pq.write_table(pa.table({"id": [0, 1, 2, 3]}), tmp_path / "delete.parquet")
    out = tmp_path / "out"
    index = ["index", src, "--out", out, "-q", "--vectors-column", "emb"]
    assert petal(*index).rc == 0
    deleted = petal(*index, "--delete", tmp_path / "delete.parquet", "--json-report", tmp_path / "r.json")
    assert deleted.rc == 0, deleted.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["index"]["num_vectors"] == 12 and report["index"]["superseded"] == 4, report["index"]
    return {"src": src, "out": out, "tmp": tmp_path}


def test_rebuild_judges_a_factory_given_against_the_live_vectors(live12):
    out = live12["out"]
    current = (out / "CURRENT").read_text()
    refused = petal("rebuild", out, "--index-factory", "IVF13,Flat")
    assert refused.rc == 2, refused.stderr  # was 78: 20 rows passed the check, the build's 12 vectors failed
    assert "at most 12 vectors" in refused.last_line and "20" not in refused.last_line, refused.last_line
    assert "rows read" not in refused.last_line and "superseded" in refused.last_line, refused.last_line
    assert "FAISS cannot build" not in refused.last_line, refused.last_line
    assert (out / "CURRENT").read_text() == current
    assert not [p for p in (out / "versions").iterdir() if p.name.startswith(".")]  # no staging directory left
    report = live12["tmp"] / "rebuild.json"
    rebuilt = petal("rebuild", out, "--index-factory", "IVF12,Flat", "--json-report", report)
    assert rebuilt.rc == 0, rebuilt.stderr
    written = json.loads(report.read_text())
    assert written["index"]["num_vectors"] == 12 and written["index"]["factory"] == "IVF12,Flat"
    # the report's counts keep their meaning: every row of the version's shards, every one embedded reused
    assert written["rows"]["total"] == 20 and written["rows"]["reused"] == 20, written["rows"]


def test_index_counts_the_vectors_left(live12):
    out, src = live12["out"], live12["src"]
    current = (out / "CURRENT").read_text()
    refused = petal("index", src, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "IVF13,Flat")
    assert refused.rc == 78, refused.stderr
    # was 'FAISS cannot build index 'IVF13,Flat' from 20 vectors ...: at most 12 vectors (the rows read and ...)'
    assert "from 12 vectors" in refused.last_line and "at most 12 vectors" in refused.last_line, refused.last_line
    assert "rows read" not in refused.last_line, refused.last_line
    assert "Nothing was published" in refused.last_line, refused.last_line
    assert (out / "CURRENT").read_text() == current


def test_a_kept_factory_the_vectors_left_cannot_train_is_78_with_their_count(live12):
    out, src, tmp = live12["out"], live12["src"], live12["tmp"]
    index = ["index", src, "--out", out, "-q", "--vectors-column", "emb"]
    assert petal(*index, "--index-factory", "IVF12,Flat").rc == 0
    current = (out / "CURRENT").read_text()
    pq.write_table(pa.table({"id": [4]}), tmp / "one.parquet")
    failed = petal(*index, "--delete", tmp / "one.parquet")  # IVF12,Flat kept, 11 vectors left
    assert failed.rc == 78, failed.stderr
    assert "from 11 vectors" in failed.last_line and "at most 11 vectors" in failed.last_line, failed.last_line
    assert (out / "CURRENT").read_text() == current


def test_a_text_index_run_counts_the_live_rows(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(12)), "text": [f"words number {i}" for i in range(12)]}),
                   src / "a.parquet")
    pq.write_table(pa.table({"id": [0, 1, 2, 3]}), tmp_path / "delete.parquet")
    env: dict[str, str | None] = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl")}
    index = ["index", src, "--out", out, "--model", make_fake_model_dir(tmp_path / "model"), "-q"]
    assert petal(*index, env=env).rc == 0
    assert petal(*index, "--delete", tmp_path / "delete.parquet", env=env).rc == 0
    current = (out / "CURRENT").read_text()
    refused = petal(*index, "--index-factory", "IVF9,Flat", env=env)
    assert refused.rc == 78, refused.stderr  # was 'FAISS cannot build index 'IVF9,Flat' from 12 vectors'
    assert "from 8 vectors" in refused.last_line and "at most 8 vectors" in refused.last_line, refused.last_line
    assert (out / "CURRENT").read_text() == current
    refused = petal("rebuild", out, "--index-factory", "IVF9,Flat")
    assert refused.rc == 2 and "at most 8 vectors" in refused.last_line, refused.stderr
    assert petal(*index, "--index-factory", "IVF8,Flat", env=env).rc == 0


def test_rows_a_lost_tombstone_gives_back_count_for_the_factory(tmp_path):
    """A --delete tombstone removed (the README's way out for an unreadable one: 'remove it to index those rows
    again'): its rows are indexed again, so the check before any work counts them. A stricter count tried this
    session (the live version's rows less its deleted) refused PQ8 here with 2, 'at most 250', over 300 vectors."""
    src = tmp_path / "vec.parquet"
    vectors_shard(src, range(300), 3)
    pq.write_table(pa.table({"id": list(range(50))}), tmp_path / "del.parquet")
    out = tmp_path / "out"
    index = ["index", src, "--out", out, "-q", "--vectors-column", "emb"]
    assert petal(*index).rc == 0
    assert petal(*index, "--delete", tmp_path / "del.parquet").rc == 0
    tombstones = [p for p in (out / "store").rglob("*") if p.is_file() and "deleted" in p.parts]
    assert tombstones, sorted(str(p) for p in (out / "store").rglob("*"))
    for path in tombstones:
        path.unlink()
    report = tmp_path / "r.json"
    again = petal(*index, "--index-factory", "PQ8", "--json-report", report)
    assert again.rc == 0, again.stderr
    assert json.loads(report.read_text())["index"]["num_vectors"] == 300
