"""Index files of a version directory, and reading/writing them without FAISS's chatter on stdout.

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
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from petal.pipeline.index.faiss_loader import load_faiss

INDEX_FILE = "index.faiss"
IVFDATA_FILE = "index.ivfdata"
IDS_FILE = "ids.parquet"
# NOTE: rows per row group of ids.parquet: a query decodes only the groups holding its hits (row_groups.py)
IDS_GROUP_ROWS = 16384


# NOTE: what FAISS prints on fd 1 for itself, never for the user: OnDiskInvertedLists.update_totsize's
# "resizing <path> to <n> bytes" (at every on-disk build) and the read hook's "IO_FLAG_ONDISK_SAME_DIR: updating
# ondisk filename from <a> to <b>" (petal no longer reads with that flag: mmap.read_ondisk)
FAISS_CHATTER = re.compile(rb"(resizing .* to \d+ bytes|IO_FLAG_ONDISK_SAME_DIR: updating ondisk filename from .*)")
# NOTE: fd 1 is one per process: two threads swapping it at once would each restore what the other put there
# (stdout left pointing at a capture file); one holder at a time
_FD1_LOCK = threading.Lock()


@contextlib.contextmanager
def faiss_stdout() -> Iterator[None]:
    """Catch what C++ code prints on fd 1 for the duration (stdout carries JSON lines); afterwards drop FAISS's
    own chatter (``FAISS_CHATTER``) and copy any other line to stderr, so no message is lost.

    Process-wide: use it only around FAISS calls known to print (the on-disk build), never on a query's path;
    another thread's writes to fd 1 in the meantime come out on stderr.
    """
    with _FD1_LOCK, tempfile.TemporaryFile() as caught:
        sys.stdout.flush()
        libc = ctypes.CDLL(None)
        saved = os.dup(1)
        try:
            os.dup2(caught.fileno(), 1)
            yield
        finally:
            # NOTE: flush C stdio before fd 1 points back at stdout, or buffered text lands there later.
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().splitlines(keepends=True)
                    if not FAISS_CHATTER.fullmatch(line.rstrip(b"\r\n"))]
            if kept:
                sys.stderr.flush()
                sys.stderr.buffer.write(b"".join(kept))
                sys.stderr.flush()


def write_index(index: Any, path: Path, catch_stdout: bool = False) -> None:
    """``faiss.write_index``; ``catch_stdout``: inside ``faiss_stdout`` (the on-disk build's index, whose lists FAISS
    may talk about). NOTE: not by default: it swaps fd 1 process-wide, so every in-memory build (``petal.index`` and
    ``petal.rebuild`` in a caller's process) sent the caller's other threads' stdout to stderr meanwhile."""
    faiss = load_faiss()
    if not catch_stdout:
        faiss.write_index(index, str(path))
        return
    with faiss_stdout():
        faiss.write_index(index, str(path))


def read_index(path: Path, storage: str) -> Any:
    """Load ``path`` memory-mapped where FAISS can; an on-disk index maps ``index.ivfdata`` from the
    same directory, read-only. A file FAISS cannot parse is a ``BadInputError`` (65), never a crash."""
    from petal.pipeline.index.mmap import read_index_mapped

    return read_index_mapped(path, storage)


def open_parquet(path: Path, read_dictionary: list[str] | None = None) -> Any:
    """``pyarrow.parquet.ParquetFile`` over a memory map of ``path`` (the footer read, O(1)); the mapping
    keeps the data readable after the version is pruned. A damaged footer: ``BadInputError`` (65); a map or read the
    host fails (ENOMEM, EMFILE, EIO, out of memory): ``PetalIOError`` (74, ``read_errors.py``).
    ``read_dictionary``: string columns decoded as dictionaries (one copy of each distinct value)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petal.pipeline.index.read_errors import read_failure

    try:
        # NOTE: page checksums (written by every petal writer) are verified as pages are decoded
        return pq.ParquetFile(pa.memory_map(str(path)), page_checksum_verification=True,
                              read_dictionary=read_dictionary)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_failure(path, "its Parquet footer", exc) from exc
    except KeyError as exc:  # NOTE: a footer without a column ``read_dictionary`` names (pyarrow's own KeyError)
        name = exc.args[0] if exc.args else ""
        shown = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        raise read_failure(path, "its Parquet footer", ValueError(f"no column {shown!r}")) from exc
    except UnicodeDecodeError as exc:  # NOTE: a column name that is not UTF-8 (pyarrow decodes the footer's names)
        raise read_failure(path, "its Parquet footer", ValueError(f"a column name is not UTF-8: {exc}")) from exc


def read_index_copied(path: Path, storage: str) -> Any:
    """``read_index`` without memory-mapping ``index.faiss``: the whole file read into memory (the pre-mmap
    behaviour); an on-disk index's lists are mapped as ``read_index`` maps them (``mmap.read_ondisk``)."""
    faiss = load_faiss()

    if storage == "ondisk":
        from petal.pipeline.index.mmap import read_ondisk

        return read_ondisk(path)
    if storage != "memory":
        raise ValueError(f"unknown index storage {storage!r} (memory or ondisk)")
    return faiss.read_index(str(path), 0)
