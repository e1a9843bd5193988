"""Hive-style partition directories (``year=2024/part-0.parquet``): petal reads the columns inside each file only. A
flag naming a column that is there only as a ``NAME=VALUE`` directory of the shard's path said "no column 'year'; it
has 'id', 'text'", leaving a user to wonder where the column went; the error now says why."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir

HINT = "'year' is only a partition directory of its path (\"year=2024\")"


def hive_table(root: Path) -> Path:
    path = root / "t" / "year=2024" / "month=01" / "part-0.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["one", "two"]}), path)
    return path


@pytest.mark.parametrize("flag", ["--keep-columns", "--text-column", "--id-column", "--vectors-column"])
def test_a_column_only_in_a_partition_directory_is_65_saying_why(tmp_path, flag):
    hive_table(tmp_path)
    model = [] if flag == "--vectors-column" else ["--model", str(make_fake_model_dir(tmp_path / "model"))]
    result = invoke(["index", str(tmp_path / "t"), "--out", str(tmp_path / "out"), "-q", flag, "year", *model],
                    env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.log")})
    assert result.exit_code == 65, result.output
    assert HINT in result.output and "write it into the files" in result.output, result.output


def test_embed_input_and_a_column_missing_elsewhere_keep_their_errors(tmp_path):
    path = hive_table(tmp_path)
    model = str(make_fake_model_dir(tmp_path / "model"))
    embedded = invoke(["embed", "--input", str(path), "--text-column", "year", "--model", model])
    assert embedded.exit_code == 65 and HINT in embedded.output, embedded.output
    other = invoke(["index", str(tmp_path / "t"), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "day",
                    "--model", model], env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.log")})
    assert other.exit_code == 65 and "no column 'day'" in other.output and "partition" not in other.output
