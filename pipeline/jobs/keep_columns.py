"""``--keep-columns`` against the shards a run names, before any work, from the schemas preflight read.

NOTE: the types come from the footers preflight read (``ShardInfo.schema``); a shard is read again only where its
type widens to one that may not hold its values (``kept_values.py``: its footer's statistics, else the column), with
the retries and the 65/66/74 rules of every source read (pipeline/ingest/parquet.py).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo, check_unique_columns
from petal.pipeline.ingest.partitions import partition_hint
from petal.pipeline.ingest.zones import unresolved_zone
from petal.pipeline.reliability.errors import BadInputError, UsageError, quote_names, quote_path
from petal.pipeline.store.columns import kept_type
from petal.pipeline.store.kept_values import KeptSource, check_kept_values

STORED_NAMES = ("faiss_id", "id", "shard", "row", "text")  # what a version's ids.parquet holds itself


def check_keep_columns(shards: list[ShardInfo], columns: tuple[str, ...], reserved: tuple[str, ...],
                       read: ReadConfig | None = None, stats: ReadStats | None = None) -> None:
    """No kept column takes a name petal stores (``UsageError``, exit 2); every shard has every kept column (65
    naming shard and column); a column's types across the shards widen to one (``kept_type``, else 65) that holds
    every value (``check_kept_values``, else 65)."""
    for name in columns:
        if name in reserved or name in STORED_NAMES:
            raise UsageError(f"--keep-columns {name!r}: that name is taken (the id or text column, or one of "
                             f"{', '.join(STORED_NAMES)} that petal stores with the ids)")
    for info in shards:
        assert info.schema is not None, "preflight records every named shard's schema"
        names = info.schema.names
        check_unique_columns(info.path, info.schema, list(columns))
        missing = [c for c in columns if c not in names]
        if missing:
            raise BadInputError(f"{quote_path(info.path)}: no column {missing[0]!r} (--keep-columns); it has "
                                f"{quote_names(sorted(names))}" + partition_hint(info.path, missing))
        for name in columns:
            type_ = info.schema.field(name).type
            if holds_bytes(type_):
                raise BadInputError(f"{quote_path(info.path)}: --keep-columns {name!r} is {type_}, which holds bytes: "
                                    "kept columns come out as text (petal query, petal serve, JSON), where bytes have "
                                    "no faithful form; store it as a string column (e.g. base64 or hex) or leave it "
                                    "out of --keep-columns")
    check_zones(shards, columns, "--keep-columns")
    check_column_types(shards, columns, read=read, stats=stats)


def check_zones(shards: list[ShardInfo], columns: Sequence[str], flag: str) -> None:
    """Every timestamp in ``columns`` (kept, or a ``--vectors-column`` run's text stored beside the vectors) has a
    time zone this machine resolves (``zones.py``), else 65 naming the shard, the column and the zone, before any
    work."""
    for info in shards:
        assert info.schema is not None, "preflight records every named shard's schema"
        for name in columns:
            type_ = info.schema.field(name).type
            zone = unresolved_zone(type_)
            if zone is not None:
                raise BadInputError(f"{quote_path(info.path)}: {flag} {name!r} is {type_}, whose time zone {zone!r} "
                                    "cannot be resolved (an IANA name such as 'Europe/Paris', 'UTC' or an offset such "
                                    "as '+03:00' can): its values could not be shown or filtered; write it with such "
                                    f"a zone, or with none (UTC), or leave it out of {flag}")


def holds_bytes(type_: pa.DataType) -> bool:
    """``type_`` is binary (any width or layout), or a nested, dictionary or extension type holding binary."""
    if (pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_fixed_size_binary(type_)
            or pa.types.is_binary_view(type_)):
        return True
    if pa.types.is_dictionary(type_):
        return holds_bytes(type_.value_type)
    if isinstance(type_, pa.ExtensionType):
        return holds_bytes(type_.storage_type)
    return any(holds_bytes(type_.field(i).type) for i in range(type_.num_fields))


def check_column_types(shards: list[ShardInfo], columns: tuple[str, ...],
                       kept: Sequence[tuple[str, pa.Schema, Path]] = (), read: ReadConfig | None = None,
                       stats: ReadStats | None = None, live: pa.Schema | None = None) -> None:
    """A kept column's types across the named shards (their footers) and the shards a run keeps from the live version
    (``kept``: each one's path, the schema its columns are stored from and that file, ``kept_schemas``) widen to one
    (``kept_type``), else 65 naming the column, two shards and their types; that type holds every value of theirs
    (``check_kept_values``), else 65 naming the column, the shard, the value and where, and the types. Under the lock
    with ``kept``, before any embedding; ``live``: the live version's ``ids.parquet`` schema (``stored_schema``), the
    types the kept shards' values are stored as already (not read again where that is the type).

    NOTE: a kept shard's type, and a value the widest type cannot hold (an int64 above 2^53 beside a float64), were
    met only when the version's columns were merged: after every new shard was embedded (README: checked before any
    work)."""
    for name in columns:
        sources = [KeptSource(str(i.path), i.schema.field(name).type, shard=i) for i in shards
                   if i.schema is not None and name in i.schema.names]
        live_type = live.field(name).type if live is not None and name in live.names else None
        sources += [KeptSource(path, schema.field(name).type, file=file, live_type=live_type)
                    for path, schema, file in kept if name in schema.names]
        if sources:
            stored = kept_type(name, [(s.path, s.type) for s in sources])
            check_kept_values(name, stored, sources, read or ReadConfig(), stats)


def stored_schema(ids_file: Path | None) -> pa.Schema | None:
    """The schema of a version's ``ids.parquet`` (``ids_file``): the types its kept columns are stored as; ``None``
    where there is none or it cannot be read (the kept shards are then checked from their files)."""
    if ids_file is None:
        return None
    try:
        # NOTE: a regular file only, never followed: a FIFO planted in its place blocked the run forever at open
        if not stat.S_ISREG(os.lstat(ids_file).st_mode):
            return None
        return pq.read_schema(ids_file)
    except (OSError, pa.ArrowException):
        return None
