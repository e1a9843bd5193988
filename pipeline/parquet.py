"""Finding Parquet shards, checking every footer and schema up front, streaming their rows.

Rows are read with ``ParquetFile.iter_batches`` (never a whole shard), only the id and text
columns, so host memory does not grow with shard size.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import ReadConfig
from pipeline.errors import BadInputError, NoInputError

TEXT_TYPES = "string, large_string, string_view (or binary holding UTF-8)"


def resolve_sources(sources: tuple[str, ...] | list[str]) -> list[Path]:
    """Files, directories (every ``*.parquet`` below, sorted) and globs -> sorted unique shard paths."""
    found: dict[str, Path] = {}
    for source in sources:
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

    path: Path  # as the user named it (display, ids)
    abs_path: str
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


def inspect_shard(path: Path, read: ReadConfig) -> ShardInfo:
    """Read one footer and check the schema. Raises ``BadInputError`` naming file, column and type."""
    try:
        stat = path.stat()
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{path}: not a readable Parquet file ({exc})") from exc
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
        abs_path=str(path.resolve()),
        size=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
        num_rows=meta.num_rows,
        num_row_groups=meta.num_row_groups,
        has_id_column=has_id,
        id_type=str(id_type) if id_type is not None else "",
        text_type=str(text_type),
    )


def preflight(paths: list[Path], read: ReadConfig) -> list[ShardInfo]:
    """Every shard's footer and schema, checked before any model work; all problems in one error."""
    infos: list[ShardInfo] = []
    problems: list[str] = []
    for path in paths:
        try:
            infos.append(inspect_shard(path, read))
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


def read_rows(shard_index: int, info: ShardInfo, read: ReadConfig) -> Iterator[RowBatch]:
    """Stream one shard's (id, text) rows in record batches of ``read.batch_rows``."""
    columns = [read.text_column] + ([read.id_column] if info.has_id_column else [])
    try:
        pf = pq.ParquetFile(info.path)
        row = 0
        for record_batch in pf.iter_batches(batch_size=read.batch_rows, columns=columns):
            texts = record_batch.column(0).to_pylist()
            n = len(texts)
            if info.has_id_column:
                ids = record_batch.column(1).to_pylist()
            else:
                ids = [f"{info.path}:{r}" for r in range(row, row + n)]
            yield RowBatch(shard_index, row, ids, texts)
            row += n
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{info.path}: cannot read rows ({exc})") from exc
