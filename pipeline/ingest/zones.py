"""Time zones of timestamp columns that this machine can resolve (an IANA name, ``UTC``, an offset ``+03:00``).

NOTE: Parquet stores a zoned timestamp as a UTC instant and the zone as a name nothing checks: a shard of ``UTC+3``
or ``Eastern Standard Time`` (Windows' name) was indexed at exit 0, then every query of that column was a traceback
('The zoneinfo module or pytz package must be installed.', exit 1). Such a column is refused where a run takes it
(``unresolved_zone``, 65), and an index made before shows its values as the UTC instants they are (``as_utc``).
"""

from __future__ import annotations

import functools

import pyarrow as pa

from petal.pipeline.ingest.nested_types import map_leaves


@functools.lru_cache(maxsize=64)
def _resolves(zone: str) -> bool:
    try:
        pa.scalar(0, pa.timestamp("s", zone)).as_py()
        pa.array([0], pa.timestamp("s", zone)).cast(pa.string())
    except (pa.ArrowException, ValueError, KeyError):
        return False
    return True


def _timestamps(type_: pa.DataType) -> list[pa.TimestampType]:
    """Every timestamp type in ``type_`` (itself, a list's values, a struct's fields, a map's keys and items, a
    dictionary's values)."""
    if pa.types.is_timestamp(type_):
        return [type_]
    if pa.types.is_dictionary(type_):
        return _timestamps(type_.value_type)
    if isinstance(type_, pa.ExtensionType):
        return _timestamps(type_.storage_type)
    return [t for i in range(type_.num_fields) for t in _timestamps(type_.field(i).type)]


def unresolved_zone(type_: pa.DataType) -> str | None:
    """The first time zone of a timestamp in ``type_`` that cannot be resolved here; ``None`` when all can."""
    return next((t.tz for t in _timestamps(type_) if t.tz is not None and not _resolves(t.tz)), None)


def as_utc(type_: pa.DataType) -> pa.DataType:
    """``type_`` with each timestamp of an unresolvable zone in ``UTC`` (the same instants: a cast of metadata), a
    dictionary as its values."""
    def leaf(t: pa.DataType) -> pa.DataType:
        if pa.types.is_dictionary(t):
            return as_utc(t.value_type)
        if pa.types.is_timestamp(t) and t.tz is not None and not _resolves(t.tz):
            return pa.timestamp(t.unit, "UTC")
        return t

    return map_leaves(type_, leaf)
