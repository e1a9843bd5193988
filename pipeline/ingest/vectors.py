"""Precomputed embeddings (``petal index SOURCE --vectors-column emb``): a Parquet column of vectors
(``list<float>``, ``large_list<float>`` or ``fixed_size_list<float>``, float16/32/64 or integers) read instead of
running a model.

Every shard's schema is checked before any work (the column, its type, one dimension for all:
a fixed-size list's size, else the most common length in the shard's first record batch holding a vector;
shards of different dimensions are 65 naming one of each). Rows are streamed one record
batch at a time; a bad vector is a counted skip like a bad text row: ``null_vector``,
``wrong_dim`` (another length), ``null_element`` (a null value inside it), ``non_finite_vector`` (NaN, inf, or a
float64 value beyond float32), ``vector_too_large`` (a squared norm beyond float32: ``squared_norm_overflows``); ids
as for text (``null_id``, ``invalid_utf8_id``, ``duplicate_id`` within a shard).

Every read goes through the text run's reader (pipeline/ingest/parquet.py): footers through
``_retrying``/``_read_error``, rows through ``stream_batches`` (pages streamed, checksums verified).
An OS read error is retried then 74, a corrupt page 65 naming the file, permission denied 66.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.int96 import arrow_schema
from petal.pipeline.ingest.parquet import (
    ReadStats,
    ShardInfo,
    _is_id,
    _read_error,
    _retrying,
    check_id_kinds,
    check_id_range,
    check_unique_columns,
    footer_sha256,
    plain_type,
    raise_problems,
    read_ids,
    stream_batches,
)
from petal.pipeline.ingest.partitions import partition_hint
from petal.pipeline.reliability.errors import BadInputError, NoInputError, quote_names
from petal.pipeline.reliability.faults import fault
from petal.pipeline.store.outputs import squared_norm_overflows

PROBE_ROWS = 256  # rows of a shard read in preflight to find its dimension (a list column)
VECTOR_REJECTS = ("null_vector", "wrong_dim", "null_element", "non_finite_vector", "vector_too_large", "null_id",
                  "invalid_utf8_id", "duplicate_id")


def _is_vector(t: pa.DataType) -> bool:
    """A vectors column's type; ``null`` too: pandas writes a column whose values are all None so (every row
    ``null_vector``, as in a list column of nulls). Integer values (int8 embeddings) are read as float32, as
    ``petal query --vector-file`` reads an integer array."""
    listish = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return pa.types.is_null(t) or (listish and (pa.types.is_floating(t.value_type)
                                                or pa.types.is_integer(t.value_type)))


def _lengths(values: pa.Array) -> pa.Array:
    """Each vector's length, null for a null vector (every one of a ``null``-typed column)."""
    return pa.nulls(len(values), pa.int32()) if pa.types.is_null(values.type) else pc.list_value_length(values)


def inspect_vector_shard(path: Path, read: ReadConfig, column: str,
                         stats: ReadStats | None = None) -> tuple[ShardInfo, int | None]:
    """One footer: ``(info, fixed size or None)``; ``BadInputError`` naming file, column and type. A read error is
    judged as a text run's (pipeline/ingest/parquet.py): permission denied 66, an OS error retried then 74."""
    def footer() -> tuple[os.stat_result, pq.FileMetaData, str]:
        fault("read_footer", str(path))
        # NOTE: no file object is left open; the footer's hash, as a text run's: a rerun reuses the shard's sha256
        # from its store entry (``same_file``) instead of reading every byte of it again
        return path.stat(), pq.read_metadata(path), footer_sha256(path)

    try:
        stat, meta, footer_hash = _retrying(footer, read, stats)
        schema = arrow_schema(meta)
    except (OSError, pa.ArrowException) as exc:
        raise _read_error(path, exc, read.read_retries, "not a readable Parquet file") from exc
    check_unique_columns(path, schema, [column, read.id_column, read.text_column])
    if column not in schema.names:
        raise BadInputError(f"{path}: vectors column {column!r} is missing (columns: {quote_names(schema.names)})"
                            + partition_hint(path, [column]))
    vtype = schema.field(column).type
    if not _is_vector(vtype):
        raise BadInputError(f"{path}: vectors column {column!r} has type {vtype}, expected list<float> or "
                            "fixed_size_list<float> (float16, float32, float64 or integers; raw bytes are not read: "
                            "write the vectors as a list column)")
    has_id = read.id_column in schema.names
    if not has_id and read.id_column_required:
        raise BadInputError(f"{path}: id column {read.id_column!r} is missing (columns: {quote_names(schema.names)})"
                            + partition_hint(path, [read.id_column]))
    id_type = plain_type(schema.field(read.id_column).type) if has_id else None  # a dictionary's: decoded as read
    if id_type is not None and not _is_id(id_type):
        raise BadInputError(f"{path}: id column {read.id_column!r} has type {id_type}, expected an integer or string")
    info = ShardInfo(path=path, abs_path=str(path.resolve()), size=stat.st_size, mtime_ns=stat.st_mtime_ns,
                     num_rows=meta.num_rows, num_row_groups=meta.num_row_groups, has_id_column=has_id,
                     id_type=str(id_type) if id_type is not None else "", text_type=str(vtype), schema=schema,
                     ctime_ns=stat.st_ctime_ns, inode=stat.st_ino, footer_sha256=footer_hash)
    check_id_range(info, meta, read, stats)  # NOTE: a uint64 id above 2^63-1 was a traceback (1) when stored
    return info, (vtype.list_size if pa.types.is_fixed_size_list(vtype) else None)


def _shard_dim(info: ShardInfo, read: ReadConfig, column: str, stats: ReadStats | None) -> int | None:
    """A list column's dimension in one shard: the most common length among the vectors of its first batch of
    ``PROBE_ROWS`` rows that holds any (ties: the first seen). An empty vector is no dimension and a stray length in
    the first row is not the shard's: both are ``wrong_dim`` rows. ``None``: the shard holds no vector."""
    def lengths(_row: int, batch: pa.RecordBatch) -> np.ndarray:
        found = pc.drop_null(_lengths(batch.column(0))).to_numpy(zero_copy_only=False)
        return found[found > 0]

    # NOTE: a small batch: only the first pages of each shard are read and decoded (a shard's first full batch, 16 MB
    # of 1024-d vectors, for every shard of a large corpus, before any work)
    probe = dataclasses.replace(read, batch_rows=min(read.batch_rows, PROBE_ROWS))
    for found in stream_batches(info, [column], probe, lengths, stats):
        if len(found):
            values, first, counts = np.unique(found, return_index=True, return_counts=True)
            return int(values[min(np.flatnonzero(counts == counts.max()), key=lambda i: first[i])])
    return None


def check_one_dim(column: str, dims: dict[str, int]) -> None:
    """65 naming a shard of each dimension when the shards' vectors have more than one (``dims``: by shard path):
    the vectors of one index have one dimension, and the shards of another were all ``wrong_dim`` skips before."""
    by_dim: dict[int, list[str]] = {}
    for path, dim in dims.items():
        by_dim.setdefault(dim, []).append(path)
    if len(by_dim) > 1:
        said = "; ".join(f"{dim} in {paths[0]}" + (f" and {len(paths) - 1} more shards" if len(paths) > 1 else "")
                         for dim, paths in by_dim.items())
        raise BadInputError(f"vectors column {column!r} has vectors of different dimensions: {said}; index the shards "
                            "of one dimension (another index for the others)")


def preflight_vectors(paths: list[Path], read: ReadConfig, column: str, stats: ReadStats | None = None,
                      dim_if_none: int | None = None,
                      check: Callable[[], None] | None = None) -> tuple[list[ShardInfo], int]:
    """Every shard's schema and the vectors' dimension, before any work. ``dim_if_none``: the dimension when no
    shard holds a vector (``--sync`` over a live version: its width); without it that is 66. ``check`` runs before
    each footer (``StopSignals.check``)."""
    infos, sizes, problems, unreadable = [], {}, [], []
    for path in paths:
        if check is not None:
            check()
        try:
            info, size = inspect_vector_shard(path, read, column, stats)
            infos.append(info)
            if size is not None:
                sizes[str(path)] = size
        except BadInputError as exc:
            problems.append(str(exc))
        except NoInputError as exc:  # permission denied
            unreadable.append(str(exc))
    raise_problems(unreadable, problems)
    check_one_dim(column, sizes)  # fixed sizes: before any row is read
    check_id_kinds(infos, read.id_column)
    for info in infos:  # NOTE: each shard's, not the first shard's alone: a shard of another dimension is 65
        if str(info.path) not in sizes:
            if check is not None:
                check()
            found = _shard_dim(info, read, column, stats)
            if found is not None:
                sizes[str(info.path)] = found
    check_one_dim(column, sizes)
    dim = next(iter(sizes.values()), None) or dim_if_none
    if not dim:
        raise NoInputError(f"vectors column {column!r} holds no vector in any shard")
    return infos, dim


@dataclass
class VectorBatch:
    rows: list[int]
    ids: list
    vectors: np.ndarray  # [len(rows), dim] float32
    rejects: list[tuple[int, str]] = field(default_factory=list)


def read_vectors(info: ShardInfo, read: ReadConfig, column: str, dim: int,
                 stats: ReadStats | None = None) -> Iterator[VectorBatch]:
    """One shard's good vectors and its bad rows, one record batch at a time (OS read errors retried and
    counted in ``stats``; a corrupt page 65 naming the file)."""
    columns = [column] + ([read.id_column] if info.has_id_column else [])

    def decode(start: int, batch: pa.RecordBatch) -> tuple[int, list, list[str | None], np.ndarray]:
        # NOTE: arrow and numpy only, no state: a retry after a read error decodes the batch again
        n = batch.num_rows
        ids = (read_ids(batch.column(1)) if info.has_id_column  # an id that is not UTF-8 as bytes: rejected
               else [f"{info.path}:{r}" for r in range(start, start + n)])
        values = batch.column(0)
        lengths = _lengths(values).to_numpy(zero_copy_only=False)
        null = pc.is_null(values).to_numpy(zero_copy_only=False)
        ok_len = ~null & (np.nan_to_num(lengths.astype(float), nan=-1) == dim)
        vectors = np.zeros((n, dim), dtype=np.float32)  # [n, dim] float32
        null_element = np.zeros(n, dtype=bool)
        if ok_len.any():
            flat = pc.list_flatten(values.filter(pa.array(ok_len)))  # [ok_len.sum() * dim]
            if flat.null_count:  # NOTE: to_numpy makes a null value NaN: such a row was a non_finite_vector
                null_element[ok_len] = pc.is_null(flat).to_numpy(zero_copy_only=False).reshape(-1, dim).any(axis=1)
            with np.errstate(over="ignore", invalid="ignore"):  # beyond float32 -> inf: the row is rejected below
                vectors[ok_len] = flat.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
        return start, ids, _vector_reasons(null, ok_len, null_element, vectors), vectors

    seen: set = set()
    for start, ids, vector_reasons, vectors in stream_batches(info, columns, read, decode, stats):
        out = VectorBatch([], [], vectors[:0])
        keep = []
        for i in range(len(ids)):
            row = start + i
            reason = ("null_id" if ids[i] is None else "invalid_utf8_id" if isinstance(ids[i], bytes)
                      else vector_reasons[i] or ("duplicate_id" if ids[i] in seen else None))
            if reason is not None:
                out.rejects.append((row, reason))
                continue
            seen.add(ids[i])
            out.rows.append(row)
            out.ids.append(ids[i])
            keep.append(i)
        out.vectors = vectors[keep]
        yield out


def _vector_reasons(null: np.ndarray, ok_len: np.ndarray, null_element: np.ndarray,
                    vectors: np.ndarray) -> list[str | None]:
    """Each row's reason to be skipped for its vector, ``None`` for a good one (``null``, ``ok_len``,
    ``null_element``: ``[n]`` bool; ``vectors``: ``[n, dim]`` float32, as read). ``vector_too_large`` is one bound
    for every metric, l2's: a store entry serves any (``petal rebuild --metric l2``, an additive run under another
    metric reuses it), and within it inner products stay finite too (``squared_norm_overflows``).

    NOTE: a finite vector whose squared norm float32 cannot hold was stored: an L2 search scored it inf and every
    query that met it was refused as 'too large for the index's vectors; scale it down', unit-length ones too."""
    finite = np.isfinite(vectors).all(axis=1)
    too_large = squared_norm_overflows(vectors)
    return ["null_vector" if null[i] else "wrong_dim" if not ok_len[i] else "null_element" if null_element[i]
            else "non_finite_vector" if not finite[i] else "vector_too_large" if too_large[i] else None
            for i in range(len(vectors))]
