"""Damage that pyarrow reads past: a Parquet data page it skips without an error (tests of ``parquet_rows``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def skip_page(path: Path, group: int, column: str) -> None:
    """Make pyarrow skip the first data page of ``column`` in row group ``group`` of ``path``: the page type in its
    header (thrift compact: field 1, a zigzag varint; DATA_PAGE 0 -> -1, a type no reader knows). pyarrow drops
    such a page without an error or a look at its checksum: the column comes out short."""
    meta = pq.ParquetFile(path).metadata
    chunks = map(meta.row_group(group).column, range(meta.num_columns))
    at = next(c.data_page_offset for c in chunks if c.path_in_schema.split(".")[0] == column)
    blob = bytearray(path.read_bytes())
    assert blob[at] == 0x15 and blob[at + 1] in (0x00, 0x06), blob[at:at + 2]  # field 1, i32: DATA_PAGE(_V2)
    blob[at + 1] ^= 0x01
    path.write_bytes(bytes(blob))
    assert pq.ParquetFile(path).read_row_group(group, columns=[column]).num_rows < meta.row_group(group).num_rows
