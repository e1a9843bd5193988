"""Every node of an HNSW graph can be reached by a walk.

FAISS's HNSW keeps, for each node, the neighbours its pruning heuristic chooses. A node that no kept link leads to
at level 0 (an orphan), or a group of nodes whose links only lead to each other, is reached by no walk from the
entry point, so its documents show in no search's hits, whatever the query and ``efSearch``: 20k Gaussian 32-dim
vectors left about 700 such nodes under HNSW8 and 60 under HNSW16 (``bench/graph_repair_probe.py``).
``link_unreachable`` links each of them from the nearest node a walk reaches (its own nearest neighbours first):
into a free level-0 slot of that node where it has one, else in place of that node's last link (a node's links are
kept nearest first) whose target another link still reaches. A replaced link can cut a few nodes off in turn, so
it repeats until a walk reaches every node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.graph_holdout import hnsw_graph

CHUNK_NODES = 1 << 16  # NOTE: level-0 links are read this many nodes at a time (a copy of all would double them)
MAX_ROUNDS = 16
HOSTS = 8  # reached nodes, nearest first, an unreached node may be linked from


class Level0:
    """A FAISS ``HNSW`` graph's level-0 links, viewed in place (``links[offsets[node] + slot]``; -1: empty)."""

    def __init__(self, graph: Any) -> None:
        faiss = load_faiss()
        self.links = faiss.rev_swig_ptr(graph.neighbors.data(), graph.neighbors.size())
        self.offsets = faiss.vector_to_array(graph.offsets).astype(np.int64)  # [nodes + 1]
        self.width = int(faiss.vector_to_array(graph.cum_nneighbor_per_level)[1])
        self.num_nodes = len(self.offsets) - 1
        self.entry = int(graph.entry_point)

    def rows(self, nodes: np.ndarray) -> np.ndarray:
        """``[len(nodes), width]`` copies of ``nodes``' links."""
        return self.links[self.offsets[nodes, None] + np.arange(self.width)]

    def row(self, node: int) -> np.ndarray:
        """``[width]`` view of ``node``'s links."""
        return self.links[self.offsets[node] : self.offsets[node] + self.width]

    def in_degree(self) -> np.ndarray:
        """``[num_nodes]`` int64: how many links lead to each node."""
        degree = np.zeros(self.num_nodes, dtype=np.int64)
        for start in range(0, self.num_nodes, CHUNK_NODES):
            block = self.rows(np.arange(start, min(start + CHUNK_NODES, self.num_nodes)))
            degree += np.bincount(block[block >= 0], minlength=self.num_nodes)
        return degree

    def spread(self, seen: np.ndarray, start: np.ndarray) -> None:
        """Mark in ``seen`` (``[num_nodes]`` bool, in place) every node a walk from ``start`` reaches."""
        seen[start] = True
        frontier = start
        while len(frontier):
            nodes = np.concatenate([self.rows(frontier[i : i + CHUNK_NODES]).ravel()
                                    for i in range(0, len(frontier), CHUNK_NODES)])
            nodes = nodes[nodes >= 0]
            frontier = np.unique(nodes[~seen[nodes]])  # NOTE: unique over the new nodes only (a hash of all is slow)
            seen[frontier] = True

    def reached(self) -> np.ndarray:
        """``[num_nodes]`` bool: the nodes a walk from the entry point reaches."""
        seen = np.zeros(self.num_nodes, dtype=bool)
        if self.entry >= 0:
            self.spread(seen, np.array([self.entry], dtype=np.int64))
        return seen


def link_unreachable(index: Any) -> int:
    """Link every node of ``index``'s HNSW graph that no walk reaches (see the module), in place; returns the links
    made. An index without a graph over its vectors (IVF, flat, hash) is left as it is (0)."""
    graph = hnsw_graph(index)
    if graph is None or graph.entry_point < 0:
        return 0
    level0 = Level0(graph)
    degree = level0.in_degree()
    made = 0
    for _ in range(MAX_ROUNDS):
        seen = level0.reached()
        lost = np.flatnonzero(~seen)
        if not len(lost):
            break
        for node in lost:
            if seen[node]:  # reached through a node linked before it
                continue
            slot = _slot(level0, _nearest_reached(level0, int(node), seen), degree)
            if slot is None:
                continue
            old = int(level0.links[slot])
            if old >= 0:
                degree[old] -= 1
            level0.links[slot] = node
            degree[node] += 1
            made += 1
            level0.spread(seen, np.array([node], dtype=np.int64))
    return made


def _nearest_reached(level0: Level0, node: int, seen: np.ndarray) -> list[int]:
    """Up to ``HOSTS`` reached nodes nearest ``node`` by its links: its own neighbours first (nearest first), then
    theirs, and so on; the entry point last."""
    hosts: list[int] = []
    visited = {node}
    frontier = [node]
    while frontier and len(hosts) < HOSTS:
        following = []
        for current in frontier:
            for neighbour in level0.row(current).tolist():
                if neighbour < 0 or neighbour in visited:
                    continue
                visited.add(neighbour)
                if seen[neighbour]:
                    hosts.append(neighbour)
                else:
                    following.append(neighbour)
        frontier = following
    return [*hosts[:HOSTS], level0.entry]


def _slot(level0: Level0, hosts: list[int], degree: np.ndarray) -> int | None:
    """Where a link can go (a position in ``level0.links``): the first empty slot of ``hosts``, nearest first, else
    the last link of the nearest host whose target another link still reaches (``degree`` >= 2); ``None`` when
    there is neither."""
    for host in hosts:
        empty = np.flatnonzero(level0.row(host) < 0)
        if len(empty):
            return int(level0.offsets[host] + empty[0])
    for host in hosts:
        spare = np.flatnonzero(degree[level0.row(host)] >= 2)
        if len(spare):
            return int(level0.offsets[host] + spare[-1])
    return None
