"""Every node of an HNSW graph can be reached by a walk.

FAISS's HNSW keeps, for each node, the neighbours its pruning heuristic chooses. A node that no kept link leads to
at level 0 (an orphan), or a group of nodes whose links only lead to each other, is reached by no walk from the
entry point, so its documents show in no search's hits, whatever the query and ``efSearch``: 20k Gaussian 32-dim
vectors left about 700 such nodes under HNSW8 and 60 under HNSW16 (``bench/graph_repair_probe.py``), and a vector
with more than 2·M exact copies (boilerplate, duplicate documents) fills its copies' links with each other, so the
whole group is cut off.

``link_unreachable`` first links each group of more than M exact copies as one point (``link_copies``), then
splices each unreached node ``u`` into the graph at a reached node ``h`` near it (a search for ``u``'s vector finds
it; else ``u``'s own links lead to it; else the entry point): into a free level-0 slot of ``h`` where it has one,
else in place of one of ``h``'s links ``h -> t``, and then ``u -> t`` (in a free slot of ``u``, or in place of one
of its links): every walk that went through ``h -> t`` goes through ``h -> u -> t``. Neither step cuts off a node a
walk reached before, ``u`` and all it leads to are reached after, so one pass reaches every node (the proofs:
``_relink``, ``_splice``); a node left unreached all the same fails the build (``AssertionError``: a bug).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.graph_holdout import hnsw_index

CHUNK_NODES = 1 << 16  # NOTE: level-0 links are read this many nodes at a time (a copy of all would double them)
HOSTS = 8  # reached nodes, nearest first, an unreached node may be spliced in at
HOST_EF = 64  # efSearch of the searches that find them (at least)
CHUNK_SEARCHED = 1 << 12  # unreached nodes searched for at a time (the graph grows between chunks)
COPY_PASSES = 2  # each group of copies linked twice: the second time with its neighbours' groups linked (link_copies)
MAX_SEARCHED = 1 << 14  # hits a search for a group's nearest other points asks at most
HASHED_BYTES = 1 << 24  # NOTE: codes hashed this many bytes at a time (and a temporary of as many)


class Level0:
    """A FAISS ``HNSW`` graph's level-0 links (or ``level``'s: only its nodes' rows mean anything), viewed in place
    (``links[offsets[node] + slot]``; -1: empty)."""

    def __init__(self, graph: Any, level: int = 0) -> None:
        faiss = load_faiss()
        self.links = faiss.rev_swig_ptr(graph.neighbors.data(), graph.neighbors.size())
        cumulative = faiss.vector_to_array(graph.cum_nneighbor_per_level)
        # NOTE: a view that starts at the level's first slot: offsets[node] + slot is then the node's slot there
        self.offsets = faiss.vector_to_array(graph.offsets).astype(np.int64) + int(cumulative[level])  # [nodes + 1]
        self.width = int(cumulative[level + 1] - cumulative[level])
        self.num_nodes = len(self.offsets) - 1
        self.entry = int(graph.entry_point)

    def rows(self, nodes: np.ndarray) -> np.ndarray:
        """``[len(nodes), width]`` copies of ``nodes``' links."""
        return self.links[self.offsets[nodes, None] + np.arange(self.width)]

    def row(self, node: int) -> np.ndarray:
        """``[width]`` view of ``node``'s links."""
        return self.links[self.offsets[node] : self.offsets[node] + self.width]

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


def unreached_nodes(index: Any) -> int:
    """How many nodes of ``index``'s HNSW graph no walk from the entry point reaches at level 0 (0 without a graph):
    one walk over every link (``petal verify``)."""
    graph_index = hnsw_index(index)
    if graph_index is None or graph_index.hnsw.entry_point < 0:
        return 0
    return int((~Level0(graph_index.hnsw).reached()).sum())


def link_unreachable(index: Any) -> int:
    """Splice every node of ``index``'s HNSW graph that no walk reaches into the graph (see the module), in place;
    returns the splices made. An index without a graph over its vectors (IVF, flat, hash) is left as it is (0).
    Raises ``AssertionError`` (a bug, never silent) if a node is still unreached after."""
    graph_index = hnsw_index(index)
    if graph_index is None or graph_index.hnsw.entry_point < 0:
        return 0
    level0 = Level0(graph_index.hnsw)
    link_copies(graph_index)
    seen = level0.reached()
    lost = np.flatnonzero(~seen)
    spliced = np.zeros(level0.num_nodes, dtype=np.int32)  # [num_nodes] the links of each host spliced over so far
    made = 0
    for start in range(0, len(lost), CHUNK_SEARCHED):
        chunk = lost[start : start + CHUNK_SEARCHED]
        chunk = chunk[~seen[chunk]]  # NOTE: reached meanwhile through a node spliced before them
        if not len(chunk):
            continue
        _, searched = _search(graph_index, chunk, HOSTS)
        for node, found in zip(chunk.tolist(), searched):
            if seen[node]:
                continue
            hosts = [int(h) for h in found if h >= 0 and seen[h]] or _nearest_reached(level0, node, seen)
            _splice(level0, _host(level0, hosts, spliced), node, seen, spliced)
            made += 1
            level0.spread(seen, np.array([node], dtype=np.int64))
    left = np.flatnonzero(~level0.reached())  # NOTE: the proof's check, one walk over every link
    if len(left):
        raise AssertionError(f"{len(left)} of {level0.num_nodes} nodes of the HNSW graph (ids {left[:5].tolist()}"
                             f"{'...' if len(left) > 5 else ''}) are reached by no walk after the repair, so their "
                             "documents would be in no search's hits: a bug in pipeline/index/graph_repair.py")
    return made


def _search(graph_index: Any, nodes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``graph_index.search`` for ``nodes``' own vectors at an ``efSearch`` of at least ``max(HOST_EF, k)``:
    ``[len(nodes), k]`` distances and nodes, nearest first (-1: none). A search walks from the entry point, so they
    are reached nodes, except where the walk down the upper levels ends on a node level 0 does not reach."""
    faiss = load_faiss()
    if isinstance(graph_index, faiss.IndexBinary):  # NOTE: FAISS's binary indexes have no reconstruct_batch
        vectors = np.stack([graph_index.reconstruct(int(node)) for node in nodes])
    else:
        vectors = graph_index.reconstruct_batch(nodes)
    graph = graph_index.hnsw
    ef = int(graph.efSearch)
    graph.efSearch = max(ef, HOST_EF, k)
    try:
        return graph_index.search(vectors, k)
    finally:
        graph.efSearch = ef


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


def _host(level0: Level0, hosts: list[int], spliced: np.ndarray) -> int:
    """Of ``hosts`` (reached, nearest first): the nearest with a free slot, else the nearest with a link not spliced
    over yet (so a host's slot does not become a chain of spliced nodes), else the nearest."""
    for host in hosts:
        if level0.row(host)[-1] < 0:  # NOTE: FAISS fills a node's links from the first slot: the last is free last
            return host
    for host in hosts:
        if spliced[host] < level0.width:
            return host
    return hosts[0]


def _splice(level0: Level0, host: int, node: int, seen: np.ndarray, spliced: np.ndarray) -> None:
    """Link the unreached ``node`` from the reached ``host``: into ``host``'s first free slot, else ``host -> t``
    becomes ``host -> node -> t``.

    Proof that no reached node is cut off: a node is reached when a path of links leads to it from the entry point,
    and every node on such a path is reached, so it uses links out of reached nodes only. Two links change:
    ``host -> t`` (out of a reached node) and one of ``node``'s (``node`` is unreached: no such path used it). A
    path through ``host -> t`` goes ``host -> node -> t`` after. So every node reached before is reached after, and
    ``node`` too: the reached set grows by at least one node at each splice, and ``seen`` spread from ``node`` after
    it is the reached set again (nothing unreached was linked from a reached node but ``node``)."""
    row = level0.row(host)  # a view: written in place
    free = np.flatnonzero(row < 0)
    if len(free):
        row[free[0]] = node
        return
    slot = level0.width - 1 - int(spliced[host]) % level0.width  # the farthest link first, then the next nearer
    spliced[host] += 1
    target = int(row[slot])
    row[slot] = node
    own = level0.row(node)
    if target in own:  # NOTE: never -1 (the host's slots are full), never node (no reached node links to it)
        return
    free = np.flatnonzero(own < 0)
    if len(free):
        own[free[0]] = target
        return
    # NOTE: in place of a link to a reached node (a walk gets there without it), else of the farthest: a node it
    # alone led to is spliced in on its own turn
    kept = np.flatnonzero(seen[own])
    own[kept[-1] if len(kept) else level0.width - 1] = target


def link_copies(graph_index: Any) -> int:
    """Link each group of more than ``M`` nodes with the same code (the same vector: duplicate documents) as one
    point of the graph, at every level, in place; returns the groups linked.

    FAISS's pruning never drops a link to an exact copy (it keeps a candidate unless it is nearer another kept link
    than the node, and 0 is not nearer than 0), so the copies' links fill with each other, those out of the group
    are pushed out, and the group falls apart into parts that link only into themselves, which the nodes around
    link to once at most: a search that finds one part misses the other copies whatever its ``efSearch``, and most
    searches find none (the walk down the upper levels stops in the first group it enters, most often the entry
    point's). At each level, each group's links there are laid out again (``_relink``): a cycle over the copies, the
    links out of the group they held, its nearest other nodes of that level (a search for its vector), and a few of
    those link to a copy. Each change keeps every node a walk reached (the proof: ``_relink``). A group whose links
    out do not fit beside the cycle is left as it is."""
    faiss = load_faiss()
    codes = _codes(graph_index)
    graph = graph_index.hnsw
    if codes is None or graph.max_level < 0:
        return 0
    levels = [Level0(graph, level) for level in range(graph.max_level + 1)]
    num_levels = faiss.vector_to_array(graph.levels)  # [num_nodes] the levels each node is on (1: level 0 only)
    smallest = min(level.width for level in levels) // 2
    rarity = [len(num_levels) // max(1, int((num_levels > depth).sum())) for depth in range(len(levels))]
    hashes = _row_hashes(codes)
    order = np.argsort(hashes, kind="stable")
    starts = np.flatnonzero(np.r_[True, hashes[order][1:] != hashes[order][:-1], True])
    groups = [group for lo, hi in zip(starts[:-1].tolist(), starts[1:].tolist()) if hi - lo > smallest
              for group in _same_codes(codes, np.sort(order[lo:hi])) if len(group) > smallest]
    linked = set()
    # NOTE: a group's nearest points are searched for in a graph whose other groups are still cut off where it comes
    # before them: searched for again once they are linked, they are found; the upper levels first, which the
    # searches walk down
    for _ in range(COPY_PASSES):
        for number, group in enumerate(groups):
            for depth in range(len(levels) - 1, -1, -1):
                level, on_level = levels[depth], group[num_levels[group] > depth]
                if len(on_level) <= level.width // 2:
                    continue
                nearest = _nearest_points(graph_index, group, hashes, level.width, num_levels, depth, rarity[depth])
                if _relink(level, on_level, nearest):
                    linked.add(number)
    return len(linked)


def _relink(level0: Level0, group: np.ndarray, nearest: np.ndarray) -> bool:
    """Lay out the links of ``group`` (sorted ids of copies) and of a few of its ``nearest`` other nodes (nearest
    first) as ``link_copies`` says; ``False`` (nothing changed) where the group's links out do not fit.

    Proof that no reached node is cut off: ``c[i] -> c[i + 1]`` (a cycle) lets a walk that enters the group at any
    copy reach every copy, and every distinct link out of the group that a copy held before is held by some copy
    after, so a path through the group goes in, around the cycle, and out by the same link. A nearest node ``x``
    whose links are full gives up its farthest link ``x -> t`` for ``x -> copy``, and ``t`` joins the links out of
    the group: a path through ``x -> t`` goes ``x -> copy -> ... -> t``. No other link changes."""
    num_copies, width = len(group), level0.width
    capacity = num_copies * (width - 1)  # slots beside the cycle
    rows = level0.rows(group)  # [num_copies, width] a copy
    slot_major = rows.T.ravel()  # NOTE: every copy's nearest link first, then every copy's next one...
    kept = _distinct(slot_major[(slot_major >= 0) & ~np.isin(slot_major, group)])  # must stay: the proof
    if len(kept) > capacity:
        return False
    for j, node in enumerate(nearest[: width // 2].tolist()):  # links into the group, from its nearest nodes
        row = level0.row(node)
        if np.isin(row, group).any():
            continue
        copy = int(group[j % num_copies])
        free = np.flatnonzero(row < 0)
        if len(free):
            row[free[0]] = copy
        elif len(kept) < capacity:
            kept = _distinct(np.r_[kept, row[-1]])
            row[-1] = copy
    added = nearest[: width - 1]
    out = np.r_[added[~np.isin(added, kept)][: capacity - len(kept)], kept]  # the nearest first, all of kept
    new = np.full((num_copies, width), -1, dtype=rows.dtype)
    new[:, 0] = np.roll(group, -1)  # the cycle
    taken = np.ones(num_copies, dtype=np.int64)  # [num_copies] slots filled in each row
    for j, target in enumerate(out.tolist()):
        new[j % num_copies, taken[j % num_copies]] = target
        taken[j % num_copies] += 1
    level0.links[level0.offsets[group, None] + np.arange(width)] = new
    return True


def _nearest_points(graph_index: Any, group: np.ndarray, hashes: np.ndarray, wanted: int, num_levels: np.ndarray,
                    depth: int, rarity: int) -> np.ndarray:
    """Up to ``wanted`` nodes of level ``depth`` (``num_levels[node] > depth``: one node in about ``rarity`` is) nearest
    ``group``'s vector (a search), one per code (``hashes``): the nearest points are often other groups of copies,
    and ``wanted`` copies of one are one neighbour."""
    k = len(group) + wanted * rarity
    while True:
        _, found = _search(graph_index, group[:1], min(k, MAX_SEARCHED))
        nodes = found[0][(found[0] >= 0) & ~np.isin(found[0], group)]
        nodes = nodes[num_levels[nodes] > depth]
        _, first = np.unique(hashes[nodes], return_index=True)
        if len(first) >= wanted or k >= MAX_SEARCHED or (found[0] < 0).any():
            return nodes[np.sort(first)][:wanted]
        k *= 4


def _distinct(nodes: np.ndarray) -> np.ndarray:
    """``nodes`` without repeats, in the order met."""
    _, first = np.unique(nodes, return_index=True)
    return nodes[np.sort(first)]


def _codes(graph_index: Any) -> np.ndarray | None:
    """``[num_nodes, code_size]`` uint8 view of the codes ``graph_index``'s graph was built on (two nodes with the same
    code are the same point to it), or ``None`` where its storage keeps none FAISS exposes."""
    faiss = load_faiss()
    if isinstance(graph_index, faiss.IndexBinary):
        storage = faiss.downcast_IndexBinary(graph_index.storage)
        vector = storage.xb if isinstance(storage, faiss.IndexBinaryFlat) else None
    else:
        storage = faiss.downcast_index(graph_index.storage)
        vector = storage.codes if isinstance(storage, faiss.IndexFlatCodes) else None
    if vector is None or vector.size() == 0:
        return None
    codes = faiss.rev_swig_ptr(vector.data(), vector.size())
    return codes.reshape(-1, int(storage.code_size))


def _row_hashes(codes: np.ndarray) -> np.ndarray:
    """``[len(codes)]`` uint64: a hash of each code (equal codes, equal hashes; ``_same_codes`` checks the rest)."""
    code_size = codes.shape[1]
    words = -(-code_size // 8)
    coefficients = np.random.default_rng(0).integers(1, 1 << 63, words, dtype=np.uint64) * 2 + 1  # NOTE: odd
    rows = max(1, HASHED_BYTES // (words * 8))
    hashes = np.empty(len(codes), dtype=np.uint64)
    for start in range(0, len(codes), rows):
        block = codes[start : start + rows]
        if code_size % 8:  # NOTE: zero-padded to whole words; a code of whole words is read in place
            padded = np.zeros((len(block), words * 8), dtype=np.uint8)
            padded[:, :code_size] = block
            block = padded
        hashes[start : start + len(block)] = (block.view(np.uint64) * coefficients).sum(axis=1, dtype=np.uint64)
    return hashes


def _same_codes(codes: np.ndarray, members: np.ndarray) -> list[np.ndarray]:
    """``members`` (same hash, sorted) split by code: each group sorted."""
    rows = codes[members]
    if (rows == rows[0]).all():
        return [members]
    _, inverse = np.unique(rows, axis=0, return_inverse=True)
    return [members[inverse.ravel() == k] for k in range(int(inverse.max()) + 1)]
