"""The value types of a --vectors-column: floats (16/32/64) and integers (int8 embeddings; before: 65 'has type
list<element: int8>', though petal query --vector-file reads integer arrays) are indexed as float32, their values
exact; a null element is a counted null_element row (was non_finite_vector); raw bytes (binary) are 65 saying to write
a list column. Real Parquet, real FAISS."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader

DIM = 6


def index(source, out) -> tuple[int, str, dict]:
    result = CliRunner().invoke(cli, ["index", str(source), "--out", str(out), "--vectors-column", "emb", "-q",
                                      "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stderr, json.loads(result.stdout) if result.stdout.strip() else {}


@pytest.mark.parametrize("arrow_type", [pa.list_(pa.int8()), pa.large_list(pa.int64()), pa.list_(pa.uint8(), DIM),
                                        pa.list_(pa.int32()), pa.list_(pa.float16()), pa.list_(pa.float64())],
                         ids=str)
def test_integer_and_float_values_are_indexed_exactly(tmp_path, arrow_type):
    values = np.random.default_rng(0).integers(0 if "uint" in str(arrow_type) else -100, 100, (8, DIM))
    rows = [list(map(int, v)) if pa.types.is_integer(arrow_type.value_type) else list(map(float, v)) for v in values]
    rows[5] = [None, *rows[5][1:]]  # a null element: no vector
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(8)], "emb": pa.array(rows, arrow_type)}),
                   tmp_path / "a.parquet")
    rc, stderr, report = index(tmp_path / "a.parquet", tmp_path / "out")
    assert rc == 0, stderr
    assert report["rows"]["skipped"] == {"null_element": 1} and report["index"]["num_vectors"] == 7
    reader = IndexReader(tmp_path / "out")
    assert reader.ids.column("id").to_pylist() == [f"r{i}" for i in range(8) if i != 5]
    np.testing.assert_array_equal(reader.index.reconstruct_n(0, 7), np.delete(values, 5, axis=0).astype(np.float32))


def test_raw_bytes_are_65_saying_to_write_a_list_column(tmp_path):
    vectors = np.random.default_rng(0).standard_normal((4, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(4)], "emb": pa.array([v.tobytes() for v in vectors])}),
                   tmp_path / "a.parquet")
    rc, stderr, _ = index(tmp_path / "a.parquet", tmp_path / "out")
    assert rc == 65 and "has type binary" in stderr and "write the vectors as a list column" in stderr, stderr
