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


SCAN_CELLS = 1 << 24  # query x vector scores a graph scan computes at a time (64 MiB of float32)


class GraphScan:
    """Every vector an HNSW index holds, scored as its search scores them, for the queries a walk leaves short at any
    efSearch (a node no other node links to is reached by none). Found through the index's wrappers: id maps (their
    ids are what it returns and what a filter names), pre-transforms (OPQ, PCA: applied to the queries), a refine
    wrapper (its own codes give the final scores: those are scanned), else the graph's storage, whatever its codes
    (Flat, SQ, PQ: FAISS's PQ scan takes no id selector, so the scan decodes them and applies the filter itself)."""

    def __init__(self, index: Any) -> None:
        from petal.pipeline.index.faiss_loader import load_faiss

        faiss = load_faiss()
        self.id_maps: list[np.ndarray] = []  # outermost first: a node's id -> its wrapper's
        self.transforms: list[Any] = []
        node = faiss.downcast_index(index)
        while not isinstance(node, (faiss.IndexRefine, faiss.IndexHNSW)):
            if isinstance(node, faiss.IndexIDMap):
                self.id_maps.append(faiss.vector_to_array(node.id_map))
            elif isinstance(node, faiss.IndexPreTransform):
                chain = node.chain
                self.transforms.extend(faiss.downcast_VectorTransform(chain.at(i)) for i in range(chain.size()))
            else:
                raise ValueError(f"no HNSW graph under {type(node).__name__}")
            node = faiss.downcast_index(node.index)
        self.codes = faiss.downcast_index(node.refine_index if isinstance(node, faiss.IndexRefine) else node.storage)
        self.ip = self.codes.metric_type == faiss.METRIC_INNER_PRODUCT

    def search(self, queries: np.ndarray, k: int, member: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores [n, k], ids [n, k])`` of the exact top ``k`` over the decoded codes (ties on the lower id; -1 pad),
        among the ids ``member(ids) -> bool mask`` accepts (every one without it)."""
        for transform in self.transforms:
            queries = transform.apply(np.ascontiguousarray(queries, dtype=np.float32))
        worst = -np.inf if self.ip else np.inf
        best = np.full((len(queries), 0), worst, dtype=np.float32)
        best_ids = np.empty((len(queries), 0), dtype=np.int64)
        total = int(self.codes.ntotal)
        rows = max(1024, SCAN_CELLS // max(1, len(queries)))
        for start in range(0, total, rows):
            ids = np.arange(start, min(start + rows, total), dtype=np.int64)
            for id_map in reversed(self.id_maps):  # NOTE: the innermost map first
                ids = id_map[ids]
            keep = np.ones(len(ids), dtype=bool) if member is None else member(ids)
            if not keep.any():
                continue
            vectors = self.codes.reconstruct_n(start, len(ids))[keep]
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
