"""A kept column's values against the one type it is stored as (``kept_type``), before any work.

Types that widen do not always hold every value of the narrower one: an int64 above 2^53 as float64 (float32:
2^24), a uint64 above 2^63 - 1 as int64, a time in seconds past year 2262 in nanoseconds. Such a shard is refused
before any embedding (65 naming the column, the value, where it is, every shard's type and the type stored): from
its footer's statistics (each row group's min and max) where they are complete, else its column streamed as every
source read (``stream_batches``: an OS read error retried then 74, a corrupt page 65), as ``check_id_range`` reads
a uint64 id column.

NOTE: the version's columns were cast to the stored type only once every shard was embedded: 65 'a value does not
fit the type the column is stored as (Integer value 9007199254740993 not in range ...)', naming neither the type,
the shard that forced it nor the row.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.exact_columns import field_leaves, iter_columns
from petal.pipeline.ingest.int96 import open_parquet
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo, plain_type, read_retrying, stream_batches
from petal.pipeline.ingest.remote import RemotePath
from petal.pipeline.reliability.errors import BadInputError, quote_path
from petal.pipeline.reliability.faults import fault

_MANTISSA = {16: 11, 32: 24, 64: 53}  # a float of each width holds every integer of at most this many bits
_DIGITS = {16: 3, 32: 6, 64: 15}  # ... and prints back (shortest repr) every decimal of at most this many digits
_UNITS = {"s": 0, "ms": 1, "us": 2, "ns": 3}


@dataclass(frozen=True)
class KeptSource:
    """One shard's kept column: the path said, its type, and how to read it (a named shard, or a kept shard's
    side file or file, local)."""

    path: str
    type: pa.DataType
    shard: ShardInfo | None = None
    file: Path | None = None
    live_type: pa.DataType | None = None  # a kept shard's: the type the live version stores its values as

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the file read (``ReadStats.values_fit``)."""
        return ("file", str(self.file)) if self.file is not None else ("shard", str(self.shard and self.shard.abs_path))


def _int_bits(t: pa.DataType) -> tuple[int, bool]:
    return t.bit_width, pa.types.is_signed_integer(t)


def may_not_fit(source: pa.DataType, stored: pa.DataType) -> bool:
    """Some value of type ``source`` cannot be cast to ``stored`` (a widening ``kept_type`` chose) exactly."""
    if source == stored:
        return False
    if pa.types.is_integer(source) and pa.types.is_floating(stored):
        bits, signed = _int_bits(source)
        return bits - signed > _MANTISSA[stored.bit_width]
    if pa.types.is_integer(source) and pa.types.is_integer(stored):
        (bits, signed), (to_bits, to_signed) = _int_bits(source), _int_bits(stored)
        return (signed and not to_signed) or bits - signed > to_bits - to_signed
    if pa.types.is_decimal(source) and pa.types.is_floating(stored):
        return bool(source.precision > _DIGITS[stored.bit_width])
    if pa.types.is_integer(source) and pa.types.is_decimal(stored):  # the digits of its largest magnitude
        bits, signed = _int_bits(source)
        return len(str(2 ** (bits - signed))) > stored.precision - stored.scale
    temporal = (pa.types.is_timestamp, pa.types.is_duration, pa.types.is_time)
    if any(is_kind(source) and is_kind(stored) for is_kind in temporal):
        return _UNITS[stored.unit] > _UNITS[source.unit]
    if pa.types.is_struct(source) and pa.types.is_struct(stored):  # by name: a field the source lacks is nulls
        return any(may_not_fit(f.type, stored.field(f.name).type) for f in source
                   if stored.get_field_index(f.name) >= 0)
    if source.num_fields and source.num_fields == stored.num_fields:  # lists, maps: by their values
        return any(may_not_fit(source.field(i).type, stored.field(i).type) for i in range(source.num_fields))
    return False


def first_misfit(values: pa.Array, stored: pa.DataType) -> tuple[int, Any] | None:
    """The first position of ``values`` whose value ``stored`` cannot hold, and that value; ``None`` when all fit."""
    # NOTE: a nested part is taken (a copy): a slice of a list keeps all its values, which a cast casts too
    nested = bool(values.type.num_fields)
    if nested:
        values = values.take(pa.array(range(len(values)), pa.int64()))
    if _rounds_decimals(values.type, stored):
        return _first_rounded(values, stored)
    try:
        values.cast(stored)
        return None
    except pa.ArrowInvalid:  # NOTE: not ArrowNotImplementedError: a cast Arrow lacks says nothing of a value
        pass
    lo, hi = 0, len(values)  # bisect on casts of parts: log2(n) casts, no Python loop over the values
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            (values.take(pa.array(range(lo, mid), pa.int64())) if nested else values.slice(lo, mid - lo)).cast(stored)
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    return lo, values[lo].as_py()


def _rounds_decimals(source: pa.DataType, stored: pa.DataType) -> bool:
    """``source`` is, or holds, a decimal that ``stored`` holds as a float that may not print back as it."""
    pairs = leaf_types(source, stored)
    return pairs is not None and any(pa.types.is_decimal(s) and may_not_fit(s, t) for s, t in pairs)


def cast_kept(values: pa.Array | pa.ChunkedArray, stored: pa.DataType) -> Any:
    """``values`` cast to the type their column is stored as; a decimal stored as a float is the float nearest it.

    NOTE: Arrow's cast of a decimal to a float is not correctly rounded (1545.60 became 1545.6000000000001, 0.10 as
    float32 0.0999999940395...): such a decimal goes through its text, which Arrow parses correctly rounded."""
    via = _decimals_as_text(values.type, stored)
    return (values if via is None else values.cast(via)).cast(stored)


def cast_kept_table(part: pa.Table, schema: pa.Schema) -> pa.Table:
    """``part`` cast to ``schema`` column by column (``cast_kept``)."""
    if all(_decimals_as_text(part.schema.field(f.name).type, f.type) is None for f in schema):
        return part.cast(schema)
    return pa.table([cast_kept(part.column(f.name), f.type) for f in schema], schema=schema)


def _decimals_as_text(source: pa.DataType, stored: pa.DataType) -> pa.DataType | None:
    """``source`` with each decimal that ``stored`` holds as a float made a string; ``None`` where none is."""
    if pa.types.is_decimal(source):
        return pa.string() if pa.types.is_floating(stored) else None
    if pa.types.is_struct(source) and pa.types.is_struct(stored):  # by name, as the cast pairs them
        fields = [f.with_type(_decimals_as_text(f.type, stored.field(at).type) or f.type)
                  if (at := stored.get_field_index(f.name)) >= 0 else f for f in source]
        return pa.struct(fields) if fields != list(source) else None
    if pa.types.is_map(source) and pa.types.is_map(stored):
        keys = _decimals_as_text(source.key_type, stored.key_type)
        items = _decimals_as_text(source.item_type, stored.item_type)
        if keys is None and items is None:
            return None
        return pa.map_(source.key_field.with_type(keys or source.key_type),
                       source.item_field.with_type(items or source.item_type), source.keys_sorted)
    if _is_list(source) and _is_list(stored):
        inner = _decimals_as_text(source.value_type, stored.value_type)
        if inner is None:
            return None
        value_field = source.value_field.with_type(inner)
        if pa.types.is_fixed_size_list(source):
            return pa.list_(value_field, source.list_size)
        makes = {pa.types.is_list: pa.list_, pa.types.is_large_list: pa.large_list,
                 pa.types.is_list_view: pa.list_view, pa.types.is_large_list_view: pa.large_list_view}
        return next(make(value_field) for is_kind, make in makes.items() if is_kind(source))
    return None


def _first_rounded(values: pa.Array, stored: pa.DataType) -> tuple[int, Any] | None:
    """``first_misfit`` of values holding decimals stored as floats: a decimal fits when the float nearest it prints
    back as it (shortest repr at the float's width: ``Decimal(repr(float(v))) == v`` for float64).

    NOTE: a float rounds, never raises: 123456789012345678.91 was stored as 1.2345678901234568e+17 at exit 0."""
    as_float = cast_kept(values, stored).to_pylist()
    for i, (value, cast) in enumerate(zip(values.to_pylist(), as_float)):
        if not _prints_back(value, cast, stored):
            return i, value
    return None


def _prints_back(value: Any, cast: Any, stored: pa.DataType) -> bool:
    if isinstance(value, Decimal):
        return cast is not None and math.isfinite(cast) and Decimal(_shortest(cast, stored)) == value
    if isinstance(value, dict):  # a struct: each field against the type it is stored as
        return all(_prints_back(v, cast.get(k), stored.field(k).type) for k, v in value.items()
                   if stored.get_field_index(k) >= 0)
    if isinstance(value, list) and pa.types.is_map(stored):  # a map's (key, item) pairs
        return all(_prints_back(k, ck, stored.key_type) and _prints_back(v, cv, stored.item_type)
                   for (k, v), (ck, cv) in zip(value, cast))
    if isinstance(value, list):
        return all(_prints_back(v, c, stored.value_type) for v, c in zip(value, cast))
    return True


def _shortest(value: float, stored: pa.DataType) -> str:
    """The fewest digits that read back as ``value`` at ``stored``'s width (a float32's as float32)."""
    if pa.types.is_float64(stored):
        return repr(value)
    import numpy as np

    return str(np.float32(value) if pa.types.is_float32(stored) else np.float16(value))


def check_kept_values(name: str, stored: pa.DataType, sources: Sequence[KeptSource], read: ReadConfig,
                      stats: ReadStats | None = None) -> None:
    """65 (``BadInputError``) when one of ``sources`` holds a ``name`` value that ``stored`` cannot hold.

    NOTE: a kept shard whose values the live version already stores as ``stored`` (``live_type``), and a file this run
    found to fit ``stored`` before (``stats.values_fit``: preflight, then under the lock), are not read again: a
    nothing-to-do rerun read a nested column's values twice (~0.17 s of its 0.24 s for 200k rows)."""
    for source in sources:
        plain = plain_type(source.type)
        checked = (*source.key, name, str(plain), str(stored))
        if (not may_not_fit(plain, stored) or source.live_type == stored
                or (stats is not None and checked in stats.values_fit)):
            continue
        found = _by_statistics(source, name, plain, stored, read, stats)
        if found is None:
            found = _by_reading(source, name, stored, read, stats)
        if not found and stats is not None:
            stats.values_fit.add(checked)
        if found:
            assert isinstance(found, tuple)
            said = ", ".join(f"{s.path} {plain_type(s.type)}" for s in sources[:6]) + \
                (f" and {len(sources) - 6} more shards" if len(sources) > 6 else "")
            raise BadInputError(
                f"--keep-columns {name!r}: {quote_path(source.path)} holds {found[1]!r} ({found[0]}), which {stored} "
                f"cannot hold, and {stored} is the type the column is stored as: its types widen to it ({said}); "
                f"give the column one type in every shard ({plain} here), or leave it out of --keep-columns")


def _by_statistics(source: KeptSource, name: str, plain: pa.DataType, stored: pa.DataType, read: ReadConfig,
                   stats: ReadStats | None) -> tuple[str, Any] | bool | None:
    """From the footer: ``False`` all fit, ``(where, value)`` one does not, ``None`` its statistics cannot say.

    A nested column by its leaves (a ``list<int64>``'s elements, a struct's fields): each leaf's min and max against
    the type that leaf is stored as."""
    pairs = leaf_types(plain, stored)
    if pairs is None:
        return None
    path = source.file if source.file is not None else source.shard.path if source.shard is not None else None
    assert path is not None, "a kept source is a named shard or a file"
    meta = read_retrying(path, lambda: _read_metadata(path), read, stats, "not a readable Parquet file")
    leaves = field_leaves(meta, [name])
    if leaves is None or len(leaves[0]) != len(pairs):
        return None
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if not group.num_rows:
            continue
        for leaf, (leaf_type, leaf_stored) in zip(leaves[0], pairs):
            if not may_not_fit(leaf_type, leaf_stored):
                continue
            column_stats = group.column(leaf).statistics
            if column_stats is None or not column_stats.has_min_max or group.column(leaf).physical_type == "INT96":
                return None  # NOTE: INT96 statistics are raw bytes in no defined order (int96.py: read as us)
            try:
                bounds = pa.array([column_stats.min, column_stats.max], leaf_type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                return None
            misfit = first_misfit(bounds, leaf_stored)
            if misfit is None and pa.types.is_decimal(leaf_type) and not _few_digits(bounds, leaf_type, leaf_stored):
                return None  # NOTE: a value between two that print back may not: read unless none has the digits
            if misfit is not None:
                nested = f" {group.column(leaf).path_in_schema}" if plain.num_fields else ""
                return (f"row group {g}'s {'smallest' if misfit[0] == 0 else 'largest'}{nested}, from its footer",
                        misfit[1])
    return False


def _few_digits(bounds: pa.Array, source: pa.DataType, stored: pa.DataType) -> bool:
    """Every decimal of type ``source`` between ``bounds`` has at most the digits a float ``stored`` prints back."""
    most = max(abs(v) for v in bounds.to_pylist())
    return bool(most < Decimal(10) ** (_DIGITS[stored.bit_width] - source.scale))


def leaf_types(source: pa.DataType, stored: pa.DataType) -> list[tuple[pa.DataType, pa.DataType]] | None:
    """Each Parquet leaf of a column of type ``source``, in the footer's order, with the type its values are stored
    as (a leaf of ``stored``, a struct's field by name); ``None`` where they do not pair up (a union, a dictionary
    inside)."""
    if pa.types.is_struct(source):
        if not pa.types.is_struct(stored):
            return None
        pairs: list[tuple[pa.DataType, pa.DataType]] = []
        for f in source:
            at = stored.get_field_index(f.name)
            inner = leaf_types(f.type, stored.field(at).type) if at >= 0 else None
            if inner is None:
                return None
            pairs += inner
        return pairs
    if pa.types.is_map(source):
        if not pa.types.is_map(stored):
            return None
        keys, items = leaf_types(source.key_type, stored.key_type), leaf_types(source.item_type, stored.item_type)
        return None if keys is None or items is None else keys + items
    if _is_list(source):
        return leaf_types(source.value_type, stored.value_type) if _is_list(stored) else None
    if source.num_fields or pa.types.is_dictionary(source):
        return None
    return [(source, stored)]


def _is_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def _read_metadata(path: Path | RemotePath) -> pq.FileMetaData:
    fault("read_footer", str(path))
    with contextlib.closing(path.open()) if isinstance(path, RemotePath) else contextlib.nullcontext(path) as file:
        return pq.read_metadata(file)


def _by_reading(source: KeptSource, name: str, stored: pa.DataType, read: ReadConfig,
                stats: ReadStats | None) -> tuple[str, Any] | None:
    """The column read, a record batch at a time: ``(where, value)`` of the first value that does not fit."""
    def misfit(row: int, batch: pa.RecordBatch) -> tuple[str, Any] | None:
        column = batch.column(0)
        found = first_misfit(column.dictionary_decode() if pa.types.is_dictionary(column.type) else column, stored)
        return None if found is None else (f"row {row + found[0]}", found[1])

    if source.shard is not None:
        with contextlib.closing(stream_batches(source.shard, [name], read, misfit, stats)) as found:
            return next((hit for hit in found if hit is not None), None)
    assert source.file is not None
    try:
        row = 0
        for batch in _file_batches(source.file, name, read):
            hit = misfit(row, batch)
            if hit is not None:
                return hit
            row += batch.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{quote_path(source.file)}: cannot read column {name!r} ({exc})") from exc
    return None


def _file_batches(path: Path, name: str, read: ReadConfig) -> Iterator[pa.RecordBatch]:
    with open_parquet(path, page_checksum_verification=True) as pf:
        yield from iter_columns(pf, [name], read.batch_rows)
