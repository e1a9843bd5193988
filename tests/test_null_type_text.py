"""A text column of Arrow type ``null`` (pandas writes a column whose values are all None so: a shard or partition
with no text at all) holds null texts: each row is skipped and counted (``null_text``), as in a string column of
nulls. Before, such a shard failed the whole run at preflight (65 'text column 'text' has type null'), and
``petal embed --input`` refused it (65) where a string column of nulls is 'nothing to embed' (66)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.layout import OutputDir
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.invariants import live, rejects_rows


def no_text_shard(path: Path) -> Path:
    frame = pd.DataFrame({"id": [3, 4], "text": [None, None]})
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    assert pq.read_schema(path).field("text").type == pa.null()
    return path


def test_a_null_typed_text_column_is_null_texts_counted(tmp_path):
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["real words", "more words"]}), good)
    empty = no_text_shard(tmp_path / "b.parquet")
    log, report = tmp_path / "fake.log", tmp_path / "report.json"
    result = invoke(["index", str(good), str(empty), "--out", str(tmp_path / "out"), "-q", "--json-report",
                     str(report), "--model", str(make_fake_model_dir(tmp_path / "model"))],
                    env={"PETAL_TEST_FAKE_ENGINE": str(log)})
    assert result.exit_code == 0, result.output
    rows = json.loads(report.read_text())["rows"]
    assert rows["skipped"] == {"null_text": 2} and rows["embedded"] == 2 and rows["total"] == 4
    version = OutputDir(tmp_path / "out").version_dir(json.loads(report.read_text())["version"])
    assert sorted(rejects_rows(version)) == [(str(empty), 0, "null_text"), (str(empty), 1, "null_text")]
    assert sorted(embedded_ids(log)) == [1, 2] and sorted(live(tmp_path / "out")[0]) == [1, 2]
    result = invoke(["index", str(good), str(empty), "--out", str(tmp_path / "strict"), "-q", "--strict",
                     "--model", str(make_fake_model_dir(tmp_path / "model"))], env={"PETAL_TEST_FAKE_ENGINE": str(log)})
    assert result.exit_code == 65 and "null_text" in result.output  # --strict refuses them, as any bad row


def test_petal_embed_input_of_a_null_typed_column_has_nothing_to_embed(tmp_path, minilm_dir):
    empty = no_text_shard(tmp_path / "b.parquet")
    result = CliRunner().invoke(cli, ["embed", "--model", str(minilm_dir), "--device", "cpu", "--input", str(empty)])
    assert result.exit_code == 66, result.output
    assert "nothing to embed: 2 skipped (null_text 2" in result.output
