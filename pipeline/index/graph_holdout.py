"""Tuning an HNSW graph on queries it holds: the queries' nodes unlinked while it is tuned.

A query that is a node of the graph walks straight to itself, and its links are its nearest neighbours: tuned on
sampled nodes, a 20k-vector HNSW32 measured recall@10 0.965 at the efSearch it chose where new queries got 0.91.
Holding the queries out of the graph is what new queries see, but an HNSW's ids are its insertion order, so only its
last vectors could be held out, and those are the last shard's (data appended by date or topic: a last shard of
tight clusters tuned a graph to efSearch 16 that new queries answered with recall 0.61). So the queries stay a
seeded sample of every vector, and while the graph is tuned no link leads to them: each link to a query's node
points back at the node that holds it (a node the walk has visited already, so it is skipped), and restored after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from petal.pipeline.index.binary import BinaryIndex
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.plan import searched_nodes

CHUNK_LINKS = 1 << 24  # links looked at a time (64 MiB of int32; a 1M-node HNSW32 holds ~80M)


def hnsw_graph(index: Any) -> Any | None:
    """The HNSW graph (FAISS ``HNSW``) whose nodes are ``index``'s vectors, or ``None`` (no graph, an IVF's graph
    over its centroids)."""
    graph_index = hnsw_index(index)
    return None if graph_index is None else graph_index.hnsw


def hnsw_index(index: Any) -> Any | None:
    """The index inside ``index`` that holds its HNSW graph (``IndexHNSW`` or ``IndexBinaryHNSW``: its search answers
    the graph's node ids), or ``None`` as ``hnsw_graph``."""
    faiss = load_faiss()
    if isinstance(index, BinaryIndex):
        index = index.index
    if isinstance(index, faiss.IndexBinary):
        return index if isinstance(index, faiss.IndexBinaryHNSW) else None
    if faiss.try_extract_index_ivf(index) is not None:
        return None
    for node in searched_nodes(index):
        if isinstance(node, faiss.IndexHNSW):
            return faiss.downcast_index(node)
    return None


@contextmanager
def queries_unlinked(index: Any, node_ids: np.ndarray) -> Iterator[None]:
    """While open, no link of ``index``'s HNSW graph leads to the nodes ``node_ids`` (FAISS ids: a graph's nodes in
    insertion order), and the walk does not start at one; nothing changes for an index without a graph."""
    faiss = load_faiss()
    graph = hnsw_graph(index)
    if graph is None or len(node_ids) == 0:
        yield
        return
    # NOTE: a view of the graph's own links, changed in place: a copy of a large graph's links would double them
    links = faiss.rev_swig_ptr(graph.neighbors.data(), graph.neighbors.size())
    offsets = faiss.vector_to_array(graph.offsets).astype(np.int64)  # [nodes + 1] each node's first link
    held = np.zeros(len(offsets) - 1, dtype=bool)
    held[node_ids] = True
    changed, was = [], []
    for lo in range(0, len(links), CHUNK_LINKS):
        chunk = links[lo : lo + CHUNK_LINKS]
        at = np.flatnonzero((chunk >= 0) & held[np.maximum(chunk, 0)])
        changed.append(at + lo)
        was.append(chunk[at].copy())
    positions, targets = np.concatenate(changed), np.concatenate(was)
    entry, max_level = int(graph.entry_point), int(graph.max_level)
    try:
        links[positions] = (np.searchsorted(offsets, positions, side="right") - 1).astype(links.dtype)
        if entry >= 0 and held[entry] and not held.all():
            # NOTE: the walk starts at the highest node left (FAISS's levels count from 1: max_level is one less)
            levels = np.where(held, 0, faiss.vector_to_array(graph.levels))
            graph.entry_point = int(np.argmax(levels))
            graph.max_level = int(levels.max()) - 1
        yield
    finally:
        links[positions] = targets
        graph.entry_point, graph.max_level = entry, max_level
