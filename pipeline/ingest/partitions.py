"""Hive-style partition directories (``year=2024/part-0.parquet``): petal reads a shard's own columns only, so a
column a flag names that is there only as a directory ``NAME=VALUE`` of the shard's path is missing; its error says
why (the hint below) instead of leaving a user to wonder where the column went."""

from __future__ import annotations

from collections.abc import Iterable

from petal.pipeline.reliability.errors import quote_text


def partition_hint(path: object, missing: Iterable[str]) -> str:
    """``""``, or "; 'year' is a partition directory of the path ..." for the first of ``missing`` that the shard's
    path (a ``Path``, a URI) names as a ``NAME=VALUE`` directory."""
    parts = str(path).replace("\\", "/").split("/")[:-1]
    for name in missing:
        part = next((p for p in parts if p.startswith(f"{name}=")), None)
        if part is not None:
            return (f"; {name!r} is only a partition directory of its path ({quote_text(part)}): petal reads the "
                    "columns inside each file, not values of directory names; write it into the files to keep or "
                    "use it")
    return ""
