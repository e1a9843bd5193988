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


def deleted_by_a_tombstone(tmp_path: Path) -> tuple[Path, Path, dict[str, str], list[str]]:
    """OUT of six rows (fake engine) with a-1 and a-2 deleted by a --delete run: ``(out, its tombstone, env, the
    petal index argv)``."""
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
    return out, tombstone, env, index


@pytest.mark.parametrize("damage", [removed, emptied, garbage, a_directory])
def test_a_rebuild_never_brings_back_what_the_live_version_deleted(tmp_path, damage):
    out, tombstone, env, _ = deleted_by_a_tombstone(tmp_path)
    damage(tombstone)
    current = (out / "CURRENT").read_text()
    rebuilt = forkrun.petal(["rebuild", str(out), "--metric", "l2"], env)
    assert "Traceback" not in rebuilt.stderr
    assert rebuilt.rc == 65, rebuilt.stderr
    assert str(tombstone) in rebuilt.last_line and "tombstone" in rebuilt.last_line, rebuilt.last_line
    assert (out / "CURRENT").read_text() == current and "a-1" not in ids_of(out)


@pytest.mark.parametrize("damage", [emptied, garbage])
def test_a_damaged_tombstone_is_refused_with_a_way_out_for_a_rebuild(tmp_path, damage):
    """The advice for a tombstone that cannot be read leads somewhere. Before: rebuild shared petal index's "restore
    it, or remove it to index those rows again", and a rebuild over the tombstone removed refuses again (65, "holds 0
    deleted rows"): only petal index indexes those rows again. Following rebuild's advice now publishes."""
    out, tombstone, env, index = deleted_by_a_tombstone(tmp_path)
    damage(tombstone)
    rebuilt = forkrun.petal(["rebuild", str(out), "--metric", "l2"], env)
    assert rebuilt.rc == 65, rebuilt.stderr
    assert "cannot be read" in rebuilt.last_line and "petal index on the sources" in rebuilt.last_line, \
        rebuilt.last_line
    assert "remove it to index those rows again" not in rebuilt.last_line, rebuilt.last_line  # petal index's advice
    indexed = forkrun.petal(index, env)  # petal index keeps its own advice: removing it is its way out
    assert indexed.rc == 65 and "restore it, or remove it to index those rows again" in indexed.last_line, \
        indexed.last_line
    tombstone.unlink()  # rebuild's advice: remove it and run petal index on the sources
    assert forkrun.petal(["rebuild", str(out), "--metric", "l2"], env).rc == 65  # a rebuild alone still refuses
    indexed = forkrun.petal(index, env)
    assert indexed.rc == 0, indexed.stderr
    assert "a-1" in ids_of(out)  # the rows it lost are indexed again, as said
    assert forkrun.petal(["rebuild", str(out), "--metric", "l2"], env).rc == 0
