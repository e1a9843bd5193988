"""Finding Parquet shards, checking every footer and schema up front, streaming their rows.

Rows are read with ``ParquetFile.iter_batches`` (never a whole shard), only the id and text
columns, pages streamed through a small buffer (never a whole row group) and record batches sized
from the footer's byte counts, so host memory grows neither with shard size nor row-group size.
NOTE: it does grow with the largest data page: Parquet cannot read less than a page, and a writer
may put many large values in one page.

An OS read error (it carries an ``errno``: EIO, ESTALE, ...) is retried a bounded number of times,
resuming at the row it failed on, and counted; one that outlives its retries is an I/O error (74).
A decoding error (no ``errno``: bad magic, thrift, page data) is corruption (65) at once.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.remote import (
    RemotePath,
    is_denied,
    is_storage_error,
    is_uri,
    list_remote,
    stat_remote,
    storage_error,
)
from petal.pipeline.reliability.errors import BadInputError, NoInputError, PetalError, PetalIOError
from petal.pipeline.reliability.faults import fault

T = TypeVar("T")

TEXT_TYPES = "string, large_string, string_view (or binary holding UTF-8)"


def resolve_sources(sources: tuple[str, ...] | list[str]) -> list[Path | RemotePath]:
    """Files, directories (every ``*.parquet`` below, sorted), globs and object-storage URIs (an object or
    a prefix: pipeline/ingest/remote.py) -> sorted unique shard paths."""
    found: dict[str, Path | RemotePath] = {}
    for source in sources:
        if is_uri(source):
            for remote in list_remote(source):
                found.setdefault(remote.uri, remote)
            continue
        path = Path(source).expanduser()
        if path.is_dir():
            matches = [p for p in path.rglob("*.parquet") if p.is_file()]
            if not matches:
                raise NoInputError(f"no *.parquet files under directory {source}")
        elif path.is_file():
            matches = [path]
        elif glob.has_magic(source):
            matches = [Path(p) for p in glob.glob(os.path.expanduser(source), recursive=True) if Path(p).is_file()]
            if not matches:
                raise NoInputError(f"glob {source!r} matches no files")
        else:
            raise NoInputError(f"source {source} does not exist")
        for match in matches:
            found.setdefault(str(match.resolve()), match)
    if not found:
        raise NoInputError("no input shards")
    return [found[key] for key in sorted(found)]


@dataclass(frozen=True)
class ShardInfo:
    """One input shard as its footer describes it (read before any model work)."""

    path: Path | RemotePath  # as the user named it (display, ids); an object's safe URI for remote shards
    abs_path: str  # the shard's identity: its resolved path, or its URI
    size: int
    mtime_ns: int
    num_rows: int
    num_row_groups: int
    has_id_column: bool
    id_type: str  # Arrow type of the id column ("" when absent)
    text_type: str  # Arrow type of the text column


def _is_text(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or str(t) in ("string_view", "binary_view"))


def _is_id(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view"


@dataclass
class ReadStats:
    """What the reader recovered from: OS read errors that succeeded on a retry."""

    retries: int = 0


def _transient(exc: BaseException) -> bool:
    # NOTE: pyarrow raises OSError for corrupt pages too, but without an errno; only the operating
    # system's errors (EIO, ESTALE, ETIMEDOUT, ENOENT of a vanished file, ...) carry one, and object
    # storage's client errors (no errno, "AWS Error ..."), of which all but a refusal are retried.
    if is_storage_error(exc):
        return not is_denied(exc)
    return isinstance(exc, OSError) and exc.errno is not None


def _read_error(path: Path | RemotePath, exc: BaseException, retries: int, corrupt: str) -> PetalError:
    if is_denied(exc):
        return storage_error(f"cannot read {path}", exc)
    if _transient(exc):
        return PetalIOError(f"{path}: read error after {retries} retries ({exc}); "
                            "the file is unreadable now, not corrupt: rerun when the storage recovers")
    return BadInputError(f"{path}: {corrupt} ({exc})")


def _backoff(read: ReadConfig, retry: int, stats: ReadStats | None) -> None:
    if stats is not None:
        stats.retries += 1
    time.sleep(read.retry_delay_s * 2 ** (retry - 1))


def _retrying(call: Callable[[], T], read: ReadConfig, stats: ReadStats | None) -> T:
    retry = 0
    while True:
        try:
            return call()
        except OSError as exc:
            if not _transient(exc) or retry >= read.read_retries:
                raise
            retry += 1
            _backoff(read, retry, stats)


def _footer(path: Path | RemotePath) -> tuple[Any, pq.FileMetaData]:
    fault("read_footer", str(path))
    if isinstance(path, RemotePath):
        stat = stat_remote(path)
        with path.open() as fh:  # the footer only: ranged reads at the object's end
            return stat, pq.read_metadata(fh)
    return path.stat(), pq.read_metadata(path)


def inspect_shard(path: Path | RemotePath, read: ReadConfig, stats: ReadStats | None = None) -> ShardInfo:
    """Read one footer and check the schema. Raises ``BadInputError`` naming file, column and type."""
    try:
        stat, meta = _retrying(lambda: _footer(path), read, stats)
        schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        raise _read_error(path, exc, read.read_retries, "not a readable Parquet file") from exc
    names = schema.names
    if read.text_column not in names:
        raise BadInputError(
            f"{path}: text column {read.text_column!r} is missing (columns: {', '.join(names) or 'none'}); "
            "choose one with --text-column"
        )
    text_type = schema.field(read.text_column).type
    if not _is_text(text_type):
        raise BadInputError(f"{path}: text column {read.text_column!r} has type {text_type}, expected {TEXT_TYPES}")
    has_id = read.id_column in names
    if not has_id and read.id_column_required:
        raise BadInputError(
            f"{path}: id column {read.id_column!r} is missing (columns: {', '.join(names)}); "
            "choose one with --id-column"
        )
    id_type = schema.field(read.id_column).type if has_id else None
    if id_type is not None and not _is_id(id_type):
        raise BadInputError(f"{path}: id column {read.id_column!r} has type {id_type}, expected an integer or string")
    return ShardInfo(
        path=path,
        abs_path=path.uri if isinstance(path, RemotePath) else str(path.resolve()),
        size=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
        num_rows=meta.num_rows,
        num_row_groups=meta.num_row_groups,
        has_id_column=has_id,
        id_type=str(id_type) if id_type is not None else "",
        text_type=str(text_type),
    )


def preflight(paths: list[Path | RemotePath], read: ReadConfig, stats: ReadStats | None = None) -> list[ShardInfo]:
    """Every shard's footer and schema, checked before any model work; all problems in one error."""
    infos: list[ShardInfo] = []
    problems: list[str] = []
    for path in paths:
        try:
            infos.append(inspect_shard(path, read, stats))
        except BadInputError as exc:
            problems.append(str(exc))
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise BadInputError("; ".join(problems[:5]) + more)
    id_kinds = {("int" if "int" in s.id_type else "str") for s in infos if s.has_id_column}
    if len(id_kinds) > 1:
        raise BadInputError(
            f"id column {read.id_column!r} is an integer in some shards and a string in others: "
            + ", ".join(f"{s.path} ({s.id_type})" for s in infos if s.has_id_column)
        )
    return infos


@dataclass(frozen=True)
class RowBatch:
    """Consecutive rows of one shard: ``rows[i]`` is the row number of ``texts[i]``."""

    shard_index: int
    row_start: int
    ids: list  # document ids (int or str); synthesized "<shard>:<row>" when the shard has no id column
    texts: list  # str, bytes or None


def batch_rows(pf: pq.ParquetFile, column: str, read: ReadConfig) -> int:
    """Rows per record batch: ``read.batch_rows``, fewer when the footer says rows are large.

    NOTE: sized from each row group's average text bytes per row; one huge row among small ones
    can still make a batch larger than ``read.max_batch_bytes`` (never larger than its row group).
    """
    meta = pf.metadata
    per_row = 1
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema == column and group.num_rows:
                per_row = max(per_row, chunk.total_uncompressed_size // group.num_rows)
    return max(1, min(read.batch_rows, read.max_batch_bytes // per_row))


def _record_batches(info: ShardInfo, columns: list[str], read: ReadConfig, start_row: int) -> Iterator[pa.RecordBatch]:
    """The shard's record batches from row ``start_row`` on (a retry resumes where it failed)."""
    source = info.path.open() if isinstance(info.path, RemotePath) else info.path  # ranged reads, never a download
    with contextlib.closing(cast(Any, source)) if isinstance(info.path, RemotePath) else contextlib.nullcontext(), \
            pq.ParquetFile(source, buffer_size=read.read_buffer_bytes, pre_buffer=False) as pf:
        meta = pf.metadata
        starts = [0]
        for g in range(meta.num_row_groups):
            starts.append(starts[-1] + meta.row_group(g).num_rows)
        first = bisect.bisect_right(starts, start_row) - 1
        if first >= meta.num_row_groups:
            return
        skip = start_row - starts[first]
        size = batch_rows(pf, columns[0], read)
        for batch in pf.iter_batches(batch_size=size, columns=columns, row_groups=range(first, meta.num_row_groups)):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            yield batch.slice(skip) if skip else batch
            skip = 0


def _texts(column: pa.Array) -> list:
    """The text column as Python values; bytes for every row of a batch holding invalid UTF-8."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        # NOTE: pyarrow does not validate UTF-8 when it reads a string column; the rows are checked
        # (and the bad ones rejected) one by one in pipeline/ingest/documents.py.
        binary = {pa.large_string(): pa.large_binary(), pa.string_view(): pa.binary_view()}.get(column.type,
                                                                                               pa.binary())
        return column.view(binary).to_pylist()


def read_rows(shard_index: int, info: ShardInfo, read: ReadConfig,
              stats: ReadStats | None = None) -> Iterator[RowBatch]:
    """Stream one shard's (id, text) rows in record batches (see ``batch_rows``), retrying OS read errors."""
    columns = [read.text_column] + ([read.id_column] if info.has_id_column else [])
    row = 0
    retry = 0
    while True:
        try:
            for record_batch in _record_batches(info, columns, read, row):
                fault("read_batch", str(info.path))
                texts = _texts(record_batch.column(0))
                n = len(texts)
                if info.has_id_column:
                    ids = record_batch.column(1).to_pylist()
                else:
                    ids = [f"{info.path}:{r}" for r in range(row, row + n)]
                batch = RowBatch(shard_index, row, ids, texts)
                row, retry = row + n, 0
                yield batch
            return
        except (OSError, pa.ArrowException) as exc:
            if not _transient(exc) or retry >= read.read_retries:
                raise _read_error(info.path, exc, retry, f"cannot read rows from row {row}: corrupt data") from exc
            retry += 1
            _backoff(read, retry, stats)
