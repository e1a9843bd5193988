"""Tuning an HNSW graph on queries it holds: the queries' nodes unlinked while it is tuned.

A query that is a node of the graph walks straight to itself, and its links are its nearest neighbours: tuned on
sampled nodes, a 20k-vector HNSW32 measured recall@10 0.965 at the efSearch it chose where new queries got 0.91.
Holding the queries out of the graph is what new queries see, but an HNSW's ids are its insertion order, so only its
last vectors could be held out, and those are the last shard's (data appended by date or topic: a last shard of
tight clusters tuned a graph to efSearch 16 that new queries answered with recall 0.61). So the queries stay a
seeded sample of every vector, and while the graph is tuned no link leads to them: each link ``h -> q`` to a query's
node leads past it instead, to a node ``q`` links to at that level (``h -> q -> t`` becomes ``h -> t``, as a graph
built without ``q`` would link ``h`` near it), or, where ``q`` leads only to held nodes or back to ``h``, points back
at ``h`` (a node the walk has visited already, so it is skipped); restored after.

NOTE: pointing every such link back at its node cut graphs of copies apart: a group of more than M copies is linked
as a cycle (graph_repair.py), and the held copies broke it, so 2073 of 3000 nodes left (200 vectors x 20 copies,
HNSW8, 1000 held) were reached by no walk, and the tuner chose efSearch 2048 (recall@10 0.71, target 0.95) where
the graph as built finds every copy at 16.
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
BYPASS_HOPS = 8  # held nodes in a row a link to a held node is carried past (a cycle over copies: several of them)


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
    bypass = _bypasses(graph, links, offsets, held, positions, targets)
    # NOTE: empty slots of the nodes that linked to a held node take its other links (restored to -1 after)
    extra_positions, extra_targets = _more_bypasses(graph, links, offsets, held, positions, targets, bypass)
    positions, targets = np.r_[positions, extra_positions], np.r_[targets, np.full(len(extra_positions), -1)]
    try:
        links[positions] = np.r_[bypass, extra_targets].astype(links.dtype)
        if entry >= 0 and held[entry] and not held.all():
            # NOTE: the walk starts at the highest node left (FAISS's levels count from 1: max_level is one less)
            levels = np.where(held, 0, faiss.vector_to_array(graph.levels))
            graph.entry_point = int(np.argmax(levels))
            graph.max_level = int(levels.max()) - 1
        yield
    finally:
        links[positions] = targets
        graph.entry_point, graph.max_level = entry, max_level


def _bypasses(graph: Any, links: np.ndarray, offsets: np.ndarray, held: np.ndarray, positions: np.ndarray,
              targets: np.ndarray) -> np.ndarray:
    """``[len(positions)]`` what each link ``positions`` (to the held node ``targets``, of the node ``h`` holding it)
    leads to instead: the first node other than ``h`` that ``targets`` links to at that level, past up to
    ``BYPASS_HOPS`` held nodes in a row; ``h`` where there is none."""
    faiss = load_faiss()
    owners = np.searchsorted(offsets, positions, side="right") - 1  # [n] h
    cum = faiss.vector_to_array(graph.cum_nneighbor_per_level).astype(np.int64)  # [levels + 1] first slot per level
    levels = np.searchsorted(cum, positions - offsets[owners], side="right") - 1  # [n] the link's level
    out = owners.copy()
    pending = np.arange(len(positions))
    via = targets.astype(np.int64)  # [len(pending)] the held node each pending link is carried past
    for _ in range(BYPASS_HOPS):
        if not len(pending):
            break
        level = levels[pending]
        width = int((cum[level + 1] - cum[level]).max())
        slots = offsets[via][:, None] + cum[level][:, None] + np.arange(width)[None, :]  # [n, width]
        inside = np.arange(width)[None, :] < (cum[level + 1] - cum[level])[:, None]
        # NOTE: read before any link is changed: the graph as built
        ahead = np.where(inside, links[np.minimum(slots, len(links) - 1)], -1).astype(np.int64)
        # NOTE: the first link (links are nearest first, a group of copies' cycle link first), held or not: taking
        # the first one not held instead jumped out of a cycle at two held copies in a row and cut the rest off
        usable = (ahead >= 0) & (ahead != owners[pending][:, None]) & (ahead != via[:, None])
        has = usable.any(axis=1)
        first = ahead[np.arange(len(pending)), np.argmax(usable, axis=1)]
        done = has & ~held[np.maximum(first, 0)]
        out[pending[done]] = first[done]
        going = has & ~done
        via, pending = first[going], pending[going]
    return out


def _more_bypasses(graph: Any, links: np.ndarray, offsets: np.ndarray, held: np.ndarray, positions: np.ndarray,
                   targets: np.ndarray, bypass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, targets)``: the empty slots (-1) of each node ``h`` that linked to a held node ``q`` (at the
    link's level), filled with the other nodes ``q`` links to there (and, past a held first link, that node's, as
    ``_bypasses`` goes), not held, not
    ``h`` and not linked by ``h`` already (``bypass`` included), nearest first: what a graph built without ``q``
    links ``h`` near."""
    faiss = load_faiss()
    cum = faiss.vector_to_array(graph.cum_nneighbor_per_level).astype(np.int64)
    owners = np.searchsorted(offsets, positions, side="right") - 1
    levels = np.searchsorted(cum, positions - offsets[owners], side="right") - 1
    num_nodes = len(offsets) - 1
    # NOTE: one row per (node, level) that linked to a held node, as it will read (bypasses in place)
    keys, key_of = np.unique(owners * len(cum) + levels, return_inverse=True)
    key_owner, key_level = keys // len(cum), keys % len(cum)
    widths = cum[key_level + 1] - cum[key_level]  # [num_keys]
    width = int(widths.max(initial=0))
    if not len(keys) or width == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    starts = offsets[key_owner] + cum[key_level]  # [num_keys] first slot of each row
    inside = np.arange(width)[None, :] < widths[:, None]
    row_slots = starts[:, None] + np.arange(width)[None, :]  # [num_keys, width]
    rows = np.where(inside, links[np.minimum(row_slots, len(links) - 1)], -1).astype(np.int64)
    rows[key_of, positions - starts[key_of]] = bypass
    free = (rows < 0) & inside  # [num_keys, width]
    with_room = free.any(axis=1)[key_of]  # NOTE: a full row takes nothing: most rows of a dense graph
    # what each row is offered, nearest first: the held nodes' links, then those of the held node each first links
    # to (at most BYPASS_HOPS in a row)
    offered_key, offered_node, order = [], [], []
    frontier_key, frontier_via = key_of[with_room], targets[with_room].astype(np.int64)
    base = 0  # the places offered so far: a later hop's come after
    for _ in range(BYPASS_HOPS):
        if not len(frontier_key):
            break
        level = key_level[frontier_key]
        slots = offsets[frontier_via][:, None] + cum[level][:, None] + np.arange(width)[None, :]
        ok = np.arange(width)[None, :] < (cum[level + 1] - cum[level])[:, None]
        ahead = np.where(ok, links[np.minimum(slots, len(links) - 1)], -1).astype(np.int64)  # [n, width]
        ahead[ahead == key_owner[frontier_key][:, None]] = -1
        pair_key = np.repeat(frontier_key, width)
        flat = ahead.ravel()
        keep = flat >= 0
        offered_key.append(pair_key[keep])
        offered_node.append(flat[keep])
        order.append(base + np.flatnonzero(keep))
        base += len(flat)
        # onward past the first link only where it is held, as _bypasses goes (every held link: millions of pairs)
        has = (ahead >= 0).any(axis=1)
        first = ahead[np.arange(len(ahead)), np.argmax(ahead >= 0, axis=1)]
        onward = has & held[np.maximum(first, 0)]
        frontier_key, frontier_via = frontier_key[onward], first[onward]
    key_ids, nodes, ranks = np.concatenate(offered_key), np.concatenate(offered_node), np.concatenate(order)
    codes = key_ids * num_nodes + nodes
    # NOTE: sorted and searched: np.unique/np.isin hash int64 codes, 2 s for a 50k-node HNSW32 with 1000 held
    present = np.sort((np.arange(len(keys))[:, None] * num_nodes + np.maximum(rows, 0))[rows >= 0])
    at = np.minimum(np.searchsorted(present, codes), max(len(present) - 1, 0))
    linked = present[at] == codes if len(present) else np.zeros(len(codes), dtype=bool)
    usable = ~held[nodes] & ~linked
    codes, ranks = codes[usable], ranks[usable]
    _, first = np.unique(codes, return_index=True)  # each node offered once per row, at its nearest place
    first = first[np.lexsort((ranks[first], codes[first] // num_nodes))]  # by row, then nearest first
    codes = codes[first]
    key_ids, nodes = codes // num_nodes, codes % num_nodes
    nth = np.arange(len(key_ids)) - np.searchsorted(key_ids, key_ids)  # rank within its row
    num_free = free.sum(axis=1)
    fits = nth < num_free[key_ids]
    key_ids, nodes, nth = key_ids[fits], nodes[fits], nth[fits]
    free_slots = np.argsort(~free, axis=1, kind="stable")  # [num_keys, width] the free slots first, in order
    return starts[key_ids] + free_slots[key_ids, nth], nodes
