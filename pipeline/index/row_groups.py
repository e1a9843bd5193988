"""``ids.parquet`` read by FAISS id: only the row groups that hold the asked rows, so an open is O(1).

The file is opened once (memory-mapped, page checksums verified: ``files.open_parquet``); its footer
says where each row group starts. The id columns (``id``, ``shard``, ``row``) of a row group are
decoded the first time a hit falls in it and kept (at most the whole id map, what the open used to
decode up front); stored text and ``--keep-columns`` are decoded per call and dropped. A row group
that cannot be decoded (a change in the body, which the open's head/tail checks do not read), or that decodes to
fewer rows than the footer counts (``parquet_rows``: a page pyarrow skipped), is a ``BadInputError`` (65) naming
the file, never a pyarrow traceback or another row's text; a read the host fails (out of memory, a thread that
cannot start) is 74 (``read_errors.py``), never "the version is corrupt".
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from petal.pipeline.index.read_errors import read_failure
from petal.pipeline.ingest.exact_columns import LeafIndex, read_columns, read_group_columns
from petal.pipeline.reliability.errors import BadInputError, PetalError, quote_path
from petal.pipeline.reliability.parquet_rows import check_rows

ID_COLUMNS = ("id", "shard", "row")  # what a hit needs (faiss_id is the row number)
PER_VALUE_HITS = 48  # IdMap.lookup: up to this many ids are read value by value, more in bulk


def int64_array(values: np.ndarray) -> pa.Array:
    """``values`` as an Arrow int64 array over the same bytes.

    NOTE: not ``pa.array``: its first call imports pandas when pandas is installed (pyarrow's pandas shim
    checks every input), 0.25-0.4 s of a one-shot ``petal query`` on the 2-core machine, for nothing.
    """
    flat = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(flat), [None, pa.py_buffer(flat)])


def python_values(column: pa.Array, local: pa.Array) -> list[Any]:
    """``column[local]`` as Python values, what ``column[i].as_py()`` gives each (a dictionary column's distinct
    values converted once and shared: a shard path repeats over every row of its shard)."""
    if pa.types.is_dictionary(column.type):
        words = column.dictionary.to_pylist()
        indices = column.indices.take(local)
        if indices.null_count == 0:
            return [words[i] for i in indices.to_numpy().tolist()]
        return [None if i is None else words[i] for i in indices.to_pylist()]
    return column.take(local).to_pylist()


class RowGroups:
    """An open Parquet file whose rows are read by number, row group by row group."""

    def __init__(self, parquet_file: Any, path: Path) -> None:
        self.file = parquet_file
        self.path = path
        meta = parquet_file.metadata
        self.num_rows = int(meta.num_rows)
        self.names: list[str] = list(parquet_file.schema_arrow.names)
        self.starts = np.cumsum([0, *(meta.row_group(g).num_rows for g in range(meta.num_row_groups))])
        self._leaves = LeafIndex(meta)  # each column list's leaf positions, found once
        # NOTE: one ParquetFile serves the search thread and petal serve's text threads: reads are serialised
        self._lock = threading.Lock()

    def _failed(self, exc: Exception, what: str) -> PetalError:
        """65 for damage in the file, 74 for the host's failure (out of memory...), 66 permission denied."""
        return read_failure(self.path, what, exc)

    def read_group(self, group: int, columns: list[str]) -> pa.Table:
        """Row group ``group``'s ``columns``, decoded (page checksums verified)."""
        try:
            with self._lock:
                table = read_group_columns(self.file, group, columns, self._leaves)  # exact: a kept 'a.b', 'a'{b}
            check_rows(table.num_rows, int(self.starts[group + 1] - self.starts[group]))  # NOTE: parquet_rows
            return table
        except (OSError, pa.ArrowException, MemoryError) as exc:
            raise self._failed(exc, f"row group {group}") from exc

    def read_columns(self, columns: list[str]) -> pa.Table:
        """Every row of ``columns`` (``--where`` filters over kept columns)."""
        try:
            with self._lock:
                table = read_columns(self.file, columns, self._leaves)
            check_rows(table.num_rows, self.num_rows)  # NOTE: a page pyarrow skipped (parquet_rows)
            return table
        except (OSError, pa.ArrowException, MemoryError) as exc:
            raise self._failed(exc, f"columns {', '.join(columns)}") from exc

    def groups_of(self, rows: np.ndarray) -> np.ndarray:
        """The row group of each row number of ``rows``."""
        return np.searchsorted(self.starts, rows, side="right") - 1

    def take(self, rows: np.ndarray, columns: list[str]) -> pa.Table:
        """``columns`` of ``rows`` (row numbers, any order, repeats allowed), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        groups = self.groups_of(rows)
        parts, positions = [], []
        # NOTE: the rows taken out of each decoded group are new allocations too: out of memory there is the host's
        # failure (74 naming the file), as in the decode (a raw ArrowMemoryError traceback, exit 1, once row groups
        # were small enough to decode within the memory left)
        try:
            for group in np.unique(groups):
                at = np.flatnonzero(groups == group)
                table = self.read_group(int(group), columns)
                parts.append(table.take(int64_array(rows[at] - int(self.starts[group]))))
                positions.append(at)
            if not parts:
                return pa.schema([self.file.schema_arrow.field(c) for c in columns]).empty_table()
            found = pa.concat_tables(parts)
            order = np.empty(len(rows), dtype=np.int64)
            order[np.concatenate(positions)] = np.arange(len(rows))
            return found.take(int64_array(order))
        except MemoryError as exc:
            raise self._failed(exc, f"rows of columns {', '.join(columns)}") from exc


# what petal writes in each column of ids.parquet: "int" (an integer type), "text" (a string type)
ID_KINDS = {"faiss_id": ("int",), "id": ("int", "text"), "shard": ("text",), "row": ("int",)}


def _kind(value_type: pa.DataType) -> str:
    if pa.types.is_dictionary(value_type):
        value_type = value_type.value_type
    if pa.types.is_integer(value_type):
        return "int"
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return "text"
    return str(value_type)


def column_problem(rows: RowGroups, kinds: dict[str, tuple[str, ...]], nullable: tuple[str, ...] = ()) -> str | None:
    """What is wrong with the columns ``kinds`` names in ``rows`` (those it holds), from the footer alone: a type
    petal never writes there (an integer text, a string row), or nulls that its statistics count where petal writes
    none (the columns not in ``nullable``); ``None`` when nothing is. NOTE: such a file (a manifest signed again over
    it) passed the open and verify, then a search printed null ids or --show-text crashed on an integer text."""
    schema = rows.file.schema_arrow
    for name, allowed in kinds.items():
        if name not in rows.names:
            continue
        kind = _kind(schema.field(name).type)
        if kind not in allowed:
            wanted = " or ".join("an integer" if k == "int" else "a string" for k in allowed)
            return f"{quote_path(rows.path)}: column {name!r} is {kind}, where petal writes {wanted}"
    meta = rows.file.metadata
    for group in range(meta.num_row_groups):
        chunk = meta.row_group(group)
        for i in range(chunk.num_columns):
            column = chunk.column(i)
            name = column.path_in_schema
            if name not in kinds or name in nullable:
                continue
            stats = column.statistics
            if stats is not None and stats.has_null_count and stats.null_count > 0:
                return (f"{quote_path(rows.path)}: column {name!r} holds nulls (row group {group}), where petal "
                        "writes none")
    return None


class IdMap:
    """FAISS id -> document id, shard, row (``ids.parquet``), decoded per row group on first use."""

    def __init__(self, rows: RowGroups) -> None:
        self.rows = rows
        missing = [c for c in ("faiss_id", *ID_COLUMNS) if c not in rows.names]
        if missing:
            raise BadInputError(f"{quote_path(rows.path)} has no column {', '.join(missing)}; the version is "
                                "corrupt: rebuild it")
        problem = column_problem(rows, ID_KINDS)
        if problem is not None:
            raise BadInputError(f"{problem}; the version is corrupt: rebuild it")
        self._columns: dict[int, tuple[Any, ...]] = {}  # row group -> its decoded id columns, one chunk each

    def __len__(self) -> int:
        return self.rows.num_rows

    def take(self, faiss_ids: np.ndarray) -> pa.Table:
        """``id``, ``shard``, ``row`` of ``faiss_ids`` (each below ``len(self)``), in that order, as a table
        (read again from their row groups: searches use ``lookup``)."""
        return self.rows.take(faiss_ids, list(ID_COLUMNS))

    def decode_all(self) -> None:
        """Decode every row group now (a server does it before a version serves, so that no search pays
        a row group's first decode): what the open decoded up front before it became O(1)."""
        for group in range(len(self.rows.starts) - 1):
            self._group_columns(group)

    def _group_columns(self, group: int) -> tuple[Any, ...]:
        columns = self._columns.get(group)
        if columns is None:
            table = self.rows.read_group(group, list(ID_COLUMNS))
            columns = self._columns[group] = tuple(table.column(c).combine_chunks() for c in ID_COLUMNS)
        return columns

    def lookup(self, faiss_ids: np.ndarray) -> tuple[list[Any], list[Any], list[Any]]:
        """The ``id``, ``shard`` and ``row`` values of ``faiss_ids`` (each in ``0..len(self)-1``, any shape, read
        flat, repeats allowed), as Python lists in that order (a search's hits, all of its queries at once).

        In bulk: the ids are sorted by row group (``np.searchsorted`` over the groups' first rows), each group's
        decoded single-chunk columns give their values with one Arrow ``take`` each (the few distinct shard paths
        of a dictionary column: converted once per group, shared by its hits), and one permutation puts them back
        in the order asked. Per value (``columns[i].as_py()``, three per hit) cost ~4 us a hit (400k hits of a
        ``petal query --vector-file``: 1.5 s, in bulk 0.18 s); a group's takes cost ~80 us, so a lone query's
        few hits (up to ``PER_VALUE_HITS``) are still read value by value (10 hits: ~40 us).
        """
        rows = np.asarray(faiss_ids, dtype=np.int64).ravel()
        groups = self.rows.groups_of(rows)
        if len(rows) <= PER_VALUE_HITS:
            return self._lookup_each(rows, groups)
        order = np.argsort(groups, kind="stable")
        ordered = groups[order]
        cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        found: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        for first, last in zip([0, *cuts.tolist()], [*cuts.tolist(), len(rows)]):
            group = int(ordered[first])
            columns = self._group_columns(group)
            local = int64_array(rows[order[first:last]] - int(self.rows.starts[group]))
            for values, column in zip(found, columns):
                values.extend(python_values(column, local))
        if bool((groups[1:] >= groups[:-1]).all()):  # the groups come in order (one group): found in the order asked
            return found
        back = np.empty(len(rows), dtype=np.int64)
        back[order] = np.arange(len(rows))
        at = back.tolist()
        return ([found[0][i] for i in at], [found[1][i] for i in at], [found[2][i] for i in at])

    def _lookup_each(self, rows: np.ndarray, groups: np.ndarray) -> tuple[list[Any], list[Any], list[Any]]:
        """``lookup`` value by value (a few hits)."""
        found: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        for faiss_id, group in zip(rows.tolist(), groups.tolist()):
            columns = self._group_columns(group)
            local = faiss_id - int(self.rows.starts[group])
            for values, column in zip(found, columns):
                values.append(column[local].as_py())
        return found

    def table(self) -> pa.Table:
        """The whole id map (``faiss_id``, ``id``, ``shard``, ``row``): O(ids), for tools and tests."""
        return self.rows.read_columns(["faiss_id", *ID_COLUMNS])
