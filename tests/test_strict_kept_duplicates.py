"""``--strict`` refuses an id held by two shards of the version a run would publish, whichever run brought them in.
Before: only the shards a text run named were compared, so an id of a named shard that a shard kept from the live
version also held was superseded silently (success), and ``--vectors-column --strict`` compared no shards at all.
Now both are 65 naming the id and the two shards (a kept one said as such) before any embedding; an id that
``--delete`` removed from the kept shard is no duplicate."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir, read_log

FAKE = "PETAL_TEST_FAKE_ENGINE"


def shard(path: Path, ids: list[int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": [f"document {i}" for i in ids],
                             "emb": pa.array([[1.0, float(i)] for i in ids], pa.list_(pa.float32()))}), path)
    return path


def index(tmp_path: Path, vectors: bool, *args: str | Path):
    flags = ["--vectors-column", "emb"] if vectors else ["--model", str(make_fake_model_dir(tmp_path / "model"))]
    return invoke(["index", *map(str, args), "--out", str(tmp_path / "out"), "-q", *flags],
                  env={FAKE: str(tmp_path / "fake.log")})


@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
def test_an_id_a_kept_shard_holds_too_is_refused_under_strict(tmp_path, vectors):
    a = shard(tmp_path / "src" / "a.parquet", [1, 2])
    assert index(tmp_path, vectors, a, "--strict").exit_code == 0
    current = (tmp_path / "out" / "CURRENT").read_text()
    (tmp_path / "fake.log").unlink(missing_ok=True)
    b = shard(tmp_path / "src" / "b.parquet", [2, 3])
    result = index(tmp_path, vectors, b, "--strict")  # additive: a is kept
    assert result.exit_code == 65, result.output
    assert 'id "2"' in result.output and "a.parquet (kept from the live version)" in result.output
    assert read_log(tmp_path / "fake.log") == []  # nothing embedded
    assert (tmp_path / "out" / "CURRENT").read_text() == current
    assert index(tmp_path, vectors, b).exit_code == 0  # without --strict the later shard wins


def test_vectors_column_strict_compares_the_named_shards(tmp_path):
    a = shard(tmp_path / "src" / "a.parquet", [1, 2])
    b = shard(tmp_path / "src" / "b.parquet", [2, 3])
    result = index(tmp_path, True, a, b, "--strict")
    assert result.exit_code == 65, result.output
    assert 'id "2"' in result.output
    assert not (tmp_path / "out" / "CURRENT").exists()


@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
def test_an_id_deleted_from_the_kept_shard_is_no_duplicate(tmp_path, vectors):
    a = shard(tmp_path / "src" / "a.parquet", [1, 2])
    assert index(tmp_path, vectors, a).exit_code == 0
    pq.write_table(pa.table({"id": [2]}), tmp_path / "delete.parquet")
    assert index(tmp_path, vectors, a, "--delete", tmp_path / "delete.parquet").exit_code == 0
    b = shard(tmp_path / "src" / "b.parquet", [2, 3])
    result = index(tmp_path, vectors, b, "--strict")
    assert result.exit_code == 0, result.output
