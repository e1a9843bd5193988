"""Stored columns in the version: text and ``--keep-columns`` appended to ``ids.parquet``, in FAISS id order.

Written from the store entries' side files (``pipeline/store/columns.py``) in the order of
``StoreVectors`` (FAISS ids ``0..n-1``), streamed, in row groups of at most ``IDS_GROUP_ROWS``; an entry
without a side file (its shard was gone when the text was asked for) gets nulls. ``IndexReader`` decodes
nothing at open; hits' ids and stored columns are read per row group (``row_groups.py``), only the
groups holding hits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.index.files import IDS_FILE, IDS_GROUP_ROWS
from petal.pipeline.index.nanoseconds import holds_nanoseconds, nanosecond_values
from petal.pipeline.index.row_groups import RowGroups
from petal.pipeline.index.source import StoreVectors
from petal.pipeline.ingest.zones import as_utc, unresolved_zone
from petal.pipeline.layout import is_denied
from petal.pipeline.reliability.errors import BadInputError
from petal.pipeline.reliability.parquet_rows import check_rows
from petal.pipeline.store.columns import (
    ColumnsNeed,
    bounded_batches,
    columns_path,
    entry_columns,
    stored_writer,
    version_schema,
)
from petal.pipeline.store.embeddings import StoreEntry

ID_COLUMNS = ["faiss_id", "id", "shard", "row"]


_BINARY_VIEWS = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary(), pa.string_view(): pa.binary_view()}


def lenient_pylist(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, with what Python cannot hold read another way: a string column's bytes that are not
    UTF-8 decoded with U+FFFD, a date or time beyond Python's (year 10000 on) as Arrow's text of it, a nested value
    holding such text ``None``; nanoseconds kept (``nanoseconds.py``: a ``time64[ns]`` as a ``NanoTime``).

    NOTE: pyarrow validates no UTF-8 when it reads or writes a string column, and ``to_pylist`` raises on the first
    bad value: a ``--keep-columns`` column stored from a shard as it was made every search hitting that row fail
    ('utf-8' codec can't decode: petal query exit 2, petal serve 422; a timestamp far in the future: OverflowError,
    a traceback), and a shard's metadata column a 500. A timestamp whose time zone cannot be resolved here (an index
    made before such a column was refused: ``zones.py``) is the UTC instant it holds."""
    if not any(holds_nanoseconds(f.type) or unresolved_zone(f.type) is not None for f in table.schema):
        try:
            return table.to_pylist()
        except (UnicodeDecodeError, OverflowError):
            pass
    columns = {name: _lenient_values(column) for name, column in zip(table.column_names, table.columns)}
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _lenient_values(column: pa.ChunkedArray) -> list[Any]:
    if unresolved_zone(column.type) is not None:  # NOTE: to_pylist raised ArrowInvalid (no zoneinfo of that name)
        column = column.cast(as_utc(column.type))
    if holds_nanoseconds(column.type):
        return nanosecond_values(column.combine_chunks())
    try:
        return column.to_pylist()
    except (UnicodeDecodeError, OverflowError):
        pass
    cells = column.combine_chunks()
    if pa.types.is_dictionary(cells.type):
        cells = cells.dictionary_decode()
    binary = _BINARY_VIEWS.get(cells.type)
    if binary is not None:
        return [None if v is None else v.decode("utf-8", "replace") for v in cells.view(binary).to_pylist()]
    return [_lenient_value(cells, i) for i in range(len(cells))]


def _lenient_value(cells: pa.Array, i: int) -> Any:
    try:
        return cells[i].as_py()
    except OverflowError:  # a date or time beyond Python's datetime: Arrow's text of it
        try:
            return cells.slice(i, 1).cast(pa.string())[0].as_py()
        except pa.ArrowException:
            return None
    except UnicodeDecodeError:  # a nested value holding text that is not UTF-8
        return None


def _has(entry: StoreEntry, need: ColumnsNeed) -> bool:
    """Whether ``entry``'s side file holds ``need``'s columns: not when it is gone, not a regular file, or has no
    footer to read (cut, emptied, garbage), as ``ensure_columns`` judges it. NOTE: such a footer was a pyarrow
    traceback in petal rebuild (exit 1), where a side file that is gone is copied from the previous version."""
    path = columns_path(entry.path)
    if not path.is_file():  # NOTE: never opened when it is not a regular file (a FIFO would block)
        return False
    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, OSError) and is_denied(exc):
            raise  # NOTE: not damaged: petal may not read it (petal rebuild: 66 naming it)
        return False
    return set(need.names) <= set(names)


def _stored_parts(entries: list[StoreEntry], dim: int, need: ColumnsNeed, schema: pa.Schema,
                  read: ReadConfig | None) -> Any:
    from petal.pipeline.store.kept_values import cast_kept_table

    source = StoreVectors(entries, dim)  # the same selection (de-duplication, --delete) as the index
    for entry, keep in zip(source.entries, source._keep):
        if len(keep) == 0:
            continue
        if _has(entry, need):
            for part in entry_columns(entry, keep.astype(np.int64), need.names, read):
                try:
                    yield cast_kept_table(part, schema)
                except pa.ArrowInvalid as exc:  # a value the common type cannot hold (a uint64 past int64)
                    raise BadInputError(_misfit(entry, part, schema, exc)) from exc
        else:
            yield pa.table({f.name: pa.nulls(len(keep), f.type) for f in schema}, schema=schema)


def _misfit(entry: StoreEntry, part: pa.Table, schema: pa.Schema, exc: Exception) -> str:
    """What a part of ``entry``'s stored columns holds that ``schema`` cannot: the column, the value, both types.
    NOTE: the run's checks refuse such a shard before any work (``kept_values.py``); a side file changed since is
    met here."""
    from petal.pipeline.store.kept_values import first_misfit

    shard = entry.meta["source"]["path"]
    for name in part.column_names:
        found = first_misfit(part.column(name).combine_chunks(), schema.field(name).type)
        if found is not None:
            return (f"--keep-columns {name!r}: {shard} holds {found[1]!r} as {part.schema.field(name).type}, which "
                    f"{schema.field(name).type}, the type the column is stored as, cannot hold; give the column one "
                    "type in every shard, or leave it out of --keep-columns")
    return f"--keep-columns: {shard}: a value does not fit the type the column is stored as ({exc})"


def add_stored_columns(entries: list[StoreEntry], dim: int, need: ColumnsNeed, staging: Path,
                       read: ReadConfig | None = None) -> bool:
    """Append ``need``'s columns to ``staging/ids.parquet``; ``False`` (unchanged) when no entry stores them. The side
    files are read in batches of ``read``'s budget (the run's ``max_batch_bytes``; else the default)."""
    schema = version_schema(entries, need)
    if schema is None:
        return False
    ids_path = staging / IDS_FILE
    ids = pq.read_table(ids_path, columns=ID_COLUMNS)  # NOTE: what IndexReader holds anyway
    merged = pa.schema([*ids.schema, *schema])
    tmp = staging / f".{IDS_FILE}.tmp"
    offset = 0
    with stored_writer(tmp, merged) as writer:
        for part in _stored_parts(entries, dim, need, schema, read):
            head = ids.slice(offset, part.num_rows)
            writer.write_table(pa.table([*head.columns, *part.columns], schema=merged), row_group_size=IDS_GROUP_ROWS)
            offset += part.num_rows
        if offset == 0:
            writer.write_table(merged.empty_table())
    assert offset == ids.num_rows, f"{offset} stored rows for {ids.num_rows} ids"
    os.replace(tmp, ids_path)
    return True


def missing_side_files(entries: list[StoreEntry], need: ColumnsNeed) -> list[StoreEntry]:
    """The entries with rows in the version whose side file lacks ``need``'s columns (or is gone)."""
    return [entry for entry in entries if entry.num_embedded and not _has(entry, need)]


def restore_stored_columns(previous_ids: Path, staging: Path, names: list[str]) -> bool:
    """``names`` copied from a previous version's ``ids.parquet`` into ``staging/ids.parquet``, when both hold
    the same ids row for row (a rebuild over the same store entries): ``False`` (unchanged) otherwise.

    What ``petal rebuild`` falls back to when store side files are missing: the previous version has the
    very values, checked by its page checksums as they are read."""
    ids_path = staging / IDS_FILE
    ids = pq.read_table(ids_path, columns=ID_COLUMNS)
    try:
        source = pq.ParquetFile(previous_ids, page_checksum_verification=True)
        if not set(names) <= set(source.schema_arrow.names) or source.metadata.num_rows != ids.num_rows:
            return False
        if not source.read(columns=ID_COLUMNS).equals(ids):
            return False
        schema = pa.schema([source.schema_arrow.field(n) for n in names])
        merged = pa.schema([*ids.schema, *schema])
        tmp = staging / f".{IDS_FILE}.tmp"
        offset = 0
        with stored_writer(tmp, merged) as writer:
            for batch in bounded_batches(source, names, IDS_GROUP_ROWS):
                head = ids.slice(offset, batch.num_rows)
                writer.write_table(pa.table([*head.columns, *batch.columns], schema=merged),
                                   row_group_size=IDS_GROUP_ROWS)
                offset += batch.num_rows
            check_rows(offset, ids.num_rows)  # NOTE: a skipped page shifts every later row (parquet_rows)
            if offset == 0:
                writer.write_table(merged.empty_table())
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{previous_ids}: cannot read the stored columns of the previous version ({exc}); "
                            "run petal index on the sources to write them again") from exc
    os.replace(tmp, ids_path)
    return True


class ColumnsReader:
    """Stored columns of hits by FAISS id, read through the version's open ``ids.parquet`` (only the row
    groups holding them are decoded; a damaged one is a ``BadInputError`` naming the file)."""

    def __init__(self, rows: RowGroups, names: list[str]) -> None:
        self.source = rows
        self.path = rows.path
        self.names = [n for n in names if n in rows.names]

    def rows(self, faiss_ids: list[int], names: list[str]) -> list[dict[str, Any]]:
        """``[{name: value}]`` per id of ``faiss_ids``."""
        names = [n for n in names if n in self.names]
        if not names:
            return [{} for _ in faiss_ids]
        return lenient_pylist(self.source.take(np.asarray(faiss_ids, dtype=np.int64), names))

    def read(self, names: list[str]) -> pa.Table:
        """Every row of ``names`` (``--where``)."""
        return self.source.read_columns(names)
