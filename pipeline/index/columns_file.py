"""The version's ``columns.parquet``: stored text and kept columns in FAISS id order, read per hit.

Written from the store entries' side files (``pipeline/store/columns.py``) in the order of
``StoreVectors`` (FAISS ids ``0..n-1``), streamed; an entry without a side file (its shard was gone
when the text was asked for) gets nulls. Readers locate a hit's row group from the footer and read
only the row groups that hold hits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.index.source import StoreVectors
from petal.pipeline.store.columns import ColumnsNeed, columns_path, entry_columns, version_schema
from petal.pipeline.store.embeddings import StoreEntry

COLUMNS_FILE = "columns.parquet"


def write_version_columns(entries: list[StoreEntry], dim: int, need: ColumnsNeed, path: Path) -> bool:
    """Write ``path`` for the vectors of ``entries``; ``False`` (nothing written) when no entry stores them."""
    schema = version_schema(entries, need)
    if schema is None:
        return False
    source = StoreVectors(entries, dim)  # the same selection (de-duplication, --delete) as the index
    with pq.ParquetWriter(path, schema) as writer:
        for entry, keep in zip(source.entries, source._keep):
            if len(keep) == 0:
                continue
            if _has(entry, need):
                for part in entry_columns(entry, keep.astype(np.int64), need.names):
                    writer.write_table(part.cast(schema))
            else:
                writer.write_table(pa.table({f.name: pa.nulls(len(keep), f.type) for f in schema}, schema=schema))
        if source.total == 0:
            writer.write_table(schema.empty_table())
    return True


def _has(entry: StoreEntry, need: ColumnsNeed) -> bool:
    path = columns_path(entry.path)
    return path.is_file() and set(need.names) <= set(pq.read_schema(path).names)


class ColumnsReader:
    """Stored columns of hits by FAISS id (only the row groups holding them are read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = pq.ParquetFile(path)
        self.names = self.file.schema_arrow.names
        sizes = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.starts = np.cumsum([0, *sizes])

    def rows(self, faiss_ids: list[int], names: list[str]) -> list[dict[str, Any]]:
        """``[{name: value}]`` per id of ``faiss_ids``."""
        names = [n for n in names if n in self.names]
        groups: dict[int, pa.Table] = {}
        out = []
        for fid in faiss_ids:
            group = int(np.searchsorted(self.starts, fid, side="right")) - 1
            if group not in groups:
                groups[group] = self.file.read_row_group(group, columns=names)
            row = groups[group].slice(fid - int(self.starts[group]), 1).to_pylist()
            out.append(row[0] if row else dict.fromkeys(names))
        return out
