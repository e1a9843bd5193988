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
