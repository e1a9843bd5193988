"""Texts for ``petal embed --input``: a ``.parquet`` text column, ``.txt`` lines or ``.jsonl`` objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from petal.pipeline.reliability.errors import BadInputError, NoInputError, UsageError, quote_path

TEXT_FILE_SUFFIXES = (".parquet", ".txt", ".jsonl")


def read_texts(path: Path, text_column: str = "text",
               id_column: str | None = None) -> tuple[list[Any], list[Any] | None]:
    """Texts (``None`` for a null; bytes from a binary column) from ``.parquet`` (``text_column``, ids from
    ``id_column``), ``.txt`` (one per line) or ``.jsonl`` (``{"text": ..., "<id_column>": ...}``), and their ids
    (``None`` without ``id_column``). Null and blank texts are kept here: the caller's text rule skips them."""
    path = Path(path)
    if not path.is_file():
        raise NoInputError(f"--input {quote_path(path)} does not exist or is not a regular file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_texts(path, text_column, id_column)
    if suffix == ".txt":
        if id_column is not None:
            raise UsageError("--id-column goes with --input FILE.parquet or FILE.jsonl")
        # NOTE: bytes that are not UTF-8 are kept (surrogateescape), then replaced and counted by the caller
        return path.read_bytes().decode("utf-8", "surrogateescape").splitlines(), None
    if suffix == ".jsonl":
        return _jsonl_texts(path, id_column)
    raise UsageError(f"--input {quote_path(path)}: expected a .parquet, .txt or .jsonl file")


def _parquet_texts(path: Path, text_column: str, id_column: str | None) -> tuple[list[Any], list[Any] | None]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [text_column] + ([id_column] if id_column else [])
    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{quote_path(path)}: not a readable Parquet file: {exc}") from exc
    missing = [name for name in columns if name not in names]
    if missing:
        flags = {text_column: "--text-column", id_column: "--id-column"}
        said = ", ".join(f"{name!r} ({flags[name]})" for name in missing)
        raise BadInputError(f"{quote_path(path)}: no column {said}; it has {', '.join(map(repr, names))}")
    try:
        table = pq.read_table(path, columns=columns, page_checksum_verification=True)
    except (OSError, pa.ArrowException, KeyError) as exc:
        names = ", ".join(map(repr, columns))
        raise BadInputError(f"{quote_path(path)}: cannot read column(s) {names}: {exc}") from exc
    column_type = table.schema.field(text_column).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
            or pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)):
        raise BadInputError(f"{quote_path(path)}: text column {text_column!r} has type {column_type}, not text")
    ids = table.column(id_column).to_pylist() if id_column else None
    return table.column(text_column).to_pylist(), ids


def _jsonl_texts(path: Path, id_column: str | None) -> tuple[list[Any], list[Any] | None]:
    texts: list[Any] = []
    ids: list[Any] = []
    for lineno, line in enumerate(path.read_bytes().decode("utf-8", "surrogateescape").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            value = record["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BadInputError(f"{quote_path(path)}:{lineno}: expected a JSON object with a \"text\" field") from exc
        if value is not None and not isinstance(value, str):
            raise BadInputError(f"{quote_path(path)}:{lineno}: \"text\" is not a string")
        if id_column and id_column not in record:  # NOTE: never a silent null id: that row's output would lose it
            raise BadInputError(f"{quote_path(path)}:{lineno}: no {id_column!r} field (--id-column)")
        texts.append(value)
        ids.append(record[id_column] if id_column else None)
    return texts, ids if id_column else None
