"""A glob SOURCE that matches a directory (Spark and pandas write a table ``t.parquet`` as a directory of
``part-*.parquet`` files) names what that directory as a SOURCE names: every ``*.parquet`` below it whose path there
has no part starting with ``.`` or ``_``. Before, ``petal index 'data/*.parquet'`` skipped such a directory without a
word: its rows were never indexed, exit 0; the same for an object-store glob (``s3://bucket/data/*.parquet``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.ingest.parquet import resolve_sources
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir

LAYOUT = {  # path below data/ -> ids
    "a.parquet": ["a"],
    "t.parquet/part-0.parquet": ["t0"],
    "t.parquet/nested/part-1.parquet": ["t1"],
    "t.parquet/_temporary/0/part-9.parquet": ["attempt"],  # a job's attempt below the table: not the table's
    "t.parquet/.part-0.parquet": ["copy"],
}


def table(ids: list[str]) -> pa.Table:
    return pa.table({"id": ids, "text": [f"document {i}" for i in ids]})


def parquet_bytes(ids: list[str]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table(ids), buffer)
    return buffer.getvalue()


def write_layout(root: Path) -> None:
    for name, ids in LAYOUT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(parquet_bytes(ids))
    (root / "t.parquet" / "_SUCCESS").write_bytes(b"")


def index(tmp_path: Path, source: str, env: dict | None = None, out: str = "out"):
    log = tmp_path / "fake.log"
    log.unlink(missing_ok=True)
    result = invoke(["index", source, "--out", str(tmp_path / out), "-q",
                     "--model", str(make_fake_model_dir(tmp_path / "model"))],
                    env={**(env or {}), "PETAL_TEST_FAKE_ENGINE": str(log)})
    return result, log


def test_a_glob_matching_a_directory_reads_it_as_a_directory_source(tmp_path):
    data = tmp_path / "data"
    write_layout(data)
    names = [str(p.relative_to(data)) for p in resolve_sources([str(data / "*.parquet")])]
    assert names == ["a.parquet", "t.parquet/nested/part-1.parquet", "t.parquet/part-0.parquet"]
    assert resolve_sources([str(data / "t.*")]) == resolve_sources([str(data / "t.parquet")])
    result, log = index(tmp_path, str(data / "*.parquet"))
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ["a", "t0", "t1"]


def test_a_glob_matching_only_such_directories_is_not_no_input(tmp_path):
    data = tmp_path / "data"
    write_layout(data)
    (data / "a.parquet").unlink()
    result, log = index(tmp_path, str(data / "*.parquet"))
    assert result.exit_code == 0, result.output  # before: 66 'glob ... matches no files'
    assert sorted(embedded_ids(log)) == ["t0", "t1"]


def test_a_glob_of_files_below_skips_hidden_parts_as_the_directory_does(tmp_path):
    """``**/*.parquet`` matches files, but ``**`` and ``*`` no name starting with ``.`` or ``_`` (it read the table's
    ``_temporary/`` attempt, which ``data/*.parquet`` and the directory skip); the directories it matches add none
    twice."""
    data = tmp_path / "data"
    write_layout(data)
    names = sorted(str(p.relative_to(data)) for p in resolve_sources([str(data / "**" / "*.parquet")]))
    assert names == ["a.parquet", "t.parquet/nested/part-1.parquet", "t.parquet/part-0.parquet"]


def test_an_object_store_glob_matching_a_prefix_reads_it_as_a_prefix_source(tmp_path):
    pytest.importorskip("moto")
    from tests.s3_server import start_s3

    server = start_s3(tmp_path / "moto.log")
    try:
        client = server.client()
        client.create_bucket(Bucket="corpus")
        for name, ids in LAYOUT.items():
            client.put_object(Bucket="corpus", Key=f"data/{name}", Body=parquet_bytes(ids))
        client.put_object(Bucket="corpus", Key="data/t.parquet/_SUCCESS", Body=b"")
        client.put_object(Bucket="corpus", Key="data/u.parquet/", Body=b"")  # a console's "folder": no objects
        result, log = index(tmp_path, "s3://corpus/data/*.parquet", env=server.env())
        assert result.exit_code == 0, result.output
        assert sorted(embedded_ids(log)) == ["a", "t0", "t1"]
        manifest = json.loads(next((tmp_path / "out" / "versions").glob("*/manifest.json")).read_text())
        assert [s["path"] for s in manifest["shards"]] == [
            "s3://corpus/data/a.parquet", "s3://corpus/data/t.parquet/nested/part-1.parquet",
            "s3://corpus/data/t.parquet/part-0.parquet"]
        result, log = index(tmp_path, "s3://corpus/data/**/*.parquet", env=server.env(), out="out2")
        assert result.exit_code == 0, result.output  # files matched below, none through a hidden part
        assert sorted(embedded_ids(log)) == ["a", "t0", "t1"]
    finally:
        server.stop()
