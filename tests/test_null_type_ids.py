"""An id column of Arrow type ``null`` (pandas writes a column whose values are all None so: a shard or partition
whose ids are all missing) holds null ids: each row is skipped and counted (``null_id``), as in an integer or string
column of nulls, and such a shard gives the index no ids, so it never turns an index of integer ids into one of
strings. Before, the shard failed the whole run at preflight (65 'id column 'id' has type null'), text and
``--vectors-column`` runs alike."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.layout import OutputDir
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.invariants import live, rejects_rows


def null_id_shard(path: Path, column: str, values: list) -> Path:
    frame = pd.DataFrame({"id": [None] * len(values), column: values})
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    assert pq.read_schema(path).field("id").type == pa.null()
    return path


def _index(tmp_path: Path, out: Path, *args: str) -> tuple[object, dict]:
    log, report = tmp_path / "fake.log", tmp_path / "report.json"
    result = invoke(["index", *args, "--out", str(out), "-q", "--json-report", str(report),
                     "--model", str(make_fake_model_dir(tmp_path / "model"))],
                    env={"PETAL_TEST_FAKE_ENGINE": str(log)})
    return result, (json.loads(report.read_text()) if report.exists() else {})


def test_a_null_typed_id_column_is_null_ids_counted_and_the_index_keeps_integer_ids(tmp_path):
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["real words", "more words"]}), good)
    empty = null_id_shard(tmp_path / "b.parquet", "text", ["orphan text", "another orphan"])
    out = tmp_path / "out"
    result, report = _index(tmp_path, out, str(good), str(empty))
    assert result.exit_code == 0, result.output
    assert report["rows"]["skipped"] == {"null_id": 2} and report["rows"]["embedded"] == 2
    version = OutputDir(out).version_dir(report["version"])
    assert sorted(rejects_rows(version)) == [(str(empty), 0, "null_id"), (str(empty), 1, "null_id")]
    assert sorted(embedded_ids(tmp_path / "fake.log")) == [1, 2]
    assert sorted(live(out)[0]) == [1, 2]  # integers, not the strings '1', '2'
    # a later run adding a shard of integer ids beside the kept null-id shard: still one kind of id
    more = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": [3], "text": ["third words"]}), more)
    result, report = _index(tmp_path, out, str(more))
    assert result.exit_code == 0, result.output
    assert sorted(live(out)[0]) == [1, 2, 3]
    result, _ = _index(tmp_path, tmp_path / "strict", str(good), str(empty), "--strict")
    assert result.exit_code == 65 and "null_id" in result.output


def test_a_null_typed_id_column_in_a_vectors_run_is_null_ids_counted(tmp_path):
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1, 2], "emb": [[1.0, 0.0], [0.0, 1.0]]}), good)
    empty = null_id_shard(tmp_path / "b.parquet", "emb", [[1.0, 1.0], [0.5, 0.5]])
    out, report = tmp_path / "out", tmp_path / "report.json"
    result = invoke(["index", str(good), str(empty), "--vectors-column", "emb", "--out", str(out), "-q",
                     "--json-report", str(report)])
    assert result.exit_code == 0, result.output
    rows = json.loads(report.read_text())["rows"]
    assert rows["skipped"] == {"null_id": 2}
    assert sorted(live(out)[0]) == [1, 2]
