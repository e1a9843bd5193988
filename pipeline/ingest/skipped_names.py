"""Why a directory or prefix SOURCE that holds files names no shard: its files are not named ``*.parquet``
(``part-0.parq``, ``x.pq``, Hive's extension-less ``000000_0``). The error path only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from petal.pipeline.reliability.errors import quote_path

PARQUET_LIKE_SUFFIXES = (".parq", ".pq", "")  # NOTE: other tools' names for Parquet files, shown first


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
