"""FAISS search with per-request ``nprobe``/``rescore``, safe across threads.

Searches with the index's tuned parameters share the index (FAISS search is read-only); a request
that overrides them sets them, searches and restores them while no other search runs (a
readers-writer lock), since FAISS keeps those parameters on the index object.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.search import IndexReader, bounded_params
from petal.pipeline.index.tune import apply_params


class SharedExclusiveLock:
    """Many ``shared()`` holders at once, or one ``exclusive()`` holder (writers are not starved:
    a waiting writer holds new readers back)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@contextlib.contextmanager
def search_params(reader: IndexReader, nprobe: int | None, rescore: int | None) -> Iterator[None]:
    """``reader``'s index with ``nprobe`` (IVF) and ``rescore`` (binary) set, restored on exit.

    Hold ``SharedExclusiveLock.exclusive()`` around it. Parameters an index does not have are ignored
    (a flat index has no nprobe; only binary indexes rescore).
    """
    from petal.pipeline.index.binary import BinaryIndex

    index = reader.index
    if isinstance(index, BinaryIndex):
        saved = (index.rescore, getattr(index.index, "nprobe", None))
        if rescore is not None and index.rescore_vectors is not None:
            index.rescore = rescore
        if nprobe is not None and saved[1] is not None:
            index.index.nprobe = nprobe
        try:
            yield
        finally:
            index.rescore = saved[0]
            if saved[1] is not None:
                index.index.nprobe = saved[1]
        return
    if nprobe is None or load_faiss().try_extract_index_ivf(index) is None:
        yield
        return
    tuned = reader.search_params
    params = {**tuned, "nprobe": nprobe}
    if "quantizer_efSearch" in params:
        params["quantizer_efSearch"] = max(params["quantizer_efSearch"], 2 * nprobe)
    # NOTE: a request's nprobe (up to 2^31-1) set quantizer_efSearch to 2 x nprobe: FAISS sized that search's heaps by
    # it (16 GiB for nprobe 10^9); bounded by the quantizer's lists, which changes no result
    params = bounded_params(params, int(index.ntotal), load_faiss().try_extract_index_ivf(index))
    apply_params(index, params)
    # NOTE: the reader's own record too: a filtered search (`where`) passes FAISS parameters of its own, built
    # from reader.search_params, which would otherwise probe the tuned nprobe, not the request's
    reader.search_params = params
    try:
        yield
    finally:
        reader.search_params = tuned
        apply_params(index, tuned)


def overrides(reader: IndexReader, nprobe: int | None, rescore: int | None) -> bool:
    """Whether a request's parameters differ from those ``reader`` searches with."""
    from petal.pipeline.index.binary import BinaryIndex

    index = reader.index
    if isinstance(index, BinaryIndex):
        return (rescore is not None and rescore != index.rescore) or (
            nprobe is not None and nprobe != getattr(index.index, "nprobe", nprobe))
    if nprobe is None or load_faiss().try_extract_index_ivf(index) is None:  # a flat index has no nprobe
        return False
    return nprobe != reader.search_params.get("nprobe")
