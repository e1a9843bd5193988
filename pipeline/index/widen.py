"""Searching again the queries an approximate search left short of the hits they want, with wider parameters."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

# an HNSW's efSearch up to this is applied as the manifest says (heaps of ~1 MiB); past it and past the vectors held a
# larger one finds nothing more (every node fits in the heaps), and FAISS would size each search's heaps by it
EF_FLOOR = 1 << 16


def searched_again(search: Callable[[np.ndarray, Any], tuple[np.ndarray, np.ndarray]], queries: np.ndarray,
                   want: int, scores: np.ndarray, ids: np.ndarray,
                   wider: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``scores``, ``ids`` (``[num_queries, k]``, -1 pad) with the rows holding fewer than ``want`` ids searched
    again, ``search(their queries, params)``, with each of ``wider``'s parameters in turn until none is short or
    they run out (the last answer kept)."""
    short = np.flatnonzero((ids >= 0).sum(axis=1) < want)
    for params in wider:
        if not len(short):
            break
        found_scores, found_ids = search(queries[short], params)
        scores[short], ids[short] = found_scores, found_ids
        short = short[(found_ids >= 0).sum(axis=1) < want]
    return scores, ids


def decodable(index: Any) -> None:
    """Let FAISS decode the codes of a fast-scan IVF inside ``index`` (under id maps, pre-transforms, a refine
    wrapper): ``reconstruct``, ``reconstruct_n``, ``sa_decode`` and the direct map's ``reconstruct_batch``.

    NOTE: FAISS decodes a fast-scan IVF's codes through its ``fine_quantizer``, a pointer to its own product (or
    additive) quantizer that ``read_index`` leaves null: every decoding of an index read from a file segfaulted (the
    scan of a search left short, ``petal serve``'s upload of the vectors to its GPU copy). It is pointed at that
    quantizer again, as ``index_factory`` sets it; nothing else changes."""
    from petal.pipeline.index.faiss_loader import load_faiss

    faiss = load_faiss()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return
    ivf = faiss.downcast_index(ivf)
    if isinstance(ivf, faiss.IndexIVFFastScan) and ivf.fine_quantizer is None:
        ivf.fine_quantizer = ivf.pq if isinstance(ivf, faiss.IndexIVFPQFastScan) else ivf.aq


SCAN_CELLS = 1 << 24  # query x vector scores, or vector values, a scan holds at a time (64 MiB of float32)


class CodeScan:
    """Every vector an index holds, scored as its search scores them, for the queries its search leaves short at its
    widest parameters: an HNSW walk reaches no node that no other node links to, at any efSearch; an IVF whose
    quantizer is such a graph (``IVF256_HNSW4``) probes no list whose centroid no walk reaches, at any nprobe; FAISS's
    fast-scan search answers a query whose lookup table is flat (a zero query under ``ip``) with NaN and no ids, and
    drops a vector whose quantized score saturates, at every nprobe.
    Found through the index's wrappers: id maps (their ids are what it returns and what a filter names),
    pre-transforms (OPQ, PCA: applied to the queries), a refine wrapper (its own codes give the final scores: those
    are scanned), else the index under them, whatever its codes.

    An IVF's lists are searched by FAISS itself, every list assigned to every query (its quantizer left out), with
    the filter as an id selector; other codes (Flat, SQ, PQ: FAISS's PQ scan takes no id selector) are decoded a
    chunk at a time and scored here, the filter applied to their ids (exact top k of the codes); so are the rows an
    IVF's search of every list leaves short (a fast-scan IVF made ``decodable`` first)."""

    def __init__(self, index: Any) -> None:
        from petal.pipeline.index.faiss_loader import load_faiss

        faiss = load_faiss()
        decodable(index)
        self.id_maps: list[np.ndarray] = []  # outermost first: a node's id -> its wrapper's
        self.transforms: list[Any] = []
        node = faiss.downcast_index(index)
        while isinstance(node, (faiss.IndexIDMap, faiss.IndexPreTransform)):
            if isinstance(node, faiss.IndexIDMap):
                self.id_maps.append(faiss.vector_to_array(node.id_map))
            else:
                chain = node.chain
                self.transforms.extend(faiss.downcast_VectorTransform(chain.at(i)) for i in range(chain.size()))
            node = faiss.downcast_index(node.index)
        if isinstance(node, faiss.IndexRefine):
            node = faiss.downcast_index(node.refine_index)
        elif isinstance(node, faiss.IndexHNSW):
            node = faiss.downcast_index(node.storage)
        self.codes = node
        self.ivf: Any = node if isinstance(node, faiss.IndexIVF) else None
        self.fast_scan = isinstance(node, faiss.IndexIVFFastScan)
        self.ip = node.metric_type == faiss.METRIC_INNER_PRODUCT

    def search(self, queries: np.ndarray, k: int, member: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores [n, k], ids [n, k])`` of the top ``k`` of every vector (ties on the lower id; -1 pad), among the
        ids ``member(ids) -> bool mask`` accepts (every one without it)."""
        for transform in self.transforms:
            queries = transform.apply(np.ascontiguousarray(queries, dtype=np.float32))
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if self.ivf is None:
            return self._decoded(queries, k, member)
        scores, ids = self._every_list(queries, k, member)
        short = np.flatnonzero((ids >= 0).sum(axis=1) < min(k, int(self.ivf.ntotal)))
        if not len(short):
            return scores, ids
        # NOTE: FAISS's fast scan drops vectors even with every list probed: a vector whose quantized score saturates
        # its 16-bit accumulator never passes the heap's threshold (1000 vectors in IVF16,PQ4x4fs under ip: k=1000
        # answered 999), and a query whose lookup table is flat (a zero query under ip) gets NaN and no ids
        scores[short], ids[short] = self._decoded(queries[short], k, member)
        return scores, ids

    def _outer(self, ids: np.ndarray) -> np.ndarray:
        """The ids the index returns for its codes' ``ids`` (none negative): through the id maps, innermost first."""
        for id_map in reversed(self.id_maps):
            ids = id_map[ids]
        return ids

    def _every_list(self, queries: np.ndarray, k: int, member: Callable[[np.ndarray], np.ndarray] | None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's IVF search with every list probed: ``search_preassigned`` given each list and its centroid's
        distance to the query (what the quantizer would give), the filter as a bitmap over the IVF's own ids."""
        from petal.pipeline.index.faiss_loader import load_faiss

        faiss = load_faiss()
        ivf = self.ivf
        nlist = int(ivf.nlist)
        centroids = ivf.quantizer.reconstruct_n(0, nlist)
        params = None
        if member is not None:
            keep = member(self._outer(np.arange(int(ivf.ntotal), dtype=np.int64)))
            bits = np.packbits(keep.astype(np.uint8), bitorder="little")  # NOTE: FAISS holds a bare pointer: kept here
            params = faiss.SearchParametersIVF(sel=faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits)),
                                               nprobe=nlist)
        scores = np.empty((len(queries), k), dtype=np.float32)
        ids = np.empty((len(queries), k), dtype=np.int64)
        rows = max(1, SCAN_CELLS // nlist)
        for start in range(0, len(queries), rows):
            part = queries[start:start + rows]
            if self.ip:
                coarse = part @ centroids.T
            else:
                coarse = (part**2).sum(1)[:, None] + (centroids**2).sum(1)[None, :] - 2 * part @ centroids.T
            assign = np.broadcast_to(np.arange(nlist, dtype=np.int64), coarse.shape).copy()
            coarse = np.ascontiguousarray(coarse, dtype=np.float32)
            # NOTE: FAISS's Python wrapper of search_preassigned refuses parameters (the filter): its C++ method
            ivf.search_preassigned_c(len(part), faiss.swig_ptr(part), k, faiss.swig_ptr(assign), faiss.swig_ptr(coarse),
                                     faiss.swig_ptr(scores[start:]), faiss.swig_ptr(ids[start:]), False, params)
        found = ids >= 0
        ids[found] = self._outer(ids[found])
        return scores, ids

    def _decoded(self, queries: np.ndarray, k: int, member: Callable[[np.ndarray], np.ndarray] | None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The exact top ``k`` of the decoded codes, ``rows`` of them at a time."""
        worst = -np.inf if self.ip else np.inf
        best = np.full((len(queries), 0), worst, dtype=np.float32)
        best_ids = np.empty((len(queries), 0), dtype=np.int64)
        # NOTE: bounded by the scores and by the decoded vectors held (a lone query of a 1M x 384 index decoded it
        # whole: 1.5 GB)
        rows = max(1024, SCAN_CELLS // max(1, len(queries), int(self.codes.d)))
        total = int(self.codes.ntotal)
        for start in range(0, total, rows):
            ids = self._outer(np.arange(start, min(start + rows, total), dtype=np.int64))
            keep = np.ones(len(ids), dtype=bool) if member is None else member(ids)
            if not keep.any():
                continue
            vectors = self.codes.reconstruct_n(start, len(ids))[keep]
            # NOTE: a damaged vector (NaN, infinite) scores NaN or inf, as FAISS scores it: said by the reader's
            # _check_scores, not as numpy's RuntimeWarning on stderr
            with np.errstate(invalid="ignore", over="ignore"):
                if self.ip:
                    scores = queries @ vectors.T
                else:
                    square = (queries**2).sum(1)[:, None] + (vectors**2).sum(1)[None, :]
                    scores = np.maximum(square - 2 * queries @ vectors.T, 0)
            scores = np.concatenate([best, scores.astype(np.float32)], axis=1)
            found = np.concatenate([best_ids, np.broadcast_to(ids[keep], (len(queries), int(keep.sum())))], axis=1)
            order = np.lexsort((found, -scores if self.ip else scores), axis=1)[:, :k]
            best, best_ids = np.take_along_axis(scores, order, axis=1), np.take_along_axis(found, order, axis=1)
        pad = k - best.shape[1]
        if pad > 0:
            best = np.pad(best, ((0, 0), (0, pad)), constant_values=worst)
            best_ids = np.pad(best_ids, ((0, 0), (0, pad)), constant_values=-1)
        return best, best_ids
