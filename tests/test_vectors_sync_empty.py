"""``petal index --vectors-column --sync`` over sources that now hold no shard, or only shards without a vector.

A text run mirrors an emptied corpus within the removal guard (tests/test_sync_empty_sources.py); a precomputed-
vectors run exited 66 there ("no *.parquet files under directory", "holds no vector in any shard", "no vectors to
index") whatever ``--max-removed`` allowed. Now both runs behave the same: 65 from the guard by default, an empty
version (the live one's width) when ``--max-removed`` allows every document to go, and 66 without ``--sync`` or
without a live version. Real CLI runs in process, real Parquet and FAISS, no model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests.fake_cli import invoke

DIM = 8


def write_vectors(path: Path, prefix: str, rows: int) -> None:
    vectors = np.random.default_rng(len(prefix) + rows).random((rows, DIM), dtype=np.float32)
    table = pa.table({"id": [f"{prefix}{i}" for i in range(rows)],
                      "vec": pa.array(list(vectors), type=pa.list_(pa.float32(), DIM))})
    pq.write_table(table, path)


def index(data: Path, out: Path, *flags: str):
    return invoke(["index", str(data), "--out", str(out), "--vectors-column", "vec", "--id-column", "id", "-q",
                   *flags])


@pytest.fixture
def live(tmp_path) -> tuple[Path, Path]:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    for name in "ab":
        write_vectors(data / f"{name}.parquet", name, 5)
    first = index(data, out)
    assert first.exit_code == 0, first.output
    return data, out


def test_emptied_directory_is_judged_by_the_guard_then_mirrored(live):
    data, out = live
    before = OutputDir(out).current_version()
    for shard in data.glob("*.parquet"):
        shard.unlink()
    additive = index(data, out)
    assert additive.exit_code == 66 and "no *.parquet files under directory" in additive.output, additive.output
    guarded = index(data, out, "--sync")
    assert guarded.exit_code == 65 and "would remove 10 of the 10 documents" in guarded.output, guarded.output
    assert OutputDir(out).current_version() == before
    mirrored = index(data, out, "--sync", "--max-removed", "100%")
    assert mirrored.exit_code == 0, mirrored.output
    reader = IndexReader(out)
    assert reader.manifest.shards == () and reader.index.ntotal == 0 and reader.index.d == DIM
    again = index(data, out, "--sync", "--max-removed", "100%")
    assert again.exit_code == 0 and "nothing-to-do" in again.output, again.output
    write_vectors(data / "c.parquet", "c", 3)  # the corpus comes back
    back = index(data, out)
    assert back.exit_code == 0, back.output
    assert IndexReader(out).index.ntotal == 3


def test_shards_without_a_vector_under_sync_keep_the_live_width(live, tmp_path):
    data, out = live
    for shard in data.glob("*.parquet"):
        shard.unlink()
    empty = pa.table({"id": pa.array([], pa.string()), "vec": pa.array([], pa.list_(pa.float32(), DIM))})
    pq.write_table(empty, data / "a.parquet")  # a replaced shard's lost rows are its new content, not refused
    guarded = index(data, out, "--sync")
    assert guarded.exit_code == 65 and "would remove 5 of the 10" in guarded.output, guarded.output
    mirrored = index(data, out, "--sync", "--max-removed", "100%")
    assert mirrored.exit_code == 0, mirrored.output
    assert IndexReader(out).index.ntotal == 0


def test_without_a_live_version_an_empty_source_stays_no_input(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    result = index(data, tmp_path / "out", "--sync", "--max-removed", "100%")
    assert result.exit_code == 66 and "no *.parquet files" in result.output, result.output
