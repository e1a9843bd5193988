"""Adding the store's vectors to a trained index: in memory, or as IVF parts merged on disk.

In memory on the CPU, chunks go straight into the index. Everything else works in *parts*: a
copy of the trained, empty index (on a GPU when there is one) takes up to ``part_rows`` vectors,
then is merged into the in-memory index (``merge_from``) or written to a part file. On disk, the
part files are merged into one ``index.ivfdata`` by FAISS's ``merge_ondisk``, so the inverted
lists never have to fit in RAM: what the process holds is the quantizer, one part and one chunk.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.files import INDEX_FILE, IVFDATA_FILE, faiss_stdout, write_index
from petal.pipeline.index.gpu import to_cpu, to_gpu
from petal.pipeline.index.plan import lists_hold_everything, takes_ids
from petal.pipeline.index.source import StoreVectors


def _built_by_one_add(index: Any) -> bool:
    """Whether the vectors go into an NSG graph (bare, or under an id map, a pre-transform or a refine wrapper; not
    an IVF's quantizer, which is trained on the list centroids): FAISS builds such a graph in its first ``add`` and
    refuses any other ('NSG does not support incremental addition')."""
    faiss = load_faiss()
    node = faiss.downcast_index(index)
    while not isinstance(node, faiss.IndexNSG):
        inner = next((inner for name in ("index", "base_index") if (inner := getattr(node, name, None)) is not None),
                     None)
        if inner is None:
            return False
        node = faiss.downcast_index(inner)
    return True


def _in_one(chunks: Iterator[tuple[np.ndarray, np.ndarray]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``chunks`` as one chunk (none when there are none)."""
    held = list(chunks)
    if held:
        yield np.concatenate([ids for ids, _ in held]), np.concatenate([vectors for _, vectors in held])


def _add(index: Any, ids: Any, vectors: Any) -> None:
    if takes_ids(index):  # IVF, IDMap/IDMap2 (bare or under pre-transforms): the FAISS ids go with the vectors
        index.add_with_ids(vectors, ids)
    else:  # Flat, HNSW, PQ, a refine wrapper (which refuses ids): ids are implicit, 0..ntotal-1 in insertion order
        assert index.ntotal == ids[0], f"sequential ids expected: ntotal {index.ntotal}, next id {ids[0]}"
        index.add(vectors)


def parts(trained: Any, source: StoreVectors, part_rows: int, chunk_rows: int,
          use_gpu: bool) -> Iterator[tuple[Any, str]]:
    """CPU copies of ``trained`` holding consecutive runs of at most ``part_rows`` vectors (with
    their FAISS ids), and where each was filled ("gpu:0" or "cpu")."""
    faiss = load_faiss()

    part, where, count = None, "cpu", 0
    for ids, vectors in source.chunks(chunk_rows):
        if part is None:
            empty = faiss.clone_index(trained)
            part = to_gpu(empty) if use_gpu else None
            where = "gpu:0" if part is not None else "cpu"
            part = part if part is not None else empty
        _add(part, ids, vectors)
        count += len(ids)
        if count >= part_rows:
            yield (to_cpu(part) if where != "cpu" else part), where
            part, count = None, 0
    if part is not None:
        yield (to_cpu(part) if where != "cpu" else part), where


def reserve_lists(index: Any, source: StoreVectors, chunk_rows: int) -> None:
    """Size each inverted list of ``index``, a bare, empty IVF with FAISS's array lists, for the vectors of ``source``
    it will hold (anything else: nothing done).

    NOTE: FAISS grows a list as C++ vectors grow, doubling: the lists of an in-memory IVF held up to twice their codes
    (IVF1024,SQfp16 of 100k x 1024: +270 MiB for 205 MiB of codes and ids). One pass of the coarse assignment (the
    add's own, done twice) counts each list's vectors; resizing a list to its count and back to empty keeps that
    capacity, so adding never reallocates it.
    """
    faiss = load_faiss()
    ivf = faiss.downcast_index(index)
    if not isinstance(ivf, faiss.IndexIVF) or ivf.ntotal:
        return
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    if not isinstance(lists, faiss.ArrayInvertedLists):  # NOTE: fast-scan's block lists grow by blocks of their own
        return
    counts = np.zeros(ivf.nlist, dtype=np.int64)
    for _, vectors in source.chunks(chunk_rows):
        counts += np.bincount(ivf.quantizer.assign(vectors, 1).ravel(), minlength=ivf.nlist)
    for list_no in np.flatnonzero(counts).tolist():
        lists.resize(list_no, int(counts[list_no]))
        lists.resize(list_no, 0)


def add_in_memory(index: Any, source: StoreVectors, part_rows: int, chunk_rows: int, use_gpu: bool,
                  reserve: bool = True) -> str:
    """Add every vector of ``source`` to ``index`` (in place). Returns where the adding ran. ``reserve``: size the
    inverted lists first (``reserve_lists``: one more coarse-assignment pass), where lists grown by doubling could
    pass the memory budget."""
    if reserve:
        reserve_lists(index, source, chunk_rows)
    # NOTE: parts merged into ``index`` merge only inverted lists: an id map's ids or a refine wrapper's codes would
    # be left behind, so those (and non-IVF indexes) are filled in place on the CPU
    if not use_gpu or not lists_hold_everything(index):
        chunks = source.chunks(chunk_rows)
        # NOTE: an NSG graph takes its vectors in one add: was 78 'FAISS cannot build index NSG16' from a second chunk
        # (an index of two shards, or a rebuild of one)
        for ids, vectors in _in_one(chunks) if _built_by_one_add(index) else chunks:
            _add(index, ids, vectors)
        return "cpu"
    places = set()
    for part, where in parts(index, source, part_rows, chunk_rows, use_gpu):
        index.merge_from(part, 0)  # NOTE: ids were assigned when the part was filled: no shift
        places.add(where)
    return ",".join(sorted(places)) or "cpu"


def build_on_disk(trained: Any, source: StoreVectors, staging: Path, part_rows: int, chunk_rows: int,
                  use_gpu: bool) -> tuple[Any, str]:
    """Write ``index.faiss`` + ``index.ivfdata`` into ``staging`` from shard-wise parts.

    Returns the merged index (its lists memory-mapped from ``staging``) and where adding ran.
    """
    load_faiss()
    from faiss.contrib.ondisk import merge_ondisk

    work = staging / "parts.tmp"
    work.mkdir()
    try:
        names, places = [], set()
        for number, (part, where) in enumerate(parts(trained, source, part_rows, chunk_rows, use_gpu)):
            name = work / f"part-{number:05d}.index"
            write_index(part, name)
            del part  # one part in memory at a time
            names.append(str(name))
            places.add(where)
        with faiss_stdout():
            # NOTE: merge_ondisk keeps the parts mmapped until the process exits (FAISS leaks their
            # inverted lists by design); their disk space is freed then, after the rmtree below.
            merge_ondisk(trained, names, str(staging / IVFDATA_FILE))
        write_index(trained, staging / INDEX_FILE, catch_stdout=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the version directory holds no build leftovers
    return trained, ",".join(sorted(places)) or "cpu"
