"""``petal rebuild`` over a store whose ``--delete`` tombstone of a live shard is lost or damaged (RELIABILITY.md
promise 17): a rebuild publishes the live version's documents with other index settings, so one the live version deleted
must not come back. Before: a tombstone removed, or a directory in its place, was read as none and the rebuild
published the deleted documents again, exit 0 without a word; one emptied or garbled was 78 'FAISS cannot build
index'. Now 65 naming the tombstone, nothing published. Real processes, real Parquet files, the fake engine."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests.fake_engine import make_fake_model_dir


def removed(path: Path) -> None:
    path.unlink()


def emptied(path: Path) -> None:
    path.write_bytes(b"")


def garbage(path: Path) -> None:
    path.write_bytes(b"not a tombstone\n" * 8)


def a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def ids_of(out: Path) -> list[str]:
    version = (out / "CURRENT").read_text().strip()
    return pq.read_table(out / "versions" / version / "ids.parquet").column("id").to_pylist()


@pytest.mark.parametrize("damage", [removed, emptied, garbage, a_directory])
def test_a_rebuild_never_brings_back_what_the_live_version_deleted(tmp_path, damage):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    pq.write_table(pa.table({"id": [f"a-{i}" for i in range(6)], "text": [f"a words {i}" for i in range(6)]}),
                   data / "a.parquet")
    pq.write_table(pa.table({"id": ["a-1", "a-2"]}), tmp_path / "delete.parquet")
    model = make_fake_model_dir(tmp_path / "model")
    env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl")}
    index = ["index", str(data), "--out", str(out), "--model", str(model), "-q"]
    assert forkrun.petal(index, env).rc == 0
    deleted = forkrun.petal([*index, "--delete", str(tmp_path / "delete.parquet")], env)
    assert deleted.rc == 0, deleted.stderr
    assert "a-1" not in ids_of(out)
    (tombstone,) = (out / "store" / "deleted").glob("*/*.parquet")
    damage(tombstone)
    current = (out / "CURRENT").read_text()
    rebuilt = forkrun.petal(["rebuild", str(out), "--metric", "l2"], env)
    assert "Traceback" not in rebuilt.stderr
    assert rebuilt.rc == 65, rebuilt.stderr
    assert str(tombstone) in rebuilt.last_line and "tombstone" in rebuilt.last_line, rebuilt.last_line
    assert (out / "CURRENT").read_text() == current and "a-1" not in ids_of(out)
