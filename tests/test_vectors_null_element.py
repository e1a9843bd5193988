"""A ``--vectors-column`` vector holding a null value (``[1.0, null, 3.0]``) is a counted ``null_element`` row: in
the report, ``rejects.parquet``, ``--strict``'s message and the Python API's report. Before, Arrow's conversion made
the null NaN and the row was counted as ``non_finite_vector``, which the README defines as NaN or inf. Every list
type (list, large_list, fixed_size_list; float16/32/64 and integer values) and a column written in several chunks and
row groups. Real Parquet, real FAISS."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli

DIM = 4
ROWS = 10
NULL_ROWS = (2, 7)  # one null value; every value null (still a vector of DIM values: not a null_vector)
NAN_ROW = 5  # NaN and a null: the null is said


def _rows(integers: bool) -> list[list | None]:
    values = np.random.default_rng(0).integers(-50, 50, (ROWS, DIM))
    rows: list[list | None] = [list(map(int if integers else float, v)) for v in values]
    rows[NULL_ROWS[0]] = [1, None, 3, 4]
    rows[NULL_ROWS[1]] = [None] * DIM
    if not integers:
        rows[NAN_ROW] = [float("nan"), None, 1.0, 2.0]
        rows[8] = [float("nan"), 1.0, 1.0, 2.0]  # NaN alone: still non_finite_vector
    return rows


def _expected(integers: bool) -> dict[str, int]:
    return {"null_element": 2} if integers else {"null_element": 3, "non_finite_vector": 1}


def _write(path: Path, arrow_type: pa.DataType, chunks: int = 1, row_group_size: int | None = None) -> list:
    rows = _rows(pa.types.is_integer(arrow_type.value_type))
    cut = [round(i * ROWS / chunks) for i in range(chunks + 1)]
    column = pa.chunked_array([pa.array(rows[a:b], arrow_type) for a, b in itertools.pairwise(cut)], arrow_type)
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(ROWS)], "emb": column}), path,
                   row_group_size=row_group_size)
    return rows


def _index(source: Path, out: Path, *flags: str) -> tuple[int, str, dict]:
    result = CliRunner().invoke(cli, ["index", str(source), "--out", str(out), "--vectors-column", "emb", "-q",
                                      "--json", *flags])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stderr, json.loads(result.stdout) if result.stdout.strip() else {}


@pytest.mark.parametrize("arrow_type", [pa.list_(pa.float32()), pa.large_list(pa.float64()), pa.list_(pa.float16()),
                                        pa.list_(pa.int8()), pa.large_list(pa.int64()), pa.list_(pa.float32(), DIM),
                                        pa.list_(pa.int8(), DIM)], ids=str)
def test_a_null_value_inside_a_vector_is_a_null_element_row(tmp_path: Path, arrow_type: pa.DataType) -> None:
    rows = _write(tmp_path / "a.parquet", arrow_type)
    integers = pa.types.is_integer(arrow_type.value_type)
    rc, stderr, report = _index(tmp_path / "a.parquet", tmp_path / "out")
    assert rc == 0, stderr
    assert report["rows"]["skipped"] == _expected(integers), report["rows"]
    version = tmp_path / "out" / "versions" / (tmp_path / "out" / "CURRENT").read_text().strip()
    rejects = pq.read_table(version / "rejects.parquet").to_pylist()
    assert [(r["row"], r["reason"]) for r in rejects if r["reason"] == "null_element"] == sorted(
        (row, "null_element") for row in (*NULL_ROWS, *(() if integers else (NAN_ROW,))))
    assert report["index"]["num_vectors"] == sum(row is not None and None not in row and
                                                 not any(isinstance(v, float) and np.isnan(v) for v in row)
                                                 for row in rows)


def test_null_elements_across_chunks_and_row_groups_and_strict(tmp_path: Path) -> None:
    """A column of three chunks in row groups of 3 rows (batches that start mid-vector-list), then --strict,
    --max-bad-rows and the Python API: each counts the rows by the same reasons."""
    _write(tmp_path / "a.parquet", pa.list_(pa.float32()), chunks=3, row_group_size=3)
    rc, stderr, report = _index(tmp_path / "a.parquet", tmp_path / "out")
    assert rc == 0 and report["rows"]["skipped"] == _expected(False), (stderr, report.get("rows"))

    rc, stderr, report = _index(tmp_path / "a.parquet", tmp_path / "strict", "--strict")
    assert rc == 65 and "4 bad rows with --strict: non_finite_vector 1, null_element 3;" in stderr, stderr
    assert "first: " in stderr and "row 2 (null_element)" in stderr, stderr
    refused = pq.read_table(tmp_path / "strict" / "rejects.parquet").to_pylist()
    assert sorted(r["reason"] for r in refused) == ["non_finite_vector"] + ["null_element"] * 3

    rc, stderr, _ = _index(tmp_path / "a.parquet", tmp_path / "budget", "--max-bad-rows", "2")
    assert rc == 65 and "null_element" in stderr, stderr

    done = petal.index(tmp_path / "a.parquet", tmp_path / "api", vectors_column="emb", quiet=True)
    assert done.rows["skipped"] == _expected(False), done.rows
