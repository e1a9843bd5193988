"""A user's Parquet opened so that INT96 timestamps (what Spark, Hive and Impala write) read as what they hold.

NOTE: pyarrow reads INT96 as ``timestamp[ns]`` by default, which holds only the years 1677 to 2262 and wraps the
rest without a word: 9999-12-31 came back as 1816-03-29 05:56:08.066277376, 0001-01-01 as 1754-08-30, stored and
shown at exit 0. Every open of a user's Parquet (``open_parquet``) reads INT96 as ``timestamp[us]`` (years 1 to
9999, the precision Spark writes), and every schema petal checks (``arrow_schema``) says so: the type checked is
the type read. Such a column is then a ``timestamp[us]`` like any other (a shard of ``timestamp[ns]`` beside it
widens it to nanoseconds, which a value past 2262 cannot fit: 65, as README says).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

INT96_UNIT = "us"


def open_parquet(source: Any, **options: Any) -> pq.ParquetFile:
    """``pq.ParquetFile(source, **options)``, INT96 timestamps read as microseconds."""
    return pq.ParquetFile(source, coerce_int96_timestamp_unit=INT96_UNIT, **options)


def arrow_schema(meta: pq.FileMetaData) -> pa.Schema:
    """``meta``'s Arrow schema as ``open_parquet`` reads it: each INT96 leaf a ``timestamp[us]`` (its zone kept).

    NOTE: ``meta.schema.to_arrow_schema()`` says ``timestamp[ns]`` for INT96 whatever the reader is told."""
    schema = meta.schema.to_arrow_schema()
    kinds = [meta.schema.column(i).physical_type for i in range(meta.num_columns)]
    if "INT96" not in kinds:
        return schema
    leaves = iter(kinds)
    try:
        fields = [f.with_type(_coerced(f.type, leaves)) for f in schema]
    except StopIteration:  # NOTE: leaves that do not add up (never seen): as pyarrow says
        return schema
    return pa.schema(fields, metadata=schema.metadata)


def read_arrow_schema(source: Any) -> pa.Schema:
    """``pq.read_schema(source)`` as ``open_parquet`` reads it (``arrow_schema``)."""
    return arrow_schema(pq.read_metadata(source))


def _coerced(type_: pa.DataType, leaves: Any) -> pa.DataType:
    """``type_`` with its INT96 leaves (``leaves``: the physical types of its Parquet leaves, consumed in order)
    as microseconds."""
    if pa.types.is_dictionary(type_):
        value = _coerced(type_.value_type, leaves)
        return type_ if value == type_.value_type else pa.dictionary(type_.index_type, value, type_.ordered)
    if pa.types.is_map(type_):
        key, item = _coerced(type_.key_type, leaves), _coerced(type_.item_type, leaves)
        return pa.map_(type_.key_field.with_type(key), type_.item_field.with_type(item), type_.keys_sorted)
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_coerced(f.type, leaves)) for f in type_])
    if pa.types.is_fixed_size_list(type_):
        return pa.list_(type_.value_field.with_type(_coerced(type_.value_type, leaves)), type_.list_size)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        make = pa.list_ if pa.types.is_list(type_) else pa.large_list
        return make(type_.value_field.with_type(_coerced(type_.value_type, leaves)))
    if type_.num_fields:  # NOTE: no other nested type comes from a Parquet schema; its leaves counted all the same
        for i in range(type_.num_fields):
            _coerced(type_.field(i).type, leaves)
        return type_
    kind = next(leaves)
    if kind == "INT96" and pa.types.is_timestamp(type_):
        return pa.timestamp(INT96_UNIT, type_.tz)
    return type_
