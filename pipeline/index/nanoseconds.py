"""Nanosecond values as Python values without losing their nanoseconds (a kept column's, a shard's metadata).

pyarrow converts ``time64[ns]`` to ``datetime.time``, microseconds only (``12:34:56.123456789`` shown as
``12:34:56.123456``, 1 ns as ``00:00:00``, while ``--where`` matched the nanosecond); without pandas it raises on any
such value, and on a ``timestamp[ns]`` or ``duration[ns]`` one finer than a microsecond (pandas' ``Timestamp`` and
``Timedelta`` keep them, and are kept where pandas is installed). Here: a ``time64[ns]`` is a ``NanoTime``; without
pandas a ``duration[ns]`` a ``NanoDelta`` (``iso_duration`` reads its ``value``, as a ``Timedelta``'s) and a
``timestamp[ns]`` finer than a microsecond Arrow's text of it, as pandas prints it; nested ones too.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

import pyarrow as pa

_NS = 1_000_000_000


class NanoTime(dt.time):
    """A ``time64[ns]`` value: a ``datetime.time`` to the microsecond and ``nanosecond`` (0-999) beyond it, printed
    (``str``, ``isoformat``: JSON) with all nine digits where that is not 0, as pandas' ``Timestamp`` is."""

    nanosecond: int = 0

    def __new__(cls, hour: int = 0, minute: int = 0, second: int = 0, microsecond: int = 0, tzinfo: Any = None, *,
                fold: int = 0, nanosecond: int = 0) -> NanoTime:
        self = super().__new__(cls, hour, minute, second, microsecond, tzinfo, fold=fold)
        self.nanosecond = nanosecond
        return self

    @classmethod
    def from_ns(cls, since_midnight_ns: int) -> NanoTime:
        """The time ``since_midnight_ns`` nanoseconds after midnight (a ``time64[ns]`` value)."""
        micros, nanosecond = divmod(since_midnight_ns, 1000)
        seconds, microsecond = divmod(micros, 1_000_000)
        hour, rest = divmod(seconds, 3600)
        return cls(hour, rest // 60, rest % 60, microsecond, nanosecond=nanosecond)

    @property
    def value(self) -> int:
        """Nanoseconds since midnight (as ``Timestamp.value``)."""
        return ((self.hour * 60 + self.minute) * 60 + self.second) * _NS + self.microsecond * 1000 + self.nanosecond

    def isoformat(self, timespec: str = "auto") -> str:
        """``datetime.time.isoformat``, and ``timespec="nanoseconds"``; ``"auto"`` gives 9 digits where
        ``nanosecond`` is not 0."""
        if timespec == "nanoseconds" or (self.nanosecond and timespec == "auto"):
            return f"{super().isoformat('microseconds')}{self.nanosecond:03d}"
        return super().isoformat(timespec)

    def __str__(self) -> str:
        return self.isoformat()

    def replace(self, *args: Any, nanosecond: int | None = None, **changes: Any) -> NanoTime:
        """``datetime.time.replace``, ``nanosecond`` kept unless given."""
        new = super().replace(*args, **changes)
        new.nanosecond = self.nanosecond if nanosecond is None else nanosecond
        return new

    def __repr__(self) -> str:
        return f"NanoTime({self.isoformat('nanoseconds')})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NanoTime):
            return self.value == other.value
        return not self.nanosecond and super().__eq__(other) is True

    def __hash__(self) -> int:
        return super().__hash__() if not self.nanosecond else hash(self.value)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return NanoTime.from_ns, (self.value,)


class NanoDelta(dt.timedelta):
    """A ``duration[ns]`` value without pandas: a ``timedelta`` to the microsecond and ``value``, its nanoseconds
    (as pandas' ``Timedelta.value``: ``iso_duration`` writes them all)."""

    value: int

    def __new__(cls, ns: int) -> NanoDelta:
        self = super().__new__(cls, microseconds=ns // 1000)
        self.value = ns
        return self

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return NanoDelta, (self.value,)


@functools.cache
def _pyarrow_keeps_nanoseconds() -> bool:
    """pyarrow converts a ``timestamp[ns]`` or ``duration[ns]`` value exactly (to pandas' types: where it can import
    pandas), asked of pyarrow itself."""
    try:
        return getattr(pa.scalar(1, pa.duration("ns")).as_py(), "value", None) == 1
    except ValueError:
        return False


def _converted_here(type_: pa.DataType) -> bool:
    """A leaf type pyarrow's own conversion loses nanoseconds of (or raises on)."""
    if pa.types.is_time64(type_):
        return bool(type_.unit == "ns")
    if pa.types.is_timestamp(type_) or pa.types.is_duration(type_):
        return type_.unit == "ns" and not _pyarrow_keeps_nanoseconds()
    return False


def holds_nanoseconds(type_: pa.DataType) -> bool:
    """``type_`` is, or holds (list, struct, map, dictionary), a type ``nanosecond_values`` converts."""
    if pa.types.is_dictionary(type_):
        return holds_nanoseconds(type_.value_type)
    return _converted_here(type_) or any(holds_nanoseconds(type_.field(i).type) for i in range(type_.num_fields))


def _shadow(type_: pa.DataType) -> pa.DataType:
    """``type_`` with each leaf ``_converted_here`` as int64 (its raw nanoseconds)."""
    if _converted_here(type_):
        return pa.int64()
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_shadow(f.type)) for f in type_])
    if pa.types.is_map(type_):
        return pa.map_(type_.key_field.with_type(_shadow(type_.key_type)),
                       type_.item_field.with_type(_shadow(type_.item_type)))
    if pa.types.is_fixed_size_list(type_):
        return pa.list_(type_.value_field.with_type(_shadow(type_.value_type)), type_.list_size)
    if pa.types.is_large_list(type_):
        return pa.large_list(type_.value_field.with_type(_shadow(type_.value_type)))
    if pa.types.is_list(type_):
        return pa.list_(type_.value_field.with_type(_shadow(type_.value_type)))
    return type_


def _is_view(type_: pa.DataType) -> bool:
    return pa.types.is_list_view(type_) or pa.types.is_large_list_view(type_)


def _holds_view(type_: pa.DataType) -> bool:
    return _is_view(type_) or any(_holds_view(type_.field(i).type) for i in range(type_.num_fields))


def _shadowed(cells: pa.Array) -> pa.Array:
    """``cells`` as ``_shadow`` of its type; a list view kept a list view, its values shadowed.

    NOTE: Arrow casts no list view to another (ArrowNotImplementedError), and its cast of a list view to a list
    drops values where an empty or null cell sits at the offset of a full one (pyarrow 26: offsets [0, 0], sizes
    [1, 0] cast to [[], None]), as Parquet's reader lays them out: the view is rebuilt around its values instead."""
    type_ = cells.type
    if not _holds_view(type_):
        return cells.cast(_shadow(type_))
    mask = cells.is_null() if cells.null_count else None
    if _is_view(type_):
        view = pa.ListViewArray if pa.types.is_list_view(type_) else pa.LargeListViewArray
        return view.from_arrays(_unsliced(cells.offsets), _unsliced(cells.sizes), _shadowed(cells.values), mask=mask)
    if pa.types.is_struct(type_):
        children = [_shadowed(f) for f in cells.flatten()]
        return pa.StructArray.from_arrays(children, fields=[f.with_type(c.type) for f, c in zip(type_, children)],
                                          mask=mask)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        array = pa.ListArray if pa.types.is_list(type_) else pa.LargeListArray
        return array.from_arrays(_unsliced(cells.offsets), _shadowed(cells.values), mask=mask)
    return cells.cast(_shadow(type_))  # a map or fixed-size list around a view: Arrow's cast


def _unsliced(positions: pa.Array) -> pa.Array:
    """A copy of a sliced array's offsets or sizes (Arrow builds no list with a validity map on a slice of them)."""
    return pa.array(positions.to_numpy(), positions.type)


def _restore(value: Any, type_: pa.DataType) -> Any:
    """A value of the ``_shadow`` of ``type_``, as Python, as ``type_``'s with its nanoseconds."""
    if value is None:
        return None
    if _converted_here(type_):
        if pa.types.is_time64(type_):
            return NanoTime.from_ns(value)
        if pa.types.is_duration(type_):
            return NanoDelta(value)
        scalar = pa.scalar(value, type_)  # a timestamp without pandas: exact as datetime, else Arrow's text
        return scalar.as_py() if value % 1000 == 0 else scalar.cast(pa.string()).as_py()
    if pa.types.is_struct(type_):
        return {f.name: _restore(value.get(f.name), f.type) for f in type_}
    if pa.types.is_map(type_):
        return [(_restore(k, type_.key_type), _restore(v, type_.item_type)) for k, v in value]
    if (pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_)
            or _is_view(type_)):
        return [_restore(v, type_.value_type) for v in value]
    return value


def nanosecond_values(cells: pa.Array) -> list[Any]:
    """``cells.to_pylist()`` (``cells``: a type that ``holds_nanoseconds``), its nanoseconds kept; a value that
    cannot be converted otherwise (text that is not UTF-8 inside it, a date past year 9999) ``None``."""
    if pa.types.is_dictionary(cells.type):
        cells = cells.dictionary_decode()
    shadow = _shadowed(cells)
    try:
        values = shadow.to_pylist()
    except (UnicodeDecodeError, OverflowError, ValueError):
        values = []
        for i in range(len(shadow)):
            try:
                values.append(shadow[i].as_py())
            except (UnicodeDecodeError, OverflowError, ValueError):
                values.append(None)
    return [_restore(v, cells.type) for v in values]
