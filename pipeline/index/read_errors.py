"""A failed read of a published version's file: damage in the file (65) or a failure of the host (74), told apart.

Opening, searching and ``petal verify`` read ``ids.parquet`` through pyarrow and ``index.faiss`` through FAISS. What
their errors say about the file:

- damage: pyarrow's decoding errors (an ``OSError`` without an errno: a bad footer, a page checksum, thrift,
  decompression; ``ArrowInvalid``, ``ArrowIndexError``, ... : values that do not fit their type), FAISS's parse
  errors (a ``RuntimeError`` whose message carries no system error): ``BadInputError`` (65), "rebuild it";
- the host: an ``OSError`` with an errno (EIO, EMFILE, ENFILE, ESTALE...) or the system's message of one (pyarrow's
  "Memory mapping file failed: Cannot allocate memory" carries no errno), out of memory
  (``MemoryError``, pyarrow's ``ArrowMemoryError``), a status pyarrow cannot name (``ArrowException`` itself: a
  worker thread that could not start), a read interrupted (``ArrowCancelled``), FAISS's "could not open/mmap ...:
  <system error>": ``PetalIOError`` (74, fix the host and retry), never "the version is corrupt": rebuilding an index
  that is whole costs hours and cures nothing; permission denied: 66 (``layout.denied``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from petal.pipeline.reliability.errors import BadInputError, PetalError, PetalIOError, one_line, quote_path

# NOTE: FAISS reports the system's errors in its RuntimeError's text ("could not open PATH for reading: Too many open
# files", "could not mmap PATH: Cannot allocate memory"): the strerror of the errors no damage to a file causes; not
# ENODEV, ENXIO, EOVERFLOW: a map of what a damaged file names (a device, a FIFO, an offset past the end)
_HOST_ERRNOS = (errno.EIO, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ENOSPC, errno.ESTALE,
                errno.ETIMEDOUT, errno.EINTR, errno.ENOBUFS)
HOST_STRERRORS = tuple(os.strerror(code) for code in _HOST_ERRNOS)
# NOTE: only where FAISS reports a system call's failure: a short read of a truncated file says "(Success)", or
# whatever errno an earlier call left
FAISS_SYSTEM_CALLS = ("could not open", "could not mmap", "read error in")


def host_os_error(path: Path, exc: OSError) -> PetalIOError | None:
    """74 naming ``path`` when ``exc`` is one of the host's errors (EIO, EMFILE, ENOMEM...), else ``None``: for a read
    whose other errors say what the file is (missing, not a regular file: 78 for a pointer or a manifest)."""
    if exc.errno not in _HOST_ERRNOS:
        return None
    return PetalIOError(f"cannot read {quote_path(path)}: {exc.strerror or os.strerror(exc.errno)}; the host failed, "
                        "not the file: free memory or file descriptors, or fix the disk, then retry")


def host_failure(exc: BaseException) -> str | None:
    """What failed on the host when ``exc`` is no sign of damage to the file read (out of memory, the system's
    error), else ``None``."""
    import pyarrow as pa

    if isinstance(exc, MemoryError):  # pyarrow's ArrowMemoryError is one
        return "out of memory"
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.strerror or os.strerror(exc.errno)
        # NOTE: pyarrow reports some system calls' failures without the errno: "Memory mapping file failed: Cannot
        # allocate memory" (ENOMEM: the address space or vm.max_map_count) was "the version is corrupt"
        return next((reason for reason in HOST_STRERRORS if reason in str(exc)), None)
    if type(exc) is pa.ArrowException or isinstance(exc, pa.ArrowCancelled):  # NOTE: 'Unknown error: Failed to
        return one_line(str(exc))[:200]  # launch worker thread' (out of threads) was 65, 'the version is corrupt'
    if isinstance(exc, RuntimeError):  # FAISS: the system's error at the end of its message
        text = str(exc)
        if not any(call in text for call in FAISS_SYSTEM_CALLS):
            return None
        return next((reason for reason in HOST_STRERRORS if reason in text), None)
    return None


def read_failure(path: Path, what: str, exc: BaseException) -> PetalError:
    """``exc``, raised reading ``what`` of ``path``, as the error of the contract: 66 permission denied, 74 the host
    failed (``host_failure``), else 65, the file is damaged."""
    from petal.pipeline.layout import denied, is_denied

    if is_denied(exc):
        return denied(path)
    reason = host_failure(exc)
    if isinstance(exc, MemoryError):
        # NOTE: a size read from a damaged body can also ask for more than any host has: said, not ruled out
        detail = one_line(str(exc)).strip()[:120] or type(exc).__name__
        return PetalIOError(f"{quote_path(path)}: cannot read {what}: out of memory ({detail}); free memory, then "
                            "retry (if memory is not short, run petal verify: a damaged file can ask for more)")
    if reason is not None:
        return PetalIOError(f"{quote_path(path)}: cannot read {what}: {reason}; the host failed, not the file: free "
                            "memory, threads or file descriptors, or fix the disk, then retry")
    detail = one_line(str(exc)).strip()[:200] or type(exc).__name__
    return BadInputError(f"{quote_path(path)}: cannot read {what} ({detail}); the version is corrupt: run petal "
                         "verify and rebuild it")
