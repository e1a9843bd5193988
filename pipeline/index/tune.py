"""Tuning search parameters (nprobe, quantizer_efSearch, efSearch; a binary hash index's nflip) to a recall target.

Queries are held-out vectors of the corpus (not used for training). An HNSW graph is tuned with
its queries' nodes unlinked (``graph_holdout.py``): a query that is a node of the graph walks
straight to its neighbours and lifts recall for free. The ground truth is exact search over every
indexed vector (for a graph, every one but the queries), streamed from the store in chunks
(FAISS ``knn_ground_truth``), so it never holds the corpus in memory. A query's own vector is
dropped from both result lists: real queries are not in the corpus, and keeping it would lift
recall for free. A returned vector is a hit when its exact distance ties or beats the k-th true one's
(``RecallAtK``): exact search lists one of several copies of a vector, any search may find another.

Binary indexes are tuned the same way, as ``petal query`` searches them: Hamming candidates
re-ranked with the float vectors (``pipeline/index/binary.py``), against exact float search; a
binary HNSW (``BHNSW...``) with its queries unlinked too, its efSearch.

Settings are tried from cheapest to most expensive; the first whose recall is above the target
with two standard errors to spare wins (so the target holds for new queries, not just these).
When recall stops rising before the target (compressed codes), the best setting tried wins and
the manifest says the target was not reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from petal.pipeline.index.binary import BinaryIndex
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.graph_holdout import hnsw_graph
from petal.pipeline.index.plan import searched_nodes
from petal.pipeline.index.source import StoreVectors

TUNE_K = 10
SINGLE_QUERY_SAMPLES = 20  # NOTE: one-query searches of a wide IVF cost ~10 ms each on 16 cores


@dataclass(frozen=True)
class Tuning:
    """The chosen search parameters and what they measured on the held-out queries."""

    params: dict[str, int]  # {} when the index has no search parameters
    target_recall_at_10: float
    recall_at_10: float  # mean over the queries
    recall_at_10_low: float  # mean - 2 standard errors: the number held against the target
    reached: bool
    ms_per_query: float  # one batched search of every query, divided by their count
    single_query_ms_p50: float  # one query per search call
    queries: int
    curve: list[dict[str, Any]] = field(default_factory=list)  # every setting tried

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def exact_neighbours(queries: np.ndarray, source: StoreVectors, k: int, metric: str, chunk_rows: int) -> np.ndarray:
    """``[num_queries, k]`` int64 FAISS ids of the exact nearest neighbours (-1 past the corpus size)."""
    faiss = load_faiss()
    from faiss.contrib.exhaustive_search import knn_ground_truth

    metric_type = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    # NOTE: knn_ground_truth numbers the vectors in iteration order: that is the FAISS id order.
    _, ids = knn_ground_truth(queries, (vectors for _, vectors in source.chunks(chunk_rows)), k, metric_type)
    return ids


# neighbours past k + 1 the truth computes: a graph's drops the other queries (unlinked), and an exact-code IVF's
# prediction sees the copies of a k-th neighbour it lists (``predicted_recalls``)
TRUTH_EXTRA = 32


def without_ids(truth: np.ndarray, dropped: np.ndarray, k: int) -> np.ndarray:
    """``[num_queries, k]``: each row of ``truth`` without the ids in ``dropped``, in order, -1 past what is left."""
    keep = ~np.isin(truth, dropped)
    out = np.full((len(truth), k), -1, dtype=truth.dtype)
    for q, (row, kept) in enumerate(zip(truth, keep)):
        left = row[kept][:k]
        out[q, : len(left)] = left
    return out


SCORED_VALUES = 1 << 20  # float64 values (8 MiB) of (query, vector) pairs RecallAtK scores at a time
TIE_RTOL = 1e-6  # NOTE: ~8 float32 ulps of the terms a score is made of: closer than this, float32 search cannot order


class RecallAtK:
    """recall@k of search results against exact search, ties included: a returned vector is a true neighbour when
    its exact distance to the query is at most the k-th true one's (within ``TIE_RTOL`` of the query's scale),
    whichever of the vectors at that distance exact search happened to list.

    NOTE: exact search breaks ties by id, so a corpus of copies (20 of each vector) had as its truth the lowest ids
    of each group, and a graph returning other copies at distance 0 was scored a miss: recall@10 0.61 at efSearch
    2048 where efSearch 16 found 10 copies for every query. Distances are the float64 ones of the vectors
    themselves (``take``), never the index's: SQ/PQ codes and Hamming candidates score approximately, and
    FAISS's float32 distances differ in their last bits between two computations of one pair."""

    def __init__(self, queries: np.ndarray, query_ids: np.ndarray, truth: np.ndarray, k: int,
                 take: Callable[[np.ndarray], np.ndarray], metric: str) -> None:
        """``queries [q, d]`` with their own ids ``query_ids [q]`` (dropped from every list), ``truth [q, >= k + 1]``
        FAISS ids of their exact neighbours nearest first (-1 past the corpus), ``take`` the float32 ``[n, d]``
        vectors of sorted unique FAISS ids, ``metric`` ``ip`` or ``l2``."""
        assert metric in ("ip", "l2"), metric
        self.queries = np.ascontiguousarray(queries, dtype=np.float64)  # [q, d]
        self.query_ids = np.asarray(query_ids, dtype=np.int64)  # [q]
        self.k, self.take, self.metric = k, take, metric
        self.truth = self._without_own(np.asarray(truth, dtype=np.int64), truth.shape[1])  # [q, >= k]
        full = (np.asarray(truth) >= 0).all(axis=1)  # [q] exact search listed as many as asked: more may tie
        self.counts = (self.truth[:, :k] >= 0).sum(axis=1)  # [q] true neighbours there are (k, fewer in a tiny corpus)
        scores = self.scores(self.truth)  # [q, >= k]
        valid = self.truth[:, :k] >= 0
        # NOTE: the largest of the first k, not the k-th: float32 exact search may list near-ties in either order
        kth_col = np.argmax(np.where(valid, scores[:, :k], -np.inf), axis=1)  # [q]
        kth = scores[np.arange(len(scores)), kth_col]
        kth_ids = self.truth[np.arange(len(scores)), kth_col]
        self.bound = np.where(self.counts > 0, kth + TIE_RTOL * self._scale(kth_ids), np.inf)  # [q] nearest a miss
        self.truth_hits = (scores <= self.bound[:, None]) & (self.truth >= 0)  # [q, >= k]: the truth's ties included
        last = np.maximum((self.truth >= 0).sum(axis=1) - 1, 0)
        # True when some query's last listed true neighbour still ties its k-th: exact search may have more at that
        # distance than ``truth`` lists, and a search finding those finds true neighbours no prediction can see
        self.ties_past_truth = bool((full & self.truth_hits[np.arange(len(last)), last]).any())

    def _without_own(self, ids: np.ndarray, width: int) -> np.ndarray:
        """``ids`` with each query's own id dropped (the rest moved up, -1 at the end), ``width`` columns."""
        out = np.full((len(ids), width), -1, dtype=np.int64)
        for q, (row, own) in enumerate(zip(ids, self.query_ids)):
            left = row[(row != own) & (row >= 0)][:width]
            out[q, : len(left)] = left
        return out

    def _scale(self, kth_ids: np.ndarray) -> np.ndarray:
        """``[q]`` the size of the terms a query's k-th score is made of (``l2``: |q|^2 + |y|^2, ``ip``: |q| |y|),
        which float32 arithmetic errs relative to."""
        query_norms = np.linalg.norm(self.queries, axis=1)
        vector_norms = np.zeros(len(kth_ids))
        valid = kth_ids >= 0
        if valid.any():
            unique = np.unique(kth_ids[valid])
            norms = np.linalg.norm(np.asarray(self.take(unique), dtype=np.float64), axis=1)
            vector_norms[valid] = norms[np.searchsorted(unique, kth_ids[valid])]
        return query_norms**2 + vector_norms**2 if self.metric == "l2" else query_norms * vector_norms

    def scores(self, ids: np.ndarray) -> np.ndarray:
        """``[q, m]`` float64 exact scores of ``ids [q, m]`` for their queries, smaller is nearer (``l2``: squared
        distance, ``ip``: minus the inner product); ``inf`` at -1."""
        out = np.full(ids.shape, np.inf)
        # NOTE: a few thousand pairs a time: the truth's 1000 x 43 pairs at dim 1024 were 350 MB of float64 at once;
        # then 4096 pairs whatever the dimension, 32 MiB an array at 1024 dims, ~150 MiB over the index while tuning:
        # now a number of values, ~40 MiB in all at any dimension
        step = max(1, SCORED_VALUES // max(self.queries.shape[1], 1) // max(ids.shape[1], 1))
        for lo in range(0, len(ids), step):
            part = ids[lo : lo + step]
            valid = part >= 0
            unique = np.unique(part[valid])
            if not len(unique):
                continue
            vectors = np.asarray(self.take(unique), dtype=np.float64)  # [len(unique), d]
            rows, cols = np.nonzero(valid)
            picked = vectors[np.searchsorted(unique, part[rows, cols])]  # [num_valid, d]
            queries = self.queries[lo + rows]
            if self.metric == "l2":
                out[lo + rows, cols] = ((picked - queries) ** 2).sum(axis=1)
            else:
                out[lo + rows, cols] = -np.einsum("nd,nd->n", picked, queries)
        return out

    def __call__(self, found: np.ndarray) -> np.ndarray:
        """``[q]`` recall@k of ``found [q, >= k]`` (FAISS ids, -1 padding): its first k hits other than the query
        itself that are as near as the k-th true neighbour, over the true neighbours there are."""
        returned = self._without_own(np.asarray(found, dtype=np.int64), self.k)
        for row in returned:  # NOTE: an id listed twice counts once
            _, first = np.unique(row, return_index=True)
            repeat = np.ones(len(row), dtype=bool)
            repeat[first] = False
            row[repeat] = -1
        hits = (self.scores(returned) <= self.bound[:, None]).sum(axis=1)
        return np.where(self.counts > 0, np.minimum(hits, self.counts) / np.maximum(self.counts, 1), 1.0)


def _geometric(low: int, high: int) -> list[int]:
    """``low``, ~``low * sqrt(2)``, ``2 * low``, ... up to and including ``high``."""
    values, step = set(), 0
    while (value := round(low * 2 ** (step / 2))) < high:
        values.add(int(value))
        step += 1
    return sorted(values | {high})


REFINE_K_FACTORS = (1, 2, 4, 8, 16, 32, 64)  # a refine wrapper re-ranks k_factor x k candidates of its base index


def search_grid(index: Any) -> list[dict[str, int]]:
    """The settings to try for ``index``, cheapest first ([{}] when it has none), found through its wrappers (id
    maps, pre-transforms, refine): an IVF's ``nprobe`` (and its HNSW quantizer's ``quantizer_efSearch``), an HNSW's
    ``efSearch``; a refine wrapper's ``k_factor_rf`` (FAISS's default 1 re-ranks only the k hits it returns, so the
    refinement never finds what the base index missed) in blocks, each over the base settings."""
    faiss = load_faiss()

    if isinstance(index, BinaryIndex):  # Hamming candidates + float rescoring: an IVF's nprobe, a hash's nflip
        if index.hash_bits:
            return [{}, *({"nflip": n} for n in range(1, index.max_nflip + 1))]
        if index.is_graph:
            # NOTE: from the candidates the search asks for ((k + 1) hits x rescore): a walk narrower than them leaves
            # the rescoring poorer ones (BHNSW4: efSearch 16 recall@10 0.64, 110 0.80, 1760 0.95; BFlat 0.99)
            low = max(16, (TUNE_K + 1) * max(index.rescore, 1))
            return [{"efSearch": ef} for ef in _geometric(low, max(4096, 4 * low))]
        return [{"nprobe": n} for n in _geometric(1, index.nlist)] if index.nlist else [{}]
    base: list[dict[str, int]] = [{}]
    ivf = faiss.try_extract_index_ivf(index)
    searched = searched_nodes(index)
    if ivf is not None:
        hnsw_quantizer = hasattr(faiss.downcast_index(ivf.quantizer), "hnsw")
        base = []
        for nprobe in _geometric(1, int(ivf.nlist)):
            params = {"nprobe": nprobe}
            if hnsw_quantizer:
                params["quantizer_efSearch"] = max(16, 2 * nprobe)
            base.append(params)
    elif any(isinstance(node, faiss.IndexHNSW) for node in searched):
        base = [{"efSearch": ef} for ef in _geometric(16, 4096)]
    if not any(isinstance(node, faiss.IndexRefine) for node in searched):
        return base
    return [{**params, "k_factor_rf": k_factor} for k_factor in REFINE_K_FACTORS for params in base]


def walks_a_graph(index: Any) -> bool:
    """True when ``index``'s search walks an HNSW graph over the indexed vectors themselves (HNSW over Flat, SQ or
    PQ codes; under id maps, pre-transforms, refine; a binary ``BHNSW``, bare FAISS or a ``BinaryIndex``): not an
    IVF, whose graph, if any, is over the centroids."""
    return hnsw_graph(index) is not None


def is_exact(index: Any) -> bool:
    """True for uncompressed flat indexes: their search is exhaustive, recall@k is 1 by definition."""
    faiss = load_faiss()
    return not isinstance(index, BinaryIndex) and isinstance(faiss.downcast_index(index), faiss.IndexFlat)


EXACT_LATENCY_SAMPLES = 3  # NOTE: a one-query exhaustive scan of a large index takes tens of ms


def exact_tuning(index: Any, queries: np.ndarray, target: float, k: int = TUNE_K) -> Tuning:
    """What ``tune`` records for an exact index, without a ground truth to measure against: no
    parameters, recall 1, and the latency of a few one-query searches."""
    single = []
    for i in range(min(EXACT_LATENCY_SAMPLES, len(queries))):
        started = time.perf_counter()
        index.search(queries[i : i + 1], k)
        single.append(1000 * (time.perf_counter() - started))
    p50 = round(float(np.median(single)), 4) if single else 0.0
    return Tuning(params={}, target_recall_at_10=target, recall_at_10=1.0, recall_at_10_low=1.0, reached=True,
                  ms_per_query=p50, single_query_ms_p50=p50, queries=len(single), curve=[])


PLATEAU_GAIN = 0.002


def _blocks(grid: list[dict[str, int]]) -> list[list[dict[str, int]]]:
    """``grid`` in runs of the same refine ``k_factor_rf`` (one run when there is none)."""
    blocks: list[list[dict[str, int]]] = []
    for params in grid:
        if not blocks or blocks[-1][-1].get("k_factor_rf") != params.get("k_factor_rf"):
            blocks.append([])
        blocks[-1].append(params)
    return blocks


def _plateau(curve: list[dict[str, Any]], steps: int = 4, gain: float = PLATEAU_GAIN) -> bool:
    """True when the last ``steps`` settings raised recall by less than ``gain`` in all: the codes,
    not the search breadth, limit recall (PQ), and wider searches only cost time."""
    return len(curve) > steps and curve[-1]["recall_at_10"] - curve[-1 - steps]["recall_at_10"] < gain


def apply_params(index: Any, params: dict[str, int]) -> None:
    """Set search parameters by name (FAISS ``ParameterSpace``: reaches through OPQ/IDMap wrappers)."""
    faiss = load_faiss()

    if isinstance(index, BinaryIndex):
        index.set_params(params)
    elif params:
        faiss.ParameterSpace().set_index_parameters(index, ",".join(f"{k}={v}" for k, v in params.items()))


def _low(recalls: np.ndarray) -> float:
    """Mean recall less two standard errors (the number held against the target)."""
    return float(recalls.mean() - 2 * recalls.std(ddof=1) / np.sqrt(len(recalls))) if len(recalls) > 1 \
        else float(recalls.mean())


def exact_codes_ivf(index: Any) -> Any | None:
    """The ``IndexIVFFlat`` that ``index`` is (flat quantizer, lists in memory), else ``None``: its search
    at ``nprobe`` finds exactly the true neighbours that sit in the ``nprobe`` lists nearest the query."""
    faiss = load_faiss()
    if isinstance(index, BinaryIndex):
        return None
    ivf = faiss.downcast_index(index)
    if not isinstance(ivf, faiss.IndexIVFFlat) or not isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexFlat):
        return None
    if not isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.ArrayInvertedLists):
        return None
    return ivf


def predicted_recalls(ivf: Any, recall: RecallAtK, nprobes: list[int]) -> list[np.ndarray]:
    """``[num_queries]`` recall@k at each of ``nprobes`` without searching: a true neighbour (the truth's ties of the
    k-th included) is found at ``nprobe`` iff its list ranks below ``nprobe`` among the query's nearest centroids
    (exact codes: every vector of a probed list is scored exactly), and a query finds at most its k. One quantizer
    search instead of one IVF search per setting; exact unless ``recall.ties_past_truth``."""
    faiss = load_faiss()
    nlist = int(ivf.nlist)
    truth = recall.truth
    list_of = np.full(max(int(ivf.ntotal), int(truth.max(initial=-1)) + 1), -1, dtype=np.int64)  # FAISS id -> list
    invlists = ivf.invlists
    for number in range(nlist):
        size = invlists.list_size(number)
        if size:
            list_of[faiss.rev_swig_ptr(invlists.get_ids(number), size)] = number
    queries = np.ascontiguousarray(recall.queries, dtype=np.float32)
    _, nearest = ivf.quantizer.search(queries, nlist)
    rank = np.empty_like(nearest)
    rank[np.arange(len(nearest))[:, None], nearest] = np.arange(nlist)[None, :]
    lists = list_of[np.maximum(truth, 0)]  # [q, width]
    ranks = np.where(recall.truth_hits & (lists >= 0), np.take_along_axis(rank, np.maximum(lists, 0), axis=1), nlist)
    counts = recall.counts
    return [np.where(counts > 0, np.minimum((ranks < n).sum(axis=1), counts) / np.maximum(counts, 1), 1.0)
            for n in nprobes]


def _first_setting(index: Any, grid: list[dict[str, int]], recall: RecallAtK,
                   target: float) -> tuple[int, list[dict[str, Any]]]:
    """Where the measured sweep starts: the setting the predicted curve picks (exact-code IVF), with the
    predicted entries below it; else the cheapest setting and no entries."""
    ivf = exact_codes_ivf(index)
    if ivf is None or len(grid) < 2 or any(set(p) != {"nprobe"} for p in grid):
        return 0, []
    if recall.ties_past_truth:
        # NOTE: ties the truth does not list (more copies of a vector than it holds) are found in lists the
        # prediction cannot place: it would undercount, and start the sweep past cheaper settings that reach
        return 0, []
    predicted = predicted_recalls(ivf, recall, [p["nprobe"] for p in grid])
    curve: list[dict[str, Any]] = []
    for position, (params, recalls) in enumerate(zip(grid, predicted)):
        curve.append({"params": params, "recall_at_10": round(float(recalls.mean()), 4), "ms_per_query": None,
                      "predicted": True})
        if _low(recalls) >= target or _plateau(curve):
            return position, curve[:-1]
    return len(grid) - 1, curve[:-1]


def tune(index: Any, queries: np.ndarray, recall: RecallAtK, target: float) -> Tuning:
    """Cheapest setting of ``index`` whose recall@k on ``queries [q, d]`` float32 (``recall``: against their exact
    neighbours, ties included) reaches ``target``; the best one tried when none does.

    An exact-code IVF (``IVFn,Flat``) starts measuring at the setting its predicted curve picks
    (``predicted_recalls``: no search per setting); the measured sweep goes on from there until the
    measured recall holds.
    """
    k = recall.k
    best: tuple[float, dict[str, int], np.ndarray, float] | None = None
    grid = search_grid(index)
    start, curve = _first_setting(index, grid, recall, target)
    previous = -np.inf
    for block in _blocks(grid[start:]):
        block_start = len(curve) if previous > -np.inf else 0  # NOTE: the first block's plateau counts predictions
        block_best, reached = -np.inf, False
        for params in block:
            apply_params(index, params)
            started = time.perf_counter()
            _, found = index.search(queries, k + 1)
            ms_per_query = 1000 * (time.perf_counter() - started) / len(queries)
            recalls = recall(found)
            low = _low(recalls)
            curve.append({"params": params, "recall_at_10": round(float(recalls.mean()), 4),
                          "ms_per_query": round(ms_per_query, 4)})
            block_best = max(block_best, low)
            if best is None or low > best[0]:
                best = (low, params, recalls, ms_per_query)
            reached = low >= target
            if reached or _plateau(curve[block_start:]):
                break
        # a refine wrapper's next k_factor_rf block only while the last one still raised recall
        if reached or block_best < previous + PLATEAU_GAIN:
            break
        previous = block_best
    assert best is not None
    low, params, recalls, ms_per_query = best
    apply_params(index, params)
    single = []
    for i in range(min(SINGLE_QUERY_SAMPLES, len(queries))):
        started = time.perf_counter()
        index.search(queries[i : i + 1], k)
        single.append(1000 * (time.perf_counter() - started))
    return Tuning(params=params, target_recall_at_10=target, recall_at_10=round(float(recalls.mean()), 4),
                  recall_at_10_low=round(low, 4), reached=low >= target, ms_per_query=round(ms_per_query, 4),
                  single_query_ms_p50=round(float(np.median(single)), 4), queries=len(queries), curve=curve)
