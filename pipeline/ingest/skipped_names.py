"""The names a SOURCE skips, and why one that holds files names no shard: its ``*.parquet`` files lie under hidden
paths (``hidden_hint``: Spark's ``_temporary/``), or its files are not named ``*.parquet`` (``not_parquet_hint``:
``part-0.parq``, ``x.pq``, Hive's extension-less ``000000_0``). The hints are the error path only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from petal.pipeline.reliability.errors import quote_path

PARQUET_LIKE_SUFFIXES = (".parq", ".pq", "")  # NOTE: other tools' names for Parquet files, shown first
HIDDEN_PREFIXES = (".", "_")


def hidden_name(name: str) -> bool:
    """A name no directory or prefix SOURCE, and no wildcard, reads below its root: it starts with ``.`` or ``_``,
    as for pyarrow's datasets (``ignore_prefixes``), Spark and Hive (Spark's ``_temporary/`` attempts of a job still
    writing, Delta's ``_delta_log/*.checkpoint.parquet``, ``_SUCCESS``, ``_metadata``, editors' and copies'
    ``.name.parquet`` files). A name the user writes (a file, a glob's literal part, a wildcard part that is hidden
    itself, glob's rule for ``.`` extended to ``_``: ``data/_staging/*.parquet``, ``data/_*/*.parquet``) is read
    whatever it is."""
    return name.startswith(HIDDEN_PREFIXES)


def hidden_below(parts: list[str] | tuple[str, ...]) -> bool:
    """A file whose path below a directory SOURCE (``parts``: the names of each directory under it, then its own)
    has a hidden part (``hidden_name``): not a shard."""
    return any(hidden_name(part) for part in parts)


def hidden_hint(paths: Sequence[str], kind: str) -> str:
    """``""``, or "; N *.parquet files are under paths starting with '.' or '_', which a ``kind`` skips, e.g. ..." for
    the ``paths`` (sorted) a SOURCE (``kind``: "directory SOURCE", "prefix SOURCE", "glob") would name but for a
    hidden part."""
    if not paths:
        return ""
    said = "1 *.parquet file is" if len(paths) == 1 else f"{len(paths):,} *.parquet files are"
    return (f"; {said} under paths starting with '.' or '_', which a {kind} skips (Spark's _temporary/ of a job "
            f"still writing, editors' copies), e.g. {quote_path(paths[0])}: name such a file, or a glob that writes "
            "its hidden part ('data/_staging/*.parquet'), to read it")


def not_parquet_hint(paths: Sequence[str], kind: str) -> str:
    """``""``, or "; N files ... are skipped, e.g. 'd/a.parq': name ..." for the ``paths`` (sorted) a directory or
    prefix SOURCE (``kind``: "directory", "prefix") holds that are not named ``*.parquet``."""
    if not paths:
        return ""
    example = next((p for p in paths if PurePosixPath(p).suffix.lower() in PARQUET_LIKE_SUFFIXES), paths[0])
    parent, _, name = example.rpartition("/")  # NOTE: a URI's '//' kept (PurePosixPath folds s3://b to s3:/b)
    suffix = PurePosixPath(name).suffix
    glob = f" (or a glob such as {quote_path(f'{parent}/*{suffix}')})" if suffix and parent else ""
    said = "1 file that is" if len(paths) == 1 else f"{len(paths):,} files that are"
    return (f"; it holds {said} not named *.parquet, which a {kind} SOURCE skips, e.g. {quote_path(example)}: "
            f"name such a file{glob} to read it")
