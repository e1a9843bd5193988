"""The literals of a ``--where`` clause as values of the kept column's stored type: one rule for ``petal query``,
the Python API and ``petal serve``'s ``where``.

A literal compares with a column of its own kind, never through a cast that changes what it means:
strings with string (and binary) columns, numbers with integer, floating-point and decimal columns, ``true``
and ``false`` with boolean columns, and a quoted ISO date or time with date, time and timestamp columns. Any
other pair (``topic = 5`` on a string column, ``year = '2001'`` on an integer one, ``flag = 1`` on a boolean
one, an ``IN`` list that mixes them) is a ``FilterError`` naming the column, its stored type and the literal's
type. Numbers compare by value: ``2001.0`` is ``2001``; a number the column's type cannot hold (``2001.5`` or
``70000`` for an ``int16`` column) matches no row, as it equals none.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from petal.pipeline.index.filters import FilterError

if TYPE_CHECKING:
    import pyarrow as pa

HINTS = {"number": "give a number (unquoted)", "boolean": "write true or false",
         "temporal": "give a quoted date or time, e.g. '2024-01-31' or '2024-01-31 12:00:00'"}


def literal_kind(value: Any) -> str:
    """``string``, ``integer``, ``number`` (a decimal point or exponent) or ``boolean``."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "number" if isinstance(value, float) else "string"


def literal_text(value: Any) -> str:
    """``value`` as written in a filter: ``'it''s'``, ``5``, ``2.5``, ``true``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def column_kind(dtype: pa.DataType) -> str | None:
    """What literals a column of ``dtype`` takes (``None``: none; a dictionary column: its values' type's)."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(dtype):
        return column_kind(dtype.value_type)
    if t.is_string(dtype) or t.is_large_string(dtype) or t.is_binary(dtype) or t.is_large_binary(dtype) \
            or str(dtype) in ("string_view", "binary_view"):
        return "string"
    if t.is_integer(dtype) or t.is_floating(dtype) or t.is_decimal(dtype):
        return "number"
    if t.is_boolean(dtype):
        return "boolean"
    if t.is_date(dtype) or t.is_timestamp(dtype) or t.is_time(dtype):
        return "temporal"
    if t.is_null(dtype):
        return "null"
    return None


def value_set(column: str, dtype: pa.DataType, values: tuple[Any, ...]) -> pa.Array:
    """``values`` as an array of ``dtype``'s values (a dictionary column: of its values' type), for ``is_in``."""
    import pyarrow as pa

    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    kind = column_kind(dtype)
    if kind is None:
        raise FilterError(f"--where: column {column!r} is {dtype}: only string, number, boolean, date and time "
                          "columns can be filtered")
    if kind == "null":  # every stored value is null: no literal equals one
        return pa.array([], type=pa.null())
    want = {"string": ("string",), "number": ("integer", "number"), "boolean": ("boolean",),
            "temporal": ("string",)}[kind]
    for value in values:
        if literal_kind(value) not in want:
            raise FilterError(_mismatch(column, dtype, kind, value))
    if kind == "number":
        return _numbers(dtype, values)
    if kind == "temporal":
        try:
            return pa.array(list(values), type=pa.string()).cast(dtype)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            said = ", ".join(map(literal_text, values))
            raise FilterError(f"--where: column {column!r} is {dtype}; {said} is not a date or time it can hold "
                              f"({exc})") from exc
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or str(dtype) == "binary_view":
        return pa.array([str(v).encode() for v in values], type=dtype)
    return pa.array(list(values), type=dtype)


def _mismatch(column: str, dtype: pa.DataType, kind: str, value: Any) -> str:
    got = {"string": "a string", "integer": "an integer", "number": "a number",
           "boolean": "a boolean"}[literal_kind(value)]
    if kind == "string":
        hint = f"write {literal_text(str(value).lower() if isinstance(value, bool) else str(value))} to compare " \
               "it as text"
    elif kind == "number" and isinstance(value, str) and _parses_as_number(value):
        hint = f"write it unquoted ({value.strip()}) to compare it as a number"
    else:
        hint = HINTS[kind]
    return f"--where: column {column!r} is {dtype}; {literal_text(value)} is {got}: {hint}"


def _parses_as_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _numbers(dtype: pa.DataType, values: tuple[Any, ...]) -> pa.Array:
    """The numbers ``dtype`` can hold, as ``dtype``; the others equal no stored value and are left out."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_floating(dtype):
        return pa.array([float(v) for v in values], type=pa.float64()).cast(dtype, safe=False)
    if pa.types.is_integer(dtype):
        info = np.iinfo(dtype.to_pandas_dtype())
        whole = [int(v) for v in values if not isinstance(v, float) or v.is_integer()]
        return pa.array([v for v in whole if info.min <= v <= info.max], type=dtype)
    kept = []  # decimal: exact, from the literal's own digits
    for v in values:
        try:
            kept.append(pa.array([Decimal(repr(v))]).cast(dtype))
        except (InvalidOperation, pa.ArrowInvalid):  # more digits than the column's scale or precision holds
            continue
    return pa.concat_arrays(kept) if kept else pa.array([], type=dtype)
