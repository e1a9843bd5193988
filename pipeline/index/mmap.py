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

An on-disk inverted-list object inside ``index.faiss`` (FAISS's ``ilod``) records the absolute path of its data, and a
plain ``read_index`` opens and maps that path: a file under another manifest (re-signed to claim an in-memory index),
an IVF nested in a quantizer or a wrapper, could make petal open anything, and block for good on a FIFO. So no read
here follows such a path: every file is first read with ``IO_FLAG_SKIP_IVF_DATA`` (``no_recorded_paths``), and an
index holding on-disk lists the manifest does not say it has is refused (65) before any read that could map them.
Limit: FAISS reads an IVF's coarse quantizer without the caller's flags, so on-disk lists nested there (never
written by petal) are mapped by that first read, read-write (an open that never blocks, even on a FIFO), and then
refused.
"""

from __future__ import annotations

import mmap as _mmap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from petal.pipeline.index.faiss_layout import check_lengths
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.files import IVFDATA_FILE
from petal.pipeline.index.read_errors import host_failure, read_failure
from petal.pipeline.reliability.errors import BadInputError, PetalError, quote_path


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
    mapped here, as FAISS would have; FAISS prints nothing on this path. On-disk lists anywhere else in the file
    (an IVF quantizer, a wrapped index) are refused: nothing would map them.
    """
    faiss = load_faiss()
    check_lengths(path)
    try:
        index = faiss.read_index(str(path), mmap_flags("ondisk"))
    except (RuntimeError, MemoryError) as exc:
        if host_failure(exc) is not None:
            raise read_failure(path, "it with FAISS", exc) from exc
        if _nested_ondisk(exc):
            raise _kind_mismatch(path, "on-disk inverted lists besides the index's own", "on disk") from exc
        if _probe(faiss.read_index, path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY) is not None:
            raise _kind_mismatch(path, "in-memory inverted lists", "on disk") from exc
        raise BadInputError(f"{quote_path(path)}: FAISS cannot read it ({_message(exc)}); the index is corrupt, "
                            "run petal verify and rebuild it") from exc
    ivf = faiss.try_extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists) if ivf is not None and ivf.invlists is not None else None
    if not isinstance(lists, faiss.OnDiskInvertedLists):
        raise BadInputError(f"{quote_path(path)}: holds no on-disk inverted lists, though its manifest says the "
                            "index is on disk; the version is damaged: run petal verify and rebuild it")
    if len(_ondisk_lists(faiss, index)) > 1:
        raise _kind_mismatch(path, "on-disk inverted lists besides the index's own", "on disk")
    lists.filename = str(path.parent / IVFDATA_FILE)
    try:
        lists.do_mmap()
    except (RuntimeError, MemoryError) as exc:
        if host_failure(exc) is not None:  # NOTE: ENOMEM, EMFILE: the host's, not the file's
            raise read_failure(path.parent / IVFDATA_FILE, "its inverted lists (a memory map)", exc) from exc
        raise BadInputError(f"{quote_path(path.parent / IVFDATA_FILE)}: cannot be mapped ({_message(exc)}); the "
                            "index is corrupt, run petal verify and rebuild it") from exc
    return index


def _read(path: Path, storage: str) -> Any:
    from petal.pipeline.index.files import read_index_copied

    faiss = load_faiss()
    if storage == "ondisk":
        return read_ondisk(path)
    check_lengths(path)  # NOTE: before any read FAISS would allocate by a damaged length in
    flags = mmap_flags(storage)
    probed = no_recorded_paths(faiss.read_index, path, flags)
    if probed is not None:
        return probed
    try:
        return faiss.read_index(str(path), flags)
    except (RuntimeError, MemoryError) as mapped_error:
        if not flags & getattr(faiss, "IO_FLAG_MMAP_IFC", 0):
            raise faiss_failed(path, mapped_error) from mapped_error
    try:  # an index type FAISS does not map: read it whole
        return read_index_copied(path, storage)
    except (RuntimeError, MemoryError) as exc:
        raise faiss_failed(path, exc) from exc


def read_binary_index_mapped(path: Path) -> Any:
    """``faiss.read_index_binary`` memory-mapped (Hamming codes used in place); unreadable: ``BadInputError``."""
    faiss = load_faiss()
    check_lengths(path)
    mapped = getattr(faiss, "IO_FLAG_MMAP_IFC", 0) | faiss.IO_FLAG_READ_ONLY
    index = no_recorded_paths(faiss.read_index_binary, path, mapped)
    for flags in (mapped, 0) if index is None else ():
        try:
            index = faiss.read_index_binary(str(path), flags)
            break
        except (RuntimeError, MemoryError) as exc:
            error = exc
    if index is None:
        raise faiss_failed(path, error) from error
    from petal.pipeline.index.structure import check_parts

    check_parts(index, path)
    return index


def no_recorded_paths(read: Callable[[str, int], Any], path: Path, flags: int) -> Any:
    """Make sure that reading ``path`` as an in-memory index (``read``: ``faiss.read_index`` or
    ``read_index_binary``) opens no other file: ``BadInputError`` (65) when it holds on-disk inverted lists, whose
    data FAISS would map from the path recorded in the file. Returns the index when the first, data-less read is
    the whole index (no inverted lists in it: ``flags`` plus ``IO_FLAG_SKIP_IVF_DATA`` read it as ``flags`` does),
    else ``None``: the caller reads it with ``flags``, which now opens nothing else.

    FAISS reads in-memory lists with ``IO_FLAG_SKIP_IVF_DATA`` only through a hook: ``IO_FLAG_MMAP`` maps them from
    ``index.faiss`` itself (no other file). A list type neither read takes (``IVF...,FlatPanorama``), or a file
    FAISS cannot parse, leaves the bytes: a file without an on-disk list's tag (``ilod``) anywhere holds none
    (O(size), only for those).
    """
    faiss = load_faiss()
    skip = faiss.IO_FLAG_SKIP_IVF_DATA
    # NOTE: in-memory lists read through the hook (IO_FLAG_MMAP; IO_FLAG_SKIP_IVF_DATA alone before FAISS 1.12)
    # come back as on-disk ones mapped from index.faiss itself, without a file name: only a named one is refused
    index = _probe(read, path, flags | skip)
    if index is not None:
        if _recorded(faiss, index):
            raise _kind_mismatch(path, "on-disk inverted lists", "in memory")
        return None if any(_lists(faiss, part) is not None for part in index_parts(faiss, index)) else index
    index = _probe(read, path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if index is not None:
        if _recorded(faiss, index):
            raise _kind_mismatch(path, "on-disk inverted lists", "in memory")
        return None
    if _holds_tag(path, b"ilod") or _nested_ondisk(_probe_error(read, path, flags | skip)):
        raise BadInputError(f"{quote_path(path)}: FAISS cannot read it without mapping inverted lists from a path "
                            "recorded inside it (on-disk lists?), though its manifest says the index is in memory; "
                            "petal never follows such a path: the version is damaged, run petal verify and rebuild it")
    return None


def _probe(read: Callable[[str, int], Any], path: Path, flags: int) -> Any:
    try:
        return read(str(path), flags)
    except (RuntimeError, MemoryError):
        return None


def _probe_error(read: Callable[[str, int], Any], path: Path, flags: int) -> BaseException | None:
    try:
        read(str(path), flags)
    except (RuntimeError, MemoryError) as exc:
        return exc
    return None


def faiss_failed(path: Path, exc: BaseException) -> PetalError:
    """FAISS could not read ``path``: the file is damaged (65), or the host failed it (74: a file it could not
    open or map, ENOMEM, EMFILE; out of memory), never "the index is corrupt" then (``read_errors.py``)."""
    if host_failure(exc) is not None:
        return read_failure(path, "it with FAISS", exc)
    return BadInputError(f"{path}: FAISS cannot read it ({_message(exc)}); the index is corrupt, run petal verify "
                         "and rebuild it")


def _nested_ondisk(exc: BaseException | None) -> bool:
    """FAISS failed mapping on-disk lists: read with ``IO_FLAG_SKIP_IVF_DATA``, only lists nested in another index
    (an IVF's quantizer: FAISS reads it without the caller's flags) are mapped at all."""
    return exc is not None and "OnDiskInvertedLists" in str(exc)


def _kind_mismatch(path: Path, held: str, said: str) -> BadInputError:
    return BadInputError(f"{quote_path(path)}: holds {held}, though its manifest says the index is {said}; petal "
                         "never maps lists from a path recorded inside index.faiss: the version is damaged or its "
                         "manifest was rewritten, run petal verify and rebuild it")


# NOTE: the SWIG properties that hold an index, by name: reading every property of an index instead made SWIG print
# "swig/python detected a memory leak of type 'std::optional< bool > *'" on fd 1 (IndexHNSW.use_visited_hashset),
# into petal query's --json output
INDEX_FIELDS = ("quantizer", "index", "base_index", "refine_index", "storage", "index_ivf", "sub_index", "q1")


def index_parts(faiss: Any, index: Any) -> Iterator[Any]:
    """``index`` and every index inside it (an IVF's quantizer, a wrapped, refine or storage index...): each
    ``INDEX_FIELDS`` property of a FAISS index that holds an index, followed."""
    seen: set[int] = set()
    stack = [index]
    while stack:
        part = stack.pop()
        part = faiss.downcast_IndexBinary(part) if isinstance(part, faiss.IndexBinary) else faiss.downcast_index(part)
        key = int(part.this)
        if key in seen:
            continue
        seen.add(key)
        yield part
        for name in INDEX_FIELDS:
            if not isinstance(getattr(type(part), name, None), property):
                continue
            try:
                value = getattr(part, name)
            except Exception:  # NOTE: a SWIG getter FAISS cannot answer holds no index
                continue
            if isinstance(value, (faiss.Index, faiss.IndexBinary)):
                stack.append(value)
            elif name == "q1" and getattr(value, "quantizer", None) is not None:  # Index2Layer's Level1Quantizer
                stack.append(value.quantizer)


def _lists(faiss: Any, part: Any) -> Any:
    """The inverted lists of an IVF part (float or binary), downcast; ``None`` for any other index."""
    if not isinstance(part, (faiss.IndexIVF, faiss.IndexBinaryIVF)) or part.invlists is None:
        return None
    return faiss.downcast_InvertedLists(part.invlists)


def _ondisk_lists(faiss: Any, index: Any) -> list[Any]:
    """Every on-disk inverted-list object inside ``index``."""
    return [lists for part in index_parts(faiss, index)
            if isinstance(lists := _lists(faiss, part), faiss.OnDiskInvertedLists)]


def _recorded(faiss: Any, index: Any) -> bool:
    """Whether ``index`` holds on-disk lists that name a file (read without their data: nothing was opened)."""
    return any(str(lists.filename) for lists in _ondisk_lists(faiss, index))


def _holds_tag(path: Path, tag: bytes) -> bool:
    """Whether ``tag`` occurs anywhere in ``path`` (read through a read-only map)."""
    with open(path, "rb") as fh:
        if not fh.seek(0, 2):
            return False
        with _mmap.mmap(fh.fileno(), 0, access=_mmap.ACCESS_READ) as mapped:
            return mapped.find(tag) >= 0


def _message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:200] if text else type(exc).__name__
