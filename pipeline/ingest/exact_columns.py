"""A Parquet file's top-level columns read by their exact names: the one reader of columns a run names.

NOTE: pyarrow selects columns by dotted leaf path, not by top-level name: ``columns=["body.en"]`` reads a top-level
``body.en`` and a struct ``body``'s child ``en`` too (``["body"]`` a top-level ``body.en`` beside the struct), so
what comes back holds more or other fields than asked, and a reader taking them by position decoded another column
(a struct where the text was: a traceback; a false 'corrupt data'). Here each top-level field is found by its exact
name, its leaf columns by position (the fields in schema order, each as many leaves as its type has), and only those
are read. A schema whose leaves do not add up so (never seen: a safety net) is read by name and the fields taken by
exact name from what comes back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq


def leaf_count(type_: pa.DataType) -> int:
    """The Parquet leaf columns a field of Arrow type ``type_`` is stored as (a struct's children, a list's values,
    a map's keys and items; a dictionary, extension or primitive one)."""
    if pa.types.is_dictionary(type_):
        return leaf_count(type_.value_type)
    if isinstance(type_, pa.ExtensionType):
        return leaf_count(type_.storage_type)
    if pa.types.is_map(type_):
        return leaf_count(type_.key_type) + leaf_count(type_.item_type)
    if type_.num_fields:  # struct, list kinds
        return sum(leaf_count(type_.field(i).type) for i in range(type_.num_fields))
    return 1


def _leaf_starts(meta: pq.FileMetaData) -> list[int] | None:
    """Where each top-level field's leaf columns start (and, last, the number of leaves); ``None`` where the
    schema's leaves do not add up."""
    starts = [0]
    for f in meta.schema.to_arrow_schema():
        starts.append(starts[-1] + leaf_count(f.type))
    return starts if starts[-1] == meta.num_columns else None


def field_leaves(meta: pq.FileMetaData, names: Sequence[str]) -> list[list[int]] | None:
    """The leaf column indices of each top-level field named exactly ``names[i]`` (in the order of ``names``);
    ``None`` when one is missing or named twice (pyarrow's own error then) or the schema's leaves do not add up."""
    positions = [meta.schema.to_arrow_schema().get_field_index(name) for name in names]
    starts = _leaf_starts(meta)
    if starts is None or any(p < 0 for p in positions):
        return None
    return [list(range(starts[p], starts[p + 1])) for p in positions]


def _indices(meta: pq.FileMetaData, names: Sequence[str]) -> list[int] | None:
    leaves = field_leaves(meta, names)
    return None if leaves is None else list(dict.fromkeys(i for field in leaves for i in field))


class LeafIndex:
    """``_indices`` of one open file, each list of names worked out once: a file read many times (a version's
    ``ids.parquet``, a row group per search in ``petal serve``) converts its schema once, not per read (~35 us on
    the 2-core machine)."""

    def __init__(self, meta: pq.FileMetaData) -> None:
        self.meta = meta
        self._found: dict[tuple[str, ...], list[int] | None] = {}

    def __call__(self, meta: pq.FileMetaData, names: Sequence[str]) -> list[int] | None:
        key = tuple(names)
        if key not in self._found:
            self._found[key] = _indices(self.meta, key)
        return self._found[key]


def _exact(data: pa.Table, names: Sequence[str]) -> pa.Table:
    """``names``' fields of ``data`` (a table or a record batch), in that order (``data`` may hold others; as it
    is where one is missing)."""
    held = data.schema.names
    if held == list(names) or not set(names) <= set(held):
        return data
    return data.select(list(names))


def iter_columns(pf: pq.ParquetFile, names: Sequence[str], batch_size: int,
                 row_groups: Iterable[int] | None = None) -> Iterator[pa.RecordBatch]:
    """``pf.iter_batches(batch_size, row_groups, columns=names)``, each batch holding exactly ``names``' fields."""
    groups = range(pf.metadata.num_row_groups) if row_groups is None else row_groups
    indices = _indices(pf.metadata, names)
    if indices is None:
        return (_exact(b, names) for b in pf.iter_batches(batch_size=batch_size, row_groups=groups, columns=names))
    return (_exact(b, names) for b in pf.reader.iter_batches(batch_size, row_groups=groups, column_indices=indices,
                                                             use_threads=True))


def read_group_columns(pf: pq.ParquetFile, group: int, names: Sequence[str],
                       leaves: LeafIndex | None = None) -> pa.Table:
    """``pf.read_row_group(group, columns=names)``, exactly ``names``' fields (``leaves``: ``pf``'s, kept)."""
    indices = (leaves or _indices)(pf.metadata, names)
    if indices is None:
        return _exact(pf.read_row_group(group, columns=list(names)), names)
    return _exact(pf.reader.read_row_group(group, column_indices=indices, use_threads=True), names)


def read_columns(pf: pq.ParquetFile, names: Sequence[str], leaves: LeafIndex | None = None) -> pa.Table:
    """``pf.read(columns=names)``, exactly ``names``' fields (``leaves``: ``pf``'s, kept)."""
    indices = (leaves or _indices)(pf.metadata, names)
    if indices is None:
        return _exact(pf.read(columns=list(names)), names)
    return _exact(pf.reader.read_all(column_indices=indices, use_threads=True), names)


def read_group_fields(pf: pq.ParquetFile, group: int, positions: Sequence[int]) -> pa.Table:
    """Row group ``group``'s top-level fields at ``positions`` (ascending, in ``pf.schema_arrow``), where a schema
    may name two fields alike (a shard's metadata columns: by position, not name); its row count even with none."""
    if not positions:  # NOTE: the row count alone: a whole read decoded the text and every vector of the group
        return pf.reader.read_row_group(group, column_indices=[], use_threads=True)
    starts = _leaf_starts(pf.metadata)
    if starts is None:
        return pf.read_row_group(group).select(list(positions))
    indices = [i for p in positions for i in range(starts[p], starts[p + 1])]
    return pf.reader.read_row_group(group, column_indices=indices, use_threads=True)
