"""Two different files whose ids are spelled from the same path: refused (65), never one file's documents lost.

A shard without an id column gives its rows the ids ``<shard path>:<row>``, the path as the run named it. Before,
``cd /a && petal index data --out IDX`` then ``cd /b && petal index data --out IDX`` (additive) exited 0: both files
gave ``data/x.parquet:0...`` and the one whose absolute path sorts last superseded the other's documents, only
counted ("3 superseded"); so did a ``latest`` symlink pointed at another directory between two runs, and a run naming
both files (one reusing its store entry, whose ids an earlier run spelled). Real ``petal index`` (the CLI with the
tests' fake engine), real Parquet, store and FAISS; moto on loopback for the objects.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir

FAKE = "PETAL_TEST_FAKE_ENGINE"
IDS = ["data/x.parquet:0", "data/x.parquet:1", "data/x.parquet:2"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(make_fake_model_dir(tmp_path_factory.mktemp("model")))


def write(path: Path, name: str, ids: bool = False, vectors: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: dict[str, object] = {"text": [f"{name} document {i}" for i in range(3)]}
    if ids:
        columns["id"] = [f"doc-{i}" for i in range(3)]
    if vectors:
        columns["emb"] = pa.array([[float(i), 1.0] for i in range(3)], pa.list_(pa.float32()))
    pq.write_table(pa.table(columns), path)


def index(tmp_path: Path, *args: str, model: str, vectors: bool = False):
    flags = ["--vectors-column", "emb"] if vectors else ["--model", model]
    return invoke(["index", *args, "--out", str(tmp_path / "idx"), "-q", *flags], env={FAKE: str(tmp_path / "log")})


def held(tmp_path: Path) -> dict[str, str]:
    """The live version's ids, each with the shard it came from (as the run recorded it)."""
    reader = IndexReader(tmp_path / "idx")
    rows = reader.ids.to_pylist()
    return {row["id"]: row["shard"] for row in rows}


@pytest.fixture
def two_dirs(tmp_path, monkeypatch) -> Path:
    write(tmp_path / "a" / "data" / "x.parquet", "a")
    write(tmp_path / "b" / "data" / "x.parquet", "b")
    monkeypatch.chdir(tmp_path / "a")
    return tmp_path


def refused(result, tmp_path: Path, live: str | None) -> None:
    assert result.exit_code == 65, result.output  # was 0: '3 superseded', one file's documents gone
    said = result.output.splitlines()[-1]
    assert 'the same document ids "data/x.parquet:<row>"' in said, said
    assert str(tmp_path / "a" / "data" / "x.parquet") in said and str(tmp_path / "b" / "data" / "x.parquet") in said
    assert "--id-column" in said
    assert OutputDir(tmp_path / "idx").current_version() == live


def test_an_additive_run_from_another_directory_is_65_and_loses_nothing(two_dirs, monkeypatch, model):
    tmp_path = two_dirs
    assert index(tmp_path, "data", model=model).exit_code == 0
    live = OutputDir(tmp_path / "idx").current_version()
    monkeypatch.chdir(tmp_path / "b")
    result = index(tmp_path, "data", model=model)
    refused(result, tmp_path, live)
    assert "--sync to drop " + str(tmp_path / "a" / "data" / "x.parquet") in result.output
    assert sorted(held(tmp_path)) == IDS
    # the same command from the same directory: the ids the index has, nothing to do
    monkeypatch.chdir(tmp_path / "a")
    again = index(tmp_path, "data", model=model)
    assert again.exit_code == 0 and "nothing-to-do" in again.output, again.output
    # --sync from the other directory: that file's documents replace the first's, as asked
    monkeypatch.chdir(tmp_path / "b")
    result = index(tmp_path, "data", "--sync", model=model)
    assert result.exit_code == 0, result.output
    assert sorted(held(tmp_path)) == IDS and "superseded" not in result.output


def test_a_symlinked_directory_pointed_elsewhere_is_65(tmp_path, monkeypatch, model):
    write(tmp_path / "snap1" / "x.parquet", "one")
    write(tmp_path / "snap2" / "x.parquet", "two")
    (tmp_path / "data").symlink_to("snap1")
    monkeypatch.chdir(tmp_path)
    assert index(tmp_path, "data", model=model).exit_code == 0
    live = OutputDir(tmp_path / "idx").current_version()
    (tmp_path / "data").unlink()
    (tmp_path / "data").symlink_to("snap2")
    result = index(tmp_path, "data", model=model)
    assert result.exit_code == 65, result.output
    assert str(tmp_path / "snap1" / "x.parquet") in result.output and str(tmp_path / "snap2" / "x.parquet") in \
        result.output
    assert OutputDir(tmp_path / "idx").current_version() == live


def test_two_sources_of_one_run_whose_ids_are_spelled_the_same_are_65(two_dirs, monkeypatch, model):
    """The first file named absolutely reuses its store entry, whose ids the first run spelled ``data/x.parquet``."""
    tmp_path = two_dirs
    assert index(tmp_path, "data", model=model).exit_code == 0
    live = OutputDir(tmp_path / "idx").current_version()
    monkeypatch.chdir(tmp_path / "b")
    refused(index(tmp_path, str(tmp_path / "a" / "data"), "data", model=model), tmp_path, live)
    refused(index(tmp_path, str(tmp_path / "a" / "data"), "data", "--sync", model=model), tmp_path, live)
    # named apart from the first time, both files' documents are indexed
    result = index(tmp_path, str(tmp_path / "a" / "data"), "data", "--sync", "--full", model=model)
    assert result.exit_code == 0, result.output
    assert len(held(tmp_path)) == 6 and "superseded" not in result.output


def test_an_entry_of_an_older_petal_is_read_for_its_ids(two_dirs, monkeypatch, model):
    """An entry committed before ``id_prefix`` was recorded: its ids are looked at."""
    tmp_path = two_dirs
    assert index(tmp_path, "data", model=model).exit_code == 0
    live = OutputDir(tmp_path / "idx").current_version()
    (entry_json,) = (tmp_path / "idx" / "store").rglob("entry.json")
    meta = json.loads(entry_json.read_text())
    del meta["id_prefix"]
    entry_json.write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path / "b")
    refused(index(tmp_path, "data", model=model), tmp_path, live)


def test_a_vectors_column_run_is_65_too(tmp_path, monkeypatch, model):
    write(tmp_path / "a" / "data" / "x.parquet", "a", vectors=True)
    write(tmp_path / "b" / "data" / "x.parquet", "b", vectors=True)
    monkeypatch.chdir(tmp_path / "a")
    assert index(tmp_path, "data", model=model, vectors=True).exit_code == 0
    live = OutputDir(tmp_path / "idx").current_version()
    monkeypatch.chdir(tmp_path / "b")
    refused(index(tmp_path, "data", model=model, vectors=True), tmp_path, live)
    assert sorted(held(tmp_path)) == IDS


def test_an_id_column_keeps_the_duplicate_id_rule(two_dirs, monkeypatch, model):
    """Shards with an id column: the same id in two files is superseded (README), not refused."""
    tmp_path = two_dirs
    write(tmp_path / "a" / "data" / "x.parquet", "a", ids=True)
    write(tmp_path / "b" / "data" / "x.parquet", "b", ids=True)
    assert index(tmp_path, "data", model=model).exit_code == 0
    monkeypatch.chdir(tmp_path / "b")
    result = index(tmp_path, "data", model=model)
    assert result.exit_code == 0, result.output
    assert "3 superseded" in result.output
    assert sorted(held(tmp_path)) == ["doc-0", "doc-1", "doc-2"]


def test_objects_of_the_same_key_in_two_buckets_keep_their_own_ids(tmp_path, monkeypatch, model):
    """An object's ids are its whole URI's: the same key in two buckets never gives the same id."""
    pytest.importorskip("moto")
    from tests.s3_server import start_s3

    server = start_s3(tmp_path / "moto.log")
    try:
        for bucket in ("one", "two"):
            server.client().create_bucket(Bucket=bucket)
            buffer = io.BytesIO()
            pq.write_table(pa.table({"text": [f"{bucket} document {i}" for i in range(3)]}), buffer)
            server.client().put_object(Bucket=bucket, Key="data/x.parquet", Body=buffer.getvalue())
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        assert index(tmp_path, "s3://one/data", model=model).exit_code == 0
        result = index(tmp_path, "s3://two/data", model=model)
        assert result.exit_code == 0, result.output
    finally:
        server.stop()
    assert "superseded" not in result.output
    assert sorted(held(tmp_path)) == [f"s3://{b}/data/x.parquet:{i}" for b in ("one", "two") for i in range(3)]
    assert np.unique(list(held(tmp_path).values())).size == 2


@pytest.mark.parametrize("length", [20, 5000])
def test_an_older_entrys_ids_are_read_where_its_footer_has_no_statistics(tmp_path, length):
    """pyarrow keeps no min/max of a value over 4 KiB: the ids themselves are read then."""
    from petal.pipeline.ingest.path_ids import _ids_start_with

    prefix = "d/" + "p" * length + ".parquet"
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"row": [0, 1], "id": [f"{prefix}:0", f"{prefix}:1"]}), path)
    assert _ids_start_with(path, f"{prefix}:")
    assert not _ids_start_with(path, "d/other.parquet:")
    pq.write_table(pa.table({"row": [0, 1], "id": [f"{prefix}:0", "doc-7"]}), path)
    assert not _ids_start_with(path, f"{prefix}:")
