"""Texts for ``petal embed --input``: a ``.parquet`` text column, ``.txt`` lines or ``.jsonl`` objects.

Every read goes through the readers of ``petal index`` (pipeline/ingest/parquet.py): an OS read error (EIO) is
retried then 74, permission denied 66 at once, and a Parquet file that does not decode 65, naming the file (and for
a damaged page the row its batch starts at, the row group and the column), never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.partitions import partition_hint
from petal.pipeline.ingest.text_rule import UTF8_BOM, utf8_or_bytes
from petal.pipeline.reliability.errors import BadInputError, NoInputError, UsageError, quote_names, quote_path
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.safe_files import name_suffix

if TYPE_CHECKING:
    from petal.pipeline.ingest.parquet import ReadStats

TEXT_FILE_SUFFIXES = (".parquet", ".txt", ".jsonl")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # the ids petal stores (pipeline/ingest/parquet.py)


def read_texts(path: Path, text_column: str = "text", id_column: str | None = None,
               read: ReadConfig | None = None, stats: ReadStats | None = None) -> tuple[list[Any], list[Any] | None]:
    """Texts (``None`` for a null; bytes from a binary column) from ``.parquet`` (``text_column``, ids from
    ``id_column``), ``.txt`` (one per ``\\n``-ended line; a line that is not UTF-8 as bytes) or ``.jsonl``
    (``{"<text_column>": ..., "<id_column>": ...}``, one per line), and their ids (``None`` without
    ``id_column``). Null, blank and undecodable texts are kept here, in their places: the caller's text rule skips
    them.
    ``read``: retries (OS read errors are counted in ``stats``) and batch sizes, as ``petal index`` reads."""
    path = Path(path)
    if not path.is_file():
        raise NoInputError(f"--input {quote_path(path)} does not exist or is not a regular file")
    read = read or ReadConfig()
    suffix = name_suffix(path)
    if suffix not in TEXT_FILE_SUFFIXES:
        raise UsageError(f"--input {quote_path(path)}: expected a .parquet, .txt or .jsonl file")
    check_columns(text_column, id_column)
    if suffix == ".txt" and id_column is not None:
        raise UsageError("--id-column goes with --input FILE.parquet or FILE.jsonl")
    texts: list[Any] = []
    ids: list[Any] = []
    for batch_texts, batch_ids in text_file_batches(path, text_column, id_column, read, stats):
        texts.extend(batch_texts)
        ids.extend(batch_ids)
    return texts, ids if id_column is not None else None


def check_columns(text_column: str, id_column: str | None) -> None:
    """An empty ``text_column`` or ``id_column`` names no column: ``UsageError`` (2) naming the flag, as ``petal
    index``'s ``ReadConfig``. NOTE: ``""`` was read as no id column where ``None`` is (``if id_column``): the ids were
    dropped, silently, while the caller waited for them (``petal embed``: an IndexError traceback)."""
    for flag, name in (("--text-column", text_column), ("--id-column", id_column)):
        if name == "":
            raise UsageError(f"{flag} must not be empty: no column or key has that name"
                             + ("; leave the flag out for no ids" if flag == "--id-column" else ""))


def text_file_batches(path: Path, text_column: str = "text", id_column: str | None = None,
                      read: ReadConfig | None = None, stats: ReadStats | None = None) -> Iterator[tuple[list, list]]:
    """An ``--input``'s texts and ids (``[]`` without ``id_column``) a window at a time, read and checked as
    ``read_texts`` does: a ``.parquet`` a record batch at a time (``parquet_text_batches``), a ``.txt`` or ``.jsonl``
    the lines that end in each piece of ``read.max_batch_bytes`` (``_line_windows``; a longer line is held whole, as
    a Parquet value is), so what is held does not grow with the file. A bad ``.jsonl`` line is 65 naming the file
    and line once its window is read. Nothing is read before the first ``next()``."""
    check_columns(text_column, id_column)
    read = read or ReadConfig()
    suffix = name_suffix(path)
    if suffix == ".parquet":
        yield from parquet_text_batches(path, text_column, id_column, read, stats)
        return
    for lineno, lines in _line_windows(path, read, stats):
        if suffix == ".txt":
            # NOTE: a line that is not UTF-8 stays bytes, as a binary column's value: the caller's text rule skips it
            yield [utf8_or_bytes(line) for line in lines], []
        else:
            yield _jsonl_records(path, lines, lineno, text_column, id_column)


def _line_windows(path: Path, read: ReadConfig, stats: ReadStats | None) -> Iterator[tuple[int, list[bytes]]]:
    """The lines of a file, with the number of the first, those that end in each piece of ``read.max_batch_bytes``
    read. Lines are split at ``\\n`` only (a ``\\r`` before it dropped), as ``--stdin`` is read: never at the other
    line boundaries of ``str.splitlines`` (U+2028, U+0085, form feed, ...), which a text or a JSON string may hold,
    so one line is one input and no row after it shifts; a last line without ``\\n`` is a line. A UTF-8 byte order
    mark that starts the file is dropped (``UTF8_BOM``). Each piece is read at its offset, an OS read error retried
    then 74 (permission denied 66), as every source read."""
    from petal.pipeline.ingest.parquet import read_retrying

    size = max(1, read.max_batch_bytes)
    fd = read_retrying(path, lambda: os.open(path, os.O_RDONLY | os.O_CLOEXEC), read, stats, "cannot read it")
    try:
        offset, lineno, first = 0, 1, True
        held: list[bytes] = []  # NOTE: the start of a line that no piece read so far ends
        while True:

            def piece(at: int = offset) -> bytes:
                fault("read_batch", str(path))
                return os.pread(fd, size, at)

            chunk = read_retrying(path, piece, read, stats, "cannot read it")
            end = chunk.rfind(b"\n") if chunk else len(chunk)
            if end < 0:
                held.append(chunk)
                offset += len(chunk)
                continue
            data = b"".join([*held, chunk[:end]])
            held = [chunk[end + 1:]] if end + 1 < len(chunk) else []
            if first:
                data, first = data.removeprefix(UTF8_BOM), False
            if chunk or data:  # NOTE: at the end, the last line when it has no "\n"
                lines = [line[:-1] if line.endswith(b"\r") else line for line in data.split(b"\n")]
                del data
                yield lineno, lines
                lineno += len(lines)
            if not chunk:
                return
            offset += len(chunk)
    finally:
        os.close(fd)


def parquet_text_batches(path: Path, text_column: str, id_column: str | None, read: ReadConfig | None = None,
                         stats: ReadStats | None = None) -> Iterator[tuple[list[Any], list[Any]]]:
    """A ``.parquet`` ``--input``'s texts and ids (``[]`` without ``id_column``) a record batch at a time (batches
    of ``read``), checked as ``read_texts`` checks them; nothing is read before the first ``next()``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petal.pipeline.ingest.int96 import arrow_schema
    from petal.pipeline.ingest.parquet import (
        ShardInfo,
        _is_id,
        _is_text,
        _texts,
        check_id_range,
        check_unique_columns,
        first_undecodable,
        plain_type,
        read_ids,
        read_retrying,
        stream_batches,
    )

    def footer() -> tuple[Any, pq.FileMetaData]:
        fault("read_footer", str(path))
        return path.stat(), pq.read_metadata(path)

    read = read or ReadConfig()
    stat, meta = read_retrying(path, footer, read, stats, "not a readable Parquet file")
    try:
        schema = arrow_schema(meta)
    except (pa.ArrowException, ValueError) as exc:
        raise BadInputError(f"{quote_path(path)}: not a readable Parquet file ({exc})") from exc
    names = schema.names
    # NOTE: ``--id-column`` may name the text column (the text is the id, as a .jsonl's "text" key may be): read once
    columns = [text_column] + ([id_column] if id_column is not None and id_column != text_column else [])
    missing = [name for name in columns if name not in names]
    if missing:
        flags = {id_column: "--id-column", text_column: "--text-column"}
        said = ", ".join(f"{name!r} ({flags[name]})" for name in missing)
        raise BadInputError(f"{quote_path(path)}: no column {said}; it has {quote_names(names)}"
                            + partition_hint(path, missing))
    check_unique_columns(path, schema, columns)  # NOTE: two columns of one name were a KeyError traceback
    column_type = plain_type(schema.field(text_column).type)  # a dictionary (categorical): its values
    if not _is_text(column_type):
        raise BadInputError(f"{quote_path(path)}: text column {text_column!r} has type {column_type}, not text")
    id_type = plain_type(schema.field(id_column).type) if id_column is not None else None
    if id_type is not None and not _is_id(id_type):  # NOTE: as petal index's ids: bytes were echoed as "b'\\xff'"
        raise BadInputError(f"{quote_path(path)}: id column {id_column!r} has type {id_type}, expected an integer or "
                            "string")
    info = ShardInfo(path=path, abs_path=str(path.resolve()), size=stat.st_size, mtime_ns=stat.st_mtime_ns,
                     num_rows=meta.num_rows, num_row_groups=meta.num_row_groups, has_id_column=id_column is not None,
                     id_type=str(id_type or ""), text_type=str(column_type), schema=schema, ctime_ns=stat.st_ctime_ns,
                     inode=stat.st_ino)
    if id_column is not None:  # NOTE: a uint64 id above 2^63-1 was written out (exit 0) where petal index refuses it
        check_id_range(info, meta, read, stats, id_column)

    def decode(_row: int, batch: pa.RecordBatch) -> tuple[list[Any], list[Any]]:
        return _texts(batch.column(0)), read_ids(batch.column(len(columns) - 1)) if id_column is not None else []

    row = 0
    for batch_texts, batch_ids in stream_batches(info, columns, read, decode, stats):
        bad = first_undecodable(batch_ids)
        if bad is not None:  # NOTE: an id is echoed with its embedding: one that is no text cannot be
            raise BadInputError(f"{quote_path(path)}: id column {id_column!r} holds bytes that are not UTF-8 at row "
                                f"{row + bad}; ids are text or integers")
        row += len(batch_texts)
        yield batch_texts, batch_ids


def _jsonl_records(path: Path, raw_lines: list[bytes], first_lineno: int, text_column: str,
                   id_column: str | None) -> tuple[list[Any], list[Any]]:
    """The texts and ids (``[]`` without ``id_column``) of ``.jsonl`` lines, the first being line ``first_lineno``
    of ``path``: a blank line holds none; a bad one is ``BadInputError`` naming the file and line."""
    texts: list[Any] = []
    ids: list[Any] = []
    for lineno, raw in enumerate(raw_lines, start=first_lineno):
        # NOTE: bytes that are not UTF-8 are kept (surrogateescape): the caller's text rule skips such a text
        line = raw.decode("utf-8", "surrogateescape")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            value = record[text_column]
        except ValueError as exc:
            if isinstance(exc, json.JSONDecodeError):
                raise BadInputError(f"{quote_path(path)}:{lineno}: expected a JSON object with a "
                                    f"{json.dumps(text_column)} field (--text-column)") from exc
            # NOTE: an integer of over 4,300 digits (sys.int_max_str_digits) is a plain ValueError: a traceback
            raise BadInputError(f"{quote_path(path)}:{lineno}: a number of more than {sys.get_int_max_str_digits()} "
                                "digits, more than an integer read from JSON may have") from exc
        except (KeyError, TypeError, RecursionError) as exc:  # NOTE: '[[[[...': RecursionError
            raise BadInputError(f"{quote_path(path)}:{lineno}: expected a JSON object with a {json.dumps(text_column)} "
                                "field (--text-column)") from exc
        if value is not None and not isinstance(value, str):
            raise BadInputError(f"{quote_path(path)}:{lineno}: {json.dumps(text_column)} is not a string")
        # NOTE: never a silent null id: that row's output would lose it
        if id_column is not None and id_column not in record:
            raise BadInputError(f"{quote_path(path)}:{lineno}: no {id_column!r} field (--id-column)")
        texts.append(value)
        if id_column is not None:
            ids.append(_jsonl_id(record[id_column], path, lineno, id_column))
    return texts, ids


def _jsonl_id(value: Any, path: Path, lineno: int, id_column: str) -> Any:
    """A ``.jsonl`` id as a ``.parquet`` id column holds them: an integer, a string (valid UTF-8: JSON's ``\\ud800``
    escape gives a lone surrogate) or null; anything else is ``BadInputError`` naming the file, line and key, an
    integer beyond int64 included (as ``petal index`` refuses a uint64 id above 2^63-1: the ids petal stores)."""
    where = f"{quote_path(path)}:{lineno}: {id_column!r} (--id-column)"
    if value is None:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if INT64_MIN <= value <= INT64_MAX:
            return value
        # NOTE: was written out as it was (exit 0); a number of up to 4,300 digits is cut in the message
        shown = str(value) if abs(value) < 10 ** 40 else f"{str(value)[:24]}... ({len(str(abs(value)))} digits)"
        side, bound = ("above the largest", INT64_MAX) if value > 0 else ("below the smallest", INT64_MIN)
        raise BadInputError(f"{where} is {shown}, {side} id petal stores ({bound}, int64); write the ids as int64 "
                            "or as strings")
    if not isinstance(value, str):
        raise BadInputError(f"{where} is a {type(value).__name__}, expected an integer or string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInputError(f"{where} is not UTF-8 (it holds a lone surrogate, {json.dumps(value)[:80]})") from None
    return value
