"""A ``--where`` number literal with a decimal point or exponent compares by its exact value with integer and decimal
columns (README: "by value"; ``2001.5`` on an integer column matches nothing). It went through float64 first:
``big = 4611686018427387904.5`` and ``= 4611686018427387905.0`` matched 2^62, ``i8 = 127.0000000000000001``
matched 127, ``dec = 2.5000000000000001`` matched 2.50. Float columns: test_filter_float_literals.py.
Real pyarrow tables through petal's filter (parse_filter, filter_mask)."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from petal.pipeline.index.filters import filter_mask, parse_filter

TABLE = pa.table({
    "big": pa.array([2**62, -(2**62), 0], pa.int64()),
    "zero": pa.array([Decimal("0.00"), Decimal("1.00"), Decimal("2.00")], pa.decimal128(5, 2)),
    "i8": pa.array([127, -128, 0], pa.int8()),
    "dec": pa.array([Decimal("2.50"), Decimal("0.10"), Decimal("-1.00")], pa.decimal128(5, 2)),
    "f": pa.array([2.5, 0.1, -1.0], pa.float64()),
})


@pytest.mark.parametrize(("where", "rows"), [
    ("big = 4611686018427387904.5", []),
    ("big = 4611686018427387905.0", []),
    ("big = 4611686018427387904.0", [0]),
    ("big = 4.611686018427387904e18", [0]),
    ("i8 = 127.0000000000000001", []),
    ("i8 = 126.99999999999999999", []),
    ("i8 = 127.0", [0]),
    ("i8 = 1.27e2", [0]),
    ("dec = 2.5000000000000001", []),
    ("dec = 0.1000000000000000001", []),
    ("dec = 2.5", [0]),
    ("dec = 2.50", [0]),
    ("dec IN (0.1, -1)", [1, 2]),
    ("dec = 1e999", []),
    ("f = 2.5", [0]),
    ("f = 0.1", [1]),
    # exponents past what Decimal holds (a traceback, a 500 on /search) or huge (int() of a million digits)
    ("big = 1e999999999999999999999", []),
    ("dec = 1e-999999999999999999999", []),
    ("f = 1e999999999999999999999", []),
    ("big IN (1e1000000, 4611686018427387904)", [0]),
    ("dec = 1e1000000", []),
    ("i8 = -1.28e2", [1]),
    # more digits than decimal128 holds, or a zero with an exponent: equal to a stored value all the same
    ("dec = 2.5" + "0" * 45, [0]),
    ("dec = -1." + "0" * 88, [2]),
    ("dec = 0.1" + "0" * 60 + "1", []),
    ("big = 0e40", [2]),
    ("big = 0e50", [2]),
    ("i8 = -0.0e99", [2]),
    ("dec = 0e39", []),
    ("dec IN (0e40, 2.5)", [0]),
    ("zero = 0e40", [0]),
    ("zero IN (0e99, 2)", [0, 2]),
    ("big = 4611686018427387904." + "0" * 50, [0]),
    ("i8 = 1.27" + "0" * 40 + "e2", [0]),
    ("dec = 25" + "0" * 50 + "e-51", [0]),
])
def test_a_number_literal_compares_by_its_exact_value(where, rows):
    mask = filter_mask(parse_filter(where), TABLE, TABLE.column_names)
    assert mask.nonzero()[0].tolist() == rows, where


def test_a_literal_is_named_as_written():
    from petal.pipeline.index.filters import FilterError

    table = pa.table({"s": pa.array(["a"], pa.string())})
    with pytest.raises(FilterError, match=r"1e5"):
        filter_mask(parse_filter("s = 1e5"), table, table.column_names)
