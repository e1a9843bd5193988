"""A relative path whose first part holds ':' (``a:b``, ``c:d/x.parquet``) is a local path: pyarrow took it for a
URI of scheme ``a``, so ``petal index SRC --out a:b`` exited 1 with a traceback ('Unrecognized filesystem type in
URI: a:b/store/...') leaving a partial ``a:b`` directory, and a SOURCE ``c:d`` was 'not a readable Parquet file'.
Such a path is made absolute before pyarrow sees it (the CLI's path flags and arguments, SOURCE, the Python API's
``out``). Real Parquet, FAISS and store; the CLI with the tests' fake engine, the Python API with the same."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

import petal
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir

FAKE = "PETAL_TEST_FAKE_ENGINE"


def test_colon_paths_index_query_and_delete(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c:d").mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["one text", "two texts", "three texts"]}),
                   tmp_path / "c:d" / "x.parquet")
    pq.write_table(pa.table({"id": ["b"]}), tmp_path / "c:d" / "del.parquet")
    model = str(make_fake_model_dir(tmp_path / "model"))
    env = {FAKE: str(tmp_path / "fake.log")}
    result = invoke(["index", "c:d/x.parquet", "--out", "a:b", "-q", "--model", model,
                     "--json-report", "r:1.json"], env=env)
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(tmp_path / "fake.log")) == ["a", "b", "c"]
    assert (tmp_path / "a:b" / "CURRENT").is_file() and (tmp_path / "r:1.json").is_file()
    result = invoke(["index", "c:d/x.parquet", "--out", "./a:b", "-q", "--model", model, "--delete",
                     "c:d/del.parquet"], env=env)
    assert result.exit_code == 0, result.output
    result = invoke(["info", "a:b", "--json"], env=env)
    assert result.exit_code == 0, result.output
    from petal.pipeline.index.search import IndexReader

    assert sorted(IndexReader(tmp_path / "a:b").ids.column("id").to_pylist()) == ["a", "c"]


def test_the_python_api_takes_a_colon_path_for_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"id": [1, 2], "emb": pa.array([[1.0, 0.0], [0.0, 1.0]], pa.list_(pa.float32()))}),
                   tmp_path / "v.parquet")
    report = petal.index("v.parquet", "p:q", vectors_column="emb", quiet=True)
    assert report.status == "success"
    from petal.pipeline.index.search import IndexReader

    assert sorted(IndexReader(tmp_path / "p:q").ids.column("id").to_pylist()) == [1, 2]
