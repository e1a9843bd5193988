"""Opening ``index.faiss`` memory-mapped, so that an open costs O(1) in the index size.

FAISS 1.15 (``faiss.IO_FLAG_MMAP_IFC``) maps the file and uses the codes of flat-code indexes
(Flat, SQ, PQ, HNSW storage) and of in-memory IVF lists in place; the header, quantizer and list
sizes are parsed as usual. Measured here on a 200k x 384 float32 Flat index (307 MB): 0.30 s to
read it, 0.0003 s to map it. On-disk IVF indexes map ``index.ivfdata`` themselves
(``OnDiskInvertedLists``); combining their hook with ``IO_FLAG_MMAP_IFC`` fails in FAISS 1.15, so they
are read without their lists mapped and then mapped from the version directory (``read_ondisk``).

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
from petal.pipeline.index.files import IVFDATA_FILE
from petal.pipeline.reliability.errors import BadInputError, quote_path


def mmap_flags(storage: str) -> int:
    """The FAISS read flags for an index of ``storage`` ("memory" or "ondisk")."""
    faiss = load_faiss()
    if storage == "ondisk":
        # NOTE: the lists are not mapped by read_index (IO_FLAG_SKIP_IVF_DATA): read_ondisk maps them
        return faiss.IO_FLAG_SKIP_IVF_DATA | faiss.IO_FLAG_READ_ONLY
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


def read_ondisk(path: Path) -> Any:
    """An IVF index whose inverted lists are in ``index.ivfdata`` beside ``path``, those lists memory-mapped
    read-only; a file that is no such index, or lists that cannot be mapped: ``BadInputError`` (65).

    The file records the absolute ``index.ivfdata`` path of the staging directory it was built in. FAISS's
    ``IO_FLAG_ONDISK_SAME_DIR`` looks beside the file instead, but ``printf``s "IO_FLAG_ONDISK_SAME_DIR: updating
    ondisk filename from ... to ..." on fd 1 at every open (a query's output would carry it, and a redirect of fd 1
    is process-wide: not something a server's loader thread may do). So the lists are read without their data
    (``IO_FLAG_SKIP_IVF_DATA``), pointed at the version's own ``index.ivfdata`` (never the recorded path) and
    mapped here, as FAISS would have; FAISS prints nothing on this path.
    """
    faiss = load_faiss()
    try:
        index = faiss.read_index(str(path), mmap_flags("ondisk"))
    except (RuntimeError, MemoryError) as exc:
        raise BadInputError(f"{quote_path(path)}: FAISS cannot read it ({_message(exc)}); the index is corrupt, "
                            "run petal verify and rebuild it") from exc
    ivf = faiss.try_extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists) if ivf is not None and ivf.invlists is not None else None
    if not isinstance(lists, faiss.OnDiskInvertedLists):
        raise BadInputError(f"{quote_path(path)}: holds no on-disk inverted lists, though its manifest says the "
                            "index is on disk; the version is damaged: run petal verify and rebuild it")
    lists.filename = str(path.parent / IVFDATA_FILE)
    try:
        lists.do_mmap()
    except (RuntimeError, MemoryError) as exc:
        raise BadInputError(f"{quote_path(path.parent / IVFDATA_FILE)}: cannot be mapped ({_message(exc)}); the "
                            "index is corrupt, run petal verify and rebuild it") from exc
    return index


def _read(path: Path, storage: str) -> Any:
    from petal.pipeline.index.files import read_index_copied

    faiss = load_faiss()
    if storage == "ondisk":
        return read_ondisk(path)
    flags = mmap_flags(storage)
    try:
        return faiss.read_index(str(path), flags)
    except (RuntimeError, MemoryError) as mapped_error:
        if not flags & getattr(faiss, "IO_FLAG_MMAP_IFC", 0):
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
