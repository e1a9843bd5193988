"""Opening ``index.faiss`` memory-mapped, so that an open costs O(1) in the index size.

FAISS 1.15 (``faiss.IO_FLAG_MMAP_IFC``) maps the file and uses the codes of flat-code indexes
(Flat, SQ, PQ, HNSW storage) and of in-memory IVF lists in place; the header, quantizer and list
sizes are parsed as usual. Measured here on a 200k x 384 float32 Flat index (307 MB): 0.30 s to
read it, 0.0003 s to map it. On-disk IVF indexes map ``index.ivfdata`` themselves
(``OnDiskInvertedLists``); combining their hook with ``IO_FLAG_MMAP_IFC`` fails in FAISS 1.15, so
they keep ``IO_FLAG_ONDISK_SAME_DIR | IO_FLAG_READ_ONLY``.

# NOTE: a mapped file must not change under a running query process: versions are immutable and
# removed by rename + unlink (the mapping stays valid), but truncating a live version's file in
# place would make the next page fault a SIGBUS. Tampering inside the body of a mapped file
# (not seen by the head/tail check) gives garbage scores or ids: ids are range-checked before they
# are used (``IndexReader.search``), an IVF index's quantizer graph and on-disk list table are checked
# (``structure.py``), scores are not; ``petal verify`` finds such changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.reliability.errors import BadInputError


def mmap_flags(storage: str) -> int:
    """The FAISS read flags for an index of ``storage`` ("memory" or "ondisk")."""
    faiss = load_faiss()
    if storage == "ondisk":
        # NOTE: the .faiss file records the absolute .ivfdata path of the staging directory it was
        # built in; ONDISK_SAME_DIR looks beside the .faiss file instead, so a version directory can
        # be renamed or copied. Its lists are mmapped by OnDiskInvertedLists itself: IO_FLAG_MMAP
        # on top crashes FAISS 1.15 at search time.
        return faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY
    if storage == "memory":
        return getattr(faiss, "IO_FLAG_MMAP_IFC", 0) | faiss.IO_FLAG_READ_ONLY
    raise ValueError(f"unknown index storage {storage!r} (memory or ondisk)")


def read_index_mapped(path: Path, storage: str) -> Any:
    """``faiss.read_index`` with ``mmap_flags`` (a plain read where mapping is refused), then the cheap
    structural checks of ``pipeline/index/structure.py``."""
    from petal.pipeline.index.structure import check_structure

    index = _read(path, storage)
    check_structure(index, path)
    return index


def _read(path: Path, storage: str) -> Any:
    from petal.pipeline.index.files import read_index_copied, stdout_to_stderr

    faiss = load_faiss()
    flags = mmap_flags(storage)
    try:
        with stdout_to_stderr():
            return faiss.read_index(str(path), flags)
    except (RuntimeError, MemoryError) as mapped_error:
        if storage == "ondisk" or not flags & getattr(faiss, "IO_FLAG_MMAP_IFC", 0):
            raise BadInputError(f"{path}: FAISS cannot read it ({_message(mapped_error)}); the index is "
                                "corrupt, run petal verify and rebuild it") from mapped_error
    try:  # an index type FAISS does not map: read it whole
        return read_index_copied(path, storage)
    except (RuntimeError, MemoryError) as exc:
        raise BadInputError(f"{path}: FAISS cannot read it ({_message(exc)}); the index is corrupt, "
                            "run petal verify and rebuild it") from exc


def read_binary_index_mapped(path: Path) -> Any:
    """``faiss.read_index_binary`` memory-mapped (Hamming codes used in place); unreadable: ``BadInputError``."""
    faiss = load_faiss()
    for flags in (getattr(faiss, "IO_FLAG_MMAP_IFC", 0) | faiss.IO_FLAG_READ_ONLY, 0):
        try:
            return faiss.read_index_binary(str(path), flags)
        except (RuntimeError, MemoryError) as exc:
            error = exc
    raise BadInputError(f"{path}: FAISS cannot read it ({_message(error)}); the index is corrupt, run petal verify "
                        "and rebuild it") from error


def _message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:200] if text else type(exc).__name__
