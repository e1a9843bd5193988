"""A ``--keep-columns`` column that is an integer in one shard and a decimal in another is stored as a decimal that
holds every value of both, or refused before any work where no decimal does.

Before: Arrow widened int64 and decimal128(5, 2) to decimal128(20, 2) (int16: decimal128(6, 2), int32: (11, 2), uint64:
(21, 2)), one digit too few, and preflight did not check an integer against a decimal: once every shard was embedded,
65 'a.parquet holds 1 as int64, which decimal128(20, 2) ... cannot hold', naming a value that fits. Real Parquet,
``petal index --vectors-column`` (no model), the CLI, FAISS and ``--where`` through the Python API."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests.test_keep_columns_values_fit import index, nothing_done, shard

INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


def _stored(tmp_path) -> pa.ChunkedArray:
    version = (tmp_path / "out" / "CURRENT").read_text().strip()
    return pq.read_table(tmp_path / "out" / "versions" / version / "ids.parquet").sort_by("id").column("m")


def _matches(tmp_path, where: str) -> list[int]:
    reader = IndexReader(tmp_path / "out")
    (hits,) = reader.search(np.ones((1, 2), np.float32), 20, where=where)
    return sorted(h.id for h in hits)


@pytest.mark.parametrize("decimal_type, decimals", [
    (pa.decimal128(5, 2), ["123.45", "-0.01"]),
    (pa.decimal128(38, 10), ["1234567890123456789012345678.0123456789", "-0.5"]),
], ids=["decimal(5,2)", "decimal(38,10)"])
@pytest.mark.parametrize("int_type", INTS, ids=str)
@pytest.mark.parametrize("int_first", [True, False], ids=["int-first", "decimal-first"])
def test_an_integer_beside_a_decimal_is_stored_as_a_decimal_holding_both(tmp_path, int_type, decimal_type, decimals,
                                                                         int_first):
    info = np.iinfo(int_type.to_pandas_dtype())
    ints = [int(info.min), int(info.max), 1]
    (tmp_path / "src").mkdir()
    shard(tmp_path / "src" / ("a.parquet" if int_first else "b.parquet"), 0, pa.array(ints, int_type))
    shard(tmp_path / "src" / ("b.parquet" if int_first else "a.parquet"), 10,
          pa.array([Decimal(d) for d in decimals], decimal_type))
    result = index(tmp_path, tmp_path / "src", vectors=True)
    assert result.exit_code == 0, result.output
    stored = _stored(tmp_path)
    assert pa.types.is_decimal(stored.type), stored.type
    assert stored.type.scale == decimal_type.scale
    assert stored.to_pylist() == [Decimal(i) for i in ints] + [Decimal(d) for d in decimals]
    assert _matches(tmp_path, f"m = {info.max}") == [1]
    assert _matches(tmp_path, f"m IN ({info.min}, {decimals[0]})") == [0, 10]


def test_an_int64_beside_a_decimal_of_38_digits_is_stored_as_decimal256(tmp_path):
    big = Decimal("123456789012345678." + "1" * 20)
    shard(tmp_path / "src" / "a.parquet", 0, pa.array([2**63 - 1, -(2**63)], pa.int64()))
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([big], pa.decimal128(38, 20)))
    result = index(tmp_path, tmp_path / "src", vectors=True)
    assert result.exit_code == 0, result.output
    stored = _stored(tmp_path)
    assert stored.type == pa.decimal256(39, 20)
    assert stored.to_pylist() == [Decimal(2**63 - 1), Decimal(-(2**63)), big]
    assert _matches(tmp_path, f"m = {big}") == [10]


def test_a_list_of_integers_beside_a_list_of_decimals_is_stored_as_decimals_holding_both(tmp_path):
    shard(tmp_path / "src" / "a.parquet", 0, pa.array([[2**63 - 1, 1]], pa.list_(pa.int64())))
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([[Decimal("1.25")]], pa.list_(pa.decimal128(5, 2))))
    result = index(tmp_path, tmp_path / "src", vectors=True)
    assert result.exit_code == 0, result.output
    stored = _stored(tmp_path)
    assert stored.type == pa.list_(pa.decimal128(21, 2))
    assert stored.to_pylist() == [[Decimal(2**63 - 1), Decimal(1)], [Decimal("1.25")]]


@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
def test_an_integer_beside_a_decimal_no_decimal_holds_with_it_is_refused_before_any_work(tmp_path, vectors):
    a = shard(tmp_path / "src" / "a.parquet", 0, pa.array([1], pa.int64()))
    b = shard(tmp_path / "src" / "b.parquet", 10, pa.array([Decimal("0." + "1" * 70)], pa.decimal256(76, 70)))
    result = index(tmp_path, tmp_path / "src", vectors=vectors)
    assert result.exit_code == 65, result.output
    assert f"--keep-columns 'm': {b} has it as decimal256(76, 70), {a} as int64" in result.output, result.output
    assert nothing_done(tmp_path) and not (tmp_path / "out" / "CURRENT").exists()


@pytest.mark.parametrize("int_type", INTS, ids=str)
def test_preflight_checks_an_integer_against_a_decimal_too_narrow_for_it(int_type):
    """``may_not_fit`` had no integer-to-decimal case: a decimal too narrow for an integer type was never checked
    before the embedding."""
    from petal.pipeline.store.kept_values import may_not_fit

    info = np.iinfo(int_type.to_pandas_dtype())
    digits = len(str(max(int(info.max), -int(info.min))))
    assert not may_not_fit(int_type, pa.decimal128(digits + 2, 2))
    assert may_not_fit(int_type, pa.decimal128(digits + 1, 2))
