"""Cheap structural checks of an opened FAISS index: the parts FAISS trusts at search time.

FAISS range-checks list sizes while it parses a file (and, from 1.15, HNSW links), but not the
offsets of on-disk inverted lists, nor HNSW links in the older releases pyproject allows: a damaged
byte there (inside the body, past the head/tail checksums) would make a search read outside its
arrays. These checks cost O(lists + quantizer links), never O(vectors): an IVF index's HNSW coarse
quantizer has ``nlist`` nodes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.reliability.errors import BadInputError


def check_structure(index: Any, path: Path) -> None:
    """Raise ``BadInputError`` (65) naming ``path`` when an IVF index's quantizer graph or list table is
    inconsistent. Top-level HNSW indexes are not checked (their graph is O(vectors): ``petal verify``)."""
    faiss = load_faiss()
    check_parts(index, path)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return
    quantizer = faiss.downcast_index(ivf.quantizer)
    # NOTE: an IVF index built from no vectors (every document deleted) is left untrained: no centroids, no vectors
    if quantizer.ntotal != ivf.nlist and not (ivf.ntotal == 0 and quantizer.ntotal == 0 and not ivf.is_trained):
        _bad(path, f"the coarse quantizer holds {quantizer.ntotal} centroids for {ivf.nlist} lists")
    if isinstance(quantizer, faiss.IndexHNSW):
        _check_hnsw(faiss, quantizer.hnsw, int(quantizer.ntotal), path)
    invlists = faiss.downcast_InvertedLists(ivf.invlists)
    if isinstance(invlists, faiss.OnDiskInvertedLists):
        _check_ondisk(invlists, int(ivf.code_size), path)
    total = sum(int(invlists.list_size(i)) for i in range(ivf.nlist))
    if total != ivf.ntotal:
        _bad(path, f"its lists hold {total} vectors, its header says {ivf.ntotal}")


def check_parts(index: Any, path: Path) -> None:
    """Raise ``BadInputError`` (65) naming ``path`` when ``index`` (float or binary) lacks a part (``missing_part``)."""
    missing = missing_part(load_faiss(), index)
    if missing is not None:
        _bad(path, missing)


# the indexes a FAISS index holds (an IVF's quantizer, a graph's storage, a wrapped or refine index): none may be null
REQUIRED_PARTS = ("quantizer", "index", "base_index", "refine_index", "storage")


def missing_part(faiss: Any, index: Any) -> str | None:
    """What ``index`` (float or binary) lacks that FAISS dereferences at search time, else ``None``: an index inside
    it, or an IVF's inverted lists. NOTE: FAISS reads a ``null`` tag where a part's tag belongs (and ``il00`` for the
    lists) as no part at all, which parses: a damaged byte there was a crash at open (a NULL downcast, SystemError) or
    at the first search (HNSW without storage), where its neighbours' damage is a clear 65."""
    from petal.pipeline.index.mmap import index_parts  # NOTE: every part present; a null one is looked for here

    for part in index_parts(faiss, index):
        kind = type(part).__name__
        for name in REQUIRED_PARTS:
            if isinstance(getattr(type(part), name, None), property) and getattr(part, name) is None:
                return f"its {kind} has no {name} index (a null part where the file should hold one)"
        if isinstance(part, (faiss.IndexIVF, faiss.IndexBinaryIVF)) and part.invlists is None:
            return f"its {kind} has no inverted lists (a null list table where the file should hold one)"
    return None


def _check_hnsw(faiss: Any, hnsw: Any, ntotal: int, path: Path) -> None:
    neighbors = faiss.vector_to_array(hnsw.neighbors)
    offsets = faiss.vector_to_array(hnsw.offsets).astype(np.int64)
    levels = faiss.vector_to_array(hnsw.levels).astype(np.int64)
    per_level = faiss.vector_to_array(hnsw.cum_nneighbor_per_level).astype(np.int64)
    if len(offsets) != ntotal + 1 or len(levels) != ntotal or (ntotal and offsets[-1] != len(neighbors)):
        _bad(path, "the quantizer's HNSW graph tables do not fit its size")
    if ntotal == 0:
        return
    if levels.min() < 1 or levels.max() >= len(per_level) or not 0 <= hnsw.entry_point < ntotal:
        _bad(path, "the quantizer's HNSW graph has levels or an entry point out of range")
    if not np.array_equal(np.diff(offsets), per_level[levels]):
        _bad(path, "the quantizer's HNSW graph offsets do not match its levels")
    if len(neighbors) and (neighbors.min() < -1 or neighbors.max() >= ntotal):
        _bad(path, "the quantizer's HNSW graph links to nodes it does not have")


def _check_ondisk(invlists: Any, code_size: int, path: Path) -> None:
    lists = invlists.lists
    limit = int(invlists.totsize)
    # NOTE: FAISS maps ``totsize`` bytes whatever the file holds: a page of the mapping past the end of a shorter
    # index.ivfdata is a SIGBUS at search time, so the header's size is checked against the file's own
    try:
        held = os.stat(invlists.filename).st_size
    except OSError as exc:
        _bad(path, f"its list data {invlists.filename!r} cannot be read ({exc.strerror or exc})")
    if held < limit:
        _bad(path, f"index.ivfdata holds {held} bytes, its lists take {limit}")
    for i in range(lists.size()):
        entry = lists.at(i)
        if entry.size > entry.capacity or entry.offset + entry.capacity * (code_size + 8) > limit:
            _bad(path, f"on-disk list {i} points outside index.ivfdata ({limit} bytes)")


def _bad(path: Path, what: str) -> None:
    raise BadInputError(f"{path}: {what}; the index is corrupt, run petal verify and rebuild it")
