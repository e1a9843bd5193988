"""Sources by URL scheme: ``s3://``, ``gs://``, ``hdfs://``, ... are not read yet (exit 66, saying so).

NOTE: kept apart from ``parquet.py`` so object-storage support replaces this one check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from petal.pipeline.reliability.errors import NoInputError

SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def source_scheme(source: str) -> str | None:
    """``"s3"`` for ``s3://bucket/key``; ``None`` for a local path (``file://`` counts as a scheme too)."""
    match = SCHEME_RE.match(source)
    return match.group(1).lower() if match else None


def check_sources(sources: Iterable[str]) -> None:
    """``NoInputError`` (exit 66) for a SOURCE with a URL scheme: only local paths are read for now."""
    for source in sources:
        scheme = source_scheme(str(source))
        if scheme is not None:
            raise NoInputError(f"source {source}: the {scheme}:// scheme is not supported yet; petal reads local "
                               "paths (files, directories, globs) only: copy or mount the shards locally")
