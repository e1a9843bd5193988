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
    """Load ``path``; an on-disk index maps ``index.ivfdata`` from the same directory, read-only."""
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
