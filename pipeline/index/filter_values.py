"""The literals of a ``--where`` clause as values of the kept column's stored type: one rule for ``petal query``,
the Python API and ``petal serve``'s ``where``.

A literal compares with a column of its own kind, never through a cast that changes what it means:
strings with string (and binary) columns, numbers with integer, floating-point and decimal columns, ``true``
and ``false`` with boolean columns, and a quoted ISO date or time with date, time and timestamp columns. Any
other pair (``topic = 5`` on a string column, ``year = '2001'`` on an integer one, ``flag = 1`` on a boolean
one, an ``IN`` list that mixes them) is a ``FilterError`` naming the column, its stored type and the literal's
type. Numbers compare by value: ``2001.0`` is ``2001``; a number the column's type cannot hold (``2001.5`` or
``70000`` for an ``int16`` column) matches no row, as it equals none. A float column holds a number where the float
nearest it (of its type; in a float64 column, of float32 too) written to the number's own significant digits is the
number (``_floats``): ``0.1`` is float64 0.1 and float32 0.1; ``16777217`` is no float32, ``1e999`` no float.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from petal.pipeline.index.filters import FilterError

if TYPE_CHECKING:
    import pyarrow as pa

_TIME = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?")
# a literal's UTC offset after its time: Z, +01:00, -0530, +01 (a bare date's "-31" is none)
_OFFSET = re.compile(r"\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)? ?(?:Z|[+-]\d{2}(?::?\d{2})?)$")
# a literal's fractional seconds, after its time of day
_FRACTION = re.compile(r"(?<=\d:\d{2}:\d{2})\.(\d+)")
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
        return pa.nulls(0)
    want = {"string": ("string",), "number": ("integer", "number"), "boolean": ("boolean",),
            "temporal": ("string",)}[kind]
    for value in values:
        if literal_kind(value) not in want:
            raise FilterError(_mismatch(column, dtype, kind, value))
    if kind == "number":
        return _numbers(dtype, values)
    if kind == "temporal":
        if pa.types.is_time(dtype):  # NOTE: Arrow casts no string to a time of day: read here
            return _times(column, dtype, values)
        zoned = pa.types.is_timestamp(dtype) and dtype.tz is not None
        naive = [value for value in values if not _OFFSET.search(value.strip())] if zoned else []
        if naive:  # NOTE: Arrow's own message tells of casts and assume_timezone, nothing a filter can do
            raise FilterError(f"--where: column {column!r} is {dtype}; {literal_text(naive[0])} has no UTC offset, "
                              f"which a time with a time zone needs: write one, e.g. '2024-01-31 12:00:00+00:00'")
        texts = [_to_unit(column, dtype, value) for value in values] if pa.types.is_timestamp(dtype) else values
        try:
            return from_python(texts, pa.string()).cast(dtype)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            said = ", ".join(map(literal_text, values))
            raise FilterError(f"--where: column {column!r} is {dtype}; {said} is not a date or time it can hold "
                              f"({exc})") from exc
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or str(dtype) == "binary_view":
        return from_python([str(v).encode() for v in values], dtype)
    return from_python(values, dtype)


def from_python(values: Sequence[Any], dtype: pa.DataType) -> pa.Array:
    """``pa.array(values, type=dtype)`` of a filter's literals (str for string, temporal and decimal columns, bytes,
    int, float, bool), built from buffers: the same values, without importing pandas.

    NOTE: pyarrow's first conversion of Python values (``pa.array`` of a list or an ndarray, ``pa.scalar``,
    ``Array.to_numpy``) asks pandas whether they are one of its own, importing pandas where it is installed (petal
    does not need it): ~0.1-0.2 s of a one-shot ``petal query --where`` and ~34k more objects in its process.
    Strings, bytes and decimals go through a UTF-8 array and Arrow's own cast (a decimal the type cannot hold:
    ``ArrowInvalid``, as ``pa.array`` raised; a lone surrogate: ``UnicodeEncodeError``).
    """
    import numpy as np
    import pyarrow as pa

    t = pa.types
    if t.is_null(dtype):
        return pa.nulls(len(values))
    if t.is_boolean(dtype):
        bits = np.packbits(np.array([bool(v) for v in values], dtype=bool), bitorder="little")
        return pa.Array.from_buffers(dtype, len(values), [None, pa.py_buffer(bits.tobytes())])
    if t.is_integer(dtype) or t.is_floating(dtype):
        numbers = np.array(values, dtype=np.dtype(dtype.to_pandas_dtype()))
        return pa.Array.from_buffers(dtype, len(values), [None, pa.py_buffer(numbers.tobytes())])
    if t.is_decimal(dtype):
        return _bytes_array([str(v).encode() for v in values], pa.string()).cast(dtype)
    if t.is_binary(dtype) or t.is_large_binary(dtype) or str(dtype) == "binary_view":
        return _bytes_array([bytes(v) for v in values], pa.binary()).cast(dtype)
    strings = _bytes_array([str(v).encode() for v in values], pa.string())
    return strings if strings.type == dtype else strings.cast(dtype)


def _bytes_array(items: list[bytes], dtype: pa.DataType) -> pa.Array:
    """A ``string`` or ``binary`` array of ``items`` (32-bit offsets)."""
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(items) + 1, dtype=np.int32)
    np.cumsum([len(item) for item in items], out=offsets[1:])
    return pa.Array.from_buffers(dtype, len(items), [None, pa.py_buffer(offsets.tobytes()),
                                                     pa.py_buffer(b"".join(items))])


def _times(column: str, dtype: pa.DataType, values: tuple[Any, ...]) -> pa.Array:
    """ISO times of day (``HH:MM``, ``HH:MM:SS``, ``HH:MM:SS.fraction``, up to nanoseconds) as ``dtype`` (time32/64
    of ``s``, ``ms``, ``us`` or ``ns``); one it cannot hold (a bad time, or finer than its unit, as for timestamps) is a
    ``FilterError``."""
    import pyarrow as pa

    unit_ns = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[dtype.unit]
    counts = []
    for value in values:
        ns = _time_ns(value)
        if ns is None:
            raise FilterError(f"--where: column {column!r} is {dtype}; {literal_text(value)} is not a time of day it "
                              "can hold: write it as '13:45', '13:45:30' or '13:45:30.25'")
        if ns % unit_ns:
            raise FilterError(f"--where: column {column!r} is {dtype}; {literal_text(value)} is finer than the "
                              f"column's unit ({dtype.unit}): no stored time equals it")
        counts.append(ns // unit_ns)
    return from_python(counts, pa.int32() if dtype.bit_width == 32 else pa.int64()).cast(dtype)


def _to_unit(column: str, dtype: pa.DataType, text: str) -> str:
    """A timestamp literal with no more fractional digits than ``dtype``'s unit holds (the extra ones zeros, dropped);
    one with a nonzero digit past it is a ``FilterError``, as for a time of day (``_times``).

    NOTE: Arrow's cast refused both: '2024-01-31 12:00:00.500000' on timestamp[ms] (the same instant as '.5') and
    '...00.0000005' on timestamp[us] were 'not a date or time it can hold (Failed to parse string ...)'."""
    found = _FRACTION.search(text)
    digits = {"s": 0, "ms": 3, "us": 6, "ns": 9}[dtype.unit]
    if found is None or len(found.group(1)) <= digits:
        return text
    if found.group(1)[digits:].strip("0"):
        raise FilterError(f"--where: column {column!r} is {dtype}; {literal_text(text)} is finer than the column's "
                          f"unit ({dtype.unit}): no stored time equals it")
    kept = found.group(1)[:digits]
    return text[:found.start()] + (f".{kept}" if kept else "") + text[found.end():]


def _time_ns(text: str) -> int | None:
    """Nanoseconds since midnight of an ISO time of day (``None``: not one)."""
    found = _TIME.fullmatch(text.strip())
    if found is None:
        return None
    hours, minutes, seconds = (int(found.group(i) or 0) for i in (1, 2, 3))
    if hours > 23 or minutes > 59 or seconds > 59:
        return None
    return ((hours * 60 + minutes) * 60 + seconds) * 10**9 + int((found.group(4) or "").ljust(9, "0"))


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


def _exact(value: Any) -> Decimal:
    """A number literal's exact value: its own digits where it has a decimal point or exponent (``ExactNumber``),
    without trailing zeros. NOTE: reduced, exactly (a precision of its own digit count: nothing rounds): ``3.000...``
    with 45 zeros had more digits than decimal128 holds (Arrow refused it: it matched no row), and a zero's exponent
    read as its magnitude (``0e40`` past every bound: ``i = 0e40`` matched no row)."""
    exact = getattr(value, "exact", None)
    exact = exact if isinstance(exact, Decimal) else Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    if not exact.is_finite():
        return exact
    if exact.is_zero():
        return Decimal(0)
    try:
        return exact.normalize(Context(prec=len(exact.as_tuple().digits), Emax=MAX_EMAX, Emin=MIN_EMIN))
    except ArithmeticError:  # NOTE: an exponent past what Decimal holds: kept as it is (past every bound below)
        return exact


def _numbers(dtype: pa.DataType, values: tuple[Any, ...]) -> pa.Array:
    """The numbers ``dtype`` can hold, as ``dtype``; the others equal no stored value and are left out."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_floating(dtype):
        return from_python([f for v in values for f in _floats(_exact(v), dtype.bit_width)], dtype)
    if pa.types.is_integer(dtype):
        info = np.iinfo(dtype.to_pandas_dtype())
        # NOTE: the magnitude first: int() of 1e1000000 built a million-digit int (24 s on the event loop)
        whole = [int(exact) for v in values if (exact := _exact(v)).is_finite() and exact.adjusted() < 40
                 and exact == exact.to_integral_value()]
        return from_python([v for v in whole if info.min <= v <= info.max], dtype)
    kept = []  # decimal: exact, from the literal's own digits
    for v in values:
        exact = _exact(v)
        if not exact.is_finite() or not -80 < exact.adjusted() < 80:  # NOTE: past decimal256's 76 digits: none
            continue
        try:
            kept.append(from_python([exact], dtype))
        except (InvalidOperation, pa.ArrowInvalid):  # more digits than the column's scale or precision holds
            continue
    return pa.concat_arrays(kept) if kept else from_python([], dtype)


# NOTE: float16 as numpy's, not Arrow's (from_python builds a float16 array from these bits)
_FLOAT_TYPES = {16: "float16", 32: "float32", 64: "float64"}


def _floats(exact: Decimal, bits: int) -> list[float]:
    """The floats of a column of ``bits`` width that ``exact`` (a literal's value) equals: the float of that width
    nearest it, and in a float64 column the float32 nearest it too (a float32 widened to float64 keeps its value), each
    only where the literal is that float written to the literal's own significant digits (``0.1`` is float64 0.1 and
    float32 0.1, ``3.4e38`` float32's 3.4028235e38).

    NOTE: the literal went through float64 and an unchecked cast: ``f64 = 1e999`` matched inf, ``f32 = 1e-50`` 0.0,
    ``f32 = 16777217`` 16777216 and ``f64 = 9007199254740993`` 2^53: a number read as a float it is not, where the
    literal gives more digits than the float has (or overflows, or underflows to zero), equals no stored value."""
    if not exact.is_finite():
        return []
    if exact.is_zero():
        return [0.0]
    if not -330 < exact.adjusted() < 310:  # NOTE: past every float64: inf or zero (a Fraction of a huge power)
        return []
    digits = Context(prec=len(exact.as_tuple().digits), Emax=MAX_EMAX, Emin=MIN_EMIN)
    found = []
    for width in (bits, 32) if bits == 64 else (bits,):
        near = _nearest(exact, width)
        if near is not None and near not in found and digits.plus(Decimal(near)) == exact:
            found.append(near)
    return found


def _nearest(exact: Decimal, bits: int) -> float | None:
    """The float of ``bits`` width nearest ``exact`` (ties to even), as a Python float; ``None`` where it rounds to
    infinity. NOTE: float64 then the narrower float rounds twice, which is not always the nearest."""
    from fractions import Fraction

    import numpy as np

    wide = float(exact)  # NOTE: correctly rounded (Decimal's float reads its text)
    if bits == 64:
        return wide if math.isfinite(wide) else None
    kind = np.dtype(_FLOAT_TYPES[bits]).type
    top = np.finfo(kind).max
    value = Fraction(exact)
    if abs(value) >= Fraction(float(top)) + (Fraction(float(top)) - Fraction(float(np.nextafter(top, kind(0))))) / 2:
        return None  # NOTE: half a step past the largest rounds to infinity (its last bit is odd)
    with np.errstate(over="ignore"):
        near = kind(wide)
        if not np.isfinite(near):
            near = kind(math.copysign(float(top), wide))
        steps = [near, np.nextafter(near, kind(np.inf)), np.nextafter(near, kind(-np.inf))]
    best = min((c for c in steps if np.isfinite(c)),
               key=lambda c: (abs(Fraction(float(c)) - value), int(c.view(f"uint{bits}")) & 1))
    return float(best)
