"""``petal embed --input --id-column`` takes the ids ``petal index`` takes (README): int64. A uint64 Parquet id above
2^63-1 and a ``.jsonl`` integer beyond int64 (either side) are 65 naming the file, column or key, and the row or line,
before the model loads, as ``petal index`` refuses the same file. Before: written out as they were, exit 0
(``parquet_text_batches`` never called ``check_id_range``; ``_jsonl_id`` took any int). The packaged model, real
Parquet, the CLI."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def embed(*args: str):
    return CliRunner().invoke(cli, ["embed", *args])


@pytest.mark.parametrize("statistics", [True, False])  # the footer's max, or the column streamed
@pytest.mark.parametrize("quantize", ["none", "int8"])  # read a window at a time, or whole
def test_a_uint64_parquet_id_above_int64_is_65_as_petal_index_says(tmp_path, minilm_dir, statistics, quantize):
    source = tmp_path / "u64.parquet"
    pq.write_table(pa.table({"text": ["a one", "b two", "c three"],
                             "id": pa.array([1, 2**64 - 1, 3], pa.uint64())}), source, write_statistics=statistics)
    result = embed("--input", str(source), "--id-column", "id", "--quantize", quantize)
    assert result.exit_code == 65, result.output
    said = ("u64.parquet: id column 'id' (uint64) holds 18446744073709551615 at row 1, above the largest id petal "
            "stores (9223372036854775807, int64)")
    assert said in result.stderr and result.stdout == "", result.output
    indexed = CliRunner().invoke(cli, ["index", str(source), "--out", str(tmp_path / "o"), "-q"])
    assert indexed.exit_code == 65 and said in indexed.stderr, indexed.output


def test_uint64_ids_within_int64_are_taken(tmp_path, minilm_dir):
    source = tmp_path / "u64.parquet"
    pq.write_table(pa.table({"text": ["a one", "b two"], "id": pa.array([0, INT64_MAX], pa.uint64())}), source,
                   write_statistics=False)
    result = embed("--input", str(source), "--id-column", "id")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [0, INT64_MAX]


@pytest.mark.parametrize(("value", "said"), [
    (2**63, f"is {2**63}, above the largest id petal stores ({INT64_MAX}, int64)"),
    (INT64_MIN - 1, f"is {INT64_MIN - 1}, below the smallest id petal stores ({INT64_MIN}, int64)"),
    (10**4000, "is 100000000000000000000000... (4001 digits), above the largest id petal stores"),
], ids=["above", "below", "4001 digits"])
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_a_jsonl_id_beyond_int64_is_65_naming_file_line_and_key(tmp_path, minilm_dir, value, said, quantize):
    source = tmp_path / "in.jsonl"
    source.write_text(f'{{"text": "fine", "id": 7}}\n{{"text": "second", "id": {value}}}\n')
    result = embed("--input", str(source), "--id-column", "id", "--quantize", quantize)
    assert result.exit_code == 65, result.output
    assert f"in.jsonl:2: 'id' (--id-column) {said}" in result.stderr and result.stdout == "", result.stderr


def test_jsonl_ids_at_the_int64_bounds_are_taken(tmp_path, minilm_dir):
    source = tmp_path / "in.jsonl"
    source.write_text(f'{{"text": "a", "id": {INT64_MIN}}}\n{{"text": "b", "id": {INT64_MAX}}}\n')
    result = embed("--input", str(source), "--id-column", "id")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [INT64_MIN, INT64_MAX]
