"""Index files of a version directory, and reading/writing them without FAISS's stdout chatter.

```
index.faiss     the FAISS index (for on-disk indexes: everything but the inverted lists)
index.ivfdata   the inverted lists of an on-disk IVF index (memory-mapped when searched)
ids.parquet     faiss_id -> document id, shard, row
```
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from petal.pipeline.index.faiss_loader import load_faiss

INDEX_FILE = "index.faiss"
IVFDATA_FILE = "index.ivfdata"
IDS_FILE = "ids.parquet"
# NOTE: rows per row group of ids.parquet: a query decodes only the groups holding its hits (row_groups.py)
IDS_GROUP_ROWS = 16384


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what C++ prints on fd 1 to fd 2 for the duration (stdout carries JSON lines).

    FAISS ``printf``s from ``OnDiskInvertedLists`` ("resizing ...", "IO_FLAG_ONDISK_SAME_DIR: ...").
    """
    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        # NOTE: flush C stdio before fd 1 points back at stdout, or buffered text lands there later.
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def write_index(index: Any, path: Path) -> None:
    faiss = load_faiss()

    with stdout_to_stderr():
        faiss.write_index(index, str(path))


def read_index(path: Path, storage: str) -> Any:
    """Load ``path`` memory-mapped where FAISS can; an on-disk index maps ``index.ivfdata`` from the
    same directory, read-only. A file FAISS cannot parse is a ``BadInputError`` (65), never a crash."""
    from petal.pipeline.index.mmap import read_index_mapped

    return read_index_mapped(path, storage)


def open_parquet(path: Path, read_dictionary: list[str] | None = None) -> Any:
    """``pyarrow.parquet.ParquetFile`` over a memory map of ``path`` (the footer read, O(1)); the mapping
    keeps the data readable after the version is pruned. Unreadable: ``BadInputError`` (65).
    ``read_dictionary``: string columns decoded as dictionaries (one copy of each distinct value)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petal.pipeline.reliability.errors import BadInputError

    try:
        # NOTE: page checksums (written by every petal writer) are verified as pages are decoded
        return pq.ParquetFile(pa.memory_map(str(path)), page_checksum_verification=True,
                              read_dictionary=read_dictionary)
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"{path}: cannot read its Parquet footer ({exc}); run petal verify") from exc


def read_index_copied(path: Path, storage: str) -> Any:
    """``read_index`` without memory-mapping: the whole file read into memory (the pre-mmap behaviour)."""
    faiss = load_faiss()

    if storage == "ondisk":
        # NOTE: the .faiss file records the absolute .ivfdata path of the staging directory it was
        # built in; ONDISK_SAME_DIR looks beside the .faiss file instead, so a version directory can
        # be renamed or copied. Its lists are mmapped by OnDiskInvertedLists itself: IO_FLAG_MMAP
        # on top crashes FAISS 1.15 at search time.
        flags = faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY
    elif storage == "memory":
        flags = 0
    else:
        raise ValueError(f"unknown index storage {storage!r} (memory or ondisk)")
    with stdout_to_stderr():
        return faiss.read_index(str(path), flags)
