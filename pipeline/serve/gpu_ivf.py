"""``--search-device cuda`` on an IVF index: the index's own inverted lists searched on the GPU (torch),
FAISS's IVF answer for the same ``nprobe``, reading only the probed lists instead of every vector.

```
load   the coarse centroids, decoded -> GPU float32 [nlist, d]
       every list's vectors, decoded by FAISS, in list order -> GPU [ntotal, d] (float16 or float32),
       their ids [ntotal]; each list cut into segments of at most S rows (start, length per segment;
       first segment and count per list)
search queries [n, d] -> scores against every centroid (float32) -> top nprobe lists, then either
       gather: their segments (as many slots as the nprobe longest lists hold: no synchronize), in windows
         sized to a memory budget: rows [n, w * S] gathered, scored, padding masked -> top k per window
         -> top k of the windows' candidates
       scan (when the gathered rows would pass SCAN_RATIO of all rows): one product with every row, the
         rows of lists not probed masked -> top k
       (float16: the top k' of the float16 scores scored again in float32) -> one copy back, one synchronize
```

float16 products take each query row scaled by a power of two (``GpuCopy._storage_queries``), as in
``serve/gpu_search.py``: a row beyond float16's range or below its normal range ranks as FAISS ranks it. The
lists' copy is float16 only where float16 holds the stored rows (``gpu_search.storage_dtype``, decided for this
copy's rows): else float32, and the fused kernel reads float32 rows.

On CUDA up to 16 queries replay one CUDA graph (captured per query bucket, k and nprobe): a lone
query's ~30 small kernels cost one launch.

The hits are those of FAISS's IVF search with the same ``nprobe``: the probed lists' vectors, scored
exactly (to float16 storage precision with the default ``--search-dtype``). The coarse step scores
every centroid, so with an HNSW quantizer (which FAISS searches approximately) a query can only probe
closer lists. Cutting lists into segments bounds the padding: a query reads as many segments as the
nprobe longest lists hold (its unused slots all read one row), not nprobe times the longest list.
A search runs on its own CUDA stream, beside engine steps.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from petal.engine.layers.triton_kernels import triton_available
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.serve.gather_dots import gather_dots
from petal.pipeline.serve.gpu_search import QUERY_ROWS, RESCORE_FACTOR, UPLOAD_ROWS, GpuCopy, prepare_reconstruct

GATHER_BYTES = 256 << 20  # the rows one window gathers and scores
GRAPH_QUERIES = (1, 2, 4, 8, 16)  # on CUDA a search of up to 16 queries replays a graph, padded to these
MAX_GRAPHS = 32  # graphs kept, one per (query bucket, k, nprobe)
MIN_SEGMENT_ROWS = 32
MAX_SEGMENT_ROWS = 1024
# NOTE: gather the probed lists' rows while they are under these shares of all rows; else scan every row
# once and mask the lists not probed (the same answer). Fused, measured on the H200 (1M x 1024 in
# IVF4096,Flat at nprobe 91, bench/gpu_search_probe.py --index): gather 0.28 / 0.40 / 0.65 / 2.17 ms
# against scan 0.84 / 0.93 / 1.16 / 2.53 ms at 1 / 4 / 16 / 64 queries (64 x 91 probes = 1.4 x 4096 lists)
SCAN_RATIO = 0.3  # torch: the bound's slots, over all rows
FUSED_SCAN_RATIO = 1.5  # fused: queries x probes, over the lists


def is_plain_ivf(index: Any) -> bool:
    """An IVF index with nothing in front of it (no PCA/OPQ transform the queries would need)."""
    return isinstance(index, load_faiss().IndexIVF)


def coarse_problem(index: Any) -> str | None:
    """Why this IVF's lists cannot be searched here (``None``: they can). The coarse step scores decoded
    centroids exactly: that is FAISS's own choice of lists for a flat quantizer, and lists at least as close
    for an HNSW one (exact centroids, approximate search); any other quantizer decodes them lossily."""
    faiss = load_faiss()
    quantizer = faiss.downcast_index(index.quantizer)
    if isinstance(quantizer, (faiss.IndexFlat, faiss.IndexHNSWFlat)):
        return None
    return f"its coarse quantizer is {type(quantizer).__name__}, not flat or HNSW"


def graph_bucket(queries: int) -> int | None:
    """The graph a search of ``queries`` rows replays (``None``: more than the largest, run eagerly)."""
    return next((bucket for bucket in GRAPH_QUERIES if bucket >= queries), None)


def segment_rows(ntotal: int, nlist: int) -> int:
    """Rows per segment: the mean list length rounded up to a power of two, within 32..1024."""
    mean = max(1, -(-ntotal // max(1, nlist)))
    return int(min(MAX_SEGMENT_ROWS, max(MIN_SEGMENT_ROWS, 1 << (mean - 1).bit_length())))


def list_ids(invlists: Any, list_no: int) -> np.ndarray:
    """The ids stored in one inverted list, in list order (int64)."""
    faiss = load_faiss()
    size = int(invlists.list_size(list_no))
    if size == 0:
        return np.empty(0, dtype=np.int64)
    pointer = invlists.get_ids(list_no)
    try:
        return np.array(faiss.rev_swig_ptr(pointer, size), dtype=np.int64)
    finally:
        invlists.release_ids(list_no, pointer)


class TorchIvfIndex(GpuCopy):
    """A GPU copy of an IVF index's lists; ``with_nprobe`` gives a view that probes another number of lists."""

    def __init__(self, index: Any, nprobe: int, device: str = "cuda", dtype: str = "float16") -> None:
        import torch

        faiss = load_faiss()
        self._setup(index, device, dtype)
        self.nlist = int(index.nlist)
        self.nprobe = max(1, int(nprobe))
        coarse_ip = index.quantizer.metric_type == faiss.METRIC_INNER_PRODUCT
        self.segment = segment_rows(self.ntotal, self.nlist)

        ids_per_list = [list_ids(index.invlists, i) for i in range(self.nlist)]
        sizes = np.array([len(ids) for ids in ids_per_list], dtype=np.int64)
        order = np.concatenate(ids_per_list) if self.ntotal else np.empty(0, dtype=np.int64)
        if len(order) != self.ntotal:
            raise RuntimeError(f"the inverted lists hold {len(order)} ids for {self.ntotal} vectors")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        nseg = -(-sizes // self.segment)  # an empty list has no segment
        first = np.concatenate([[0], np.cumsum(nseg)[:-1]]).astype(np.int64)
        seg_list = np.repeat(np.arange(self.nlist), nseg)
        seg_index = np.arange(int(nseg.sum())) - first[seg_list]  # the segment's place in its list
        seg_start = starts[seg_list] + seg_index * self.segment
        seg_len = np.minimum(self.segment, sizes[seg_list] - seg_index * self.segment)
        # NOTE: one padding segment (length 0) at the end: the slots past a query's own segments point at it
        self.pad_segment = len(seg_start)
        seg_start = np.append(seg_start, 0)
        seg_len = np.append(seg_len, 0)

        def put(array: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

        centroids = np.asarray(index.quantizer.reconstruct_n(0, self.nlist), dtype=np.float32)
        self.centroids = put(centroids)  # [nlist, d] float32
        self.centroid_norms = None if coarse_ip else (self.centroids * self.centroids).sum(dim=1)
        self.list_nseg = put(nseg)
        self.list_first = put(first)
        self.seg_start = put(seg_start)
        self.seg_len = put(seg_len)
        self.ids = put(order)  # [ntotal] int64: the FAISS id of each row, in list order
        # the most segments any `p` lists hold (the p longest): how many slots a query probing p lists needs
        self.most_segments = np.maximum(1, np.cumsum(np.sort(nseg)[::-1]))
        self.slot_numbers = put(np.arange(int(self.most_segments[-1]), dtype=np.int64))[None, :]
        self.segment_offsets = put(np.arange(self.segment, dtype=np.int64))
        self.longest_list = int(sizes.max()) if len(sizes) else 0
        self.row_list = put(np.repeat(np.arange(self.nlist), sizes))  # [ntotal]: each row's list
        self.row_numbers = put(np.arange(self.ntotal, dtype=np.int64))[None, :]
        self._graphs: OrderedDict[tuple[int, int, int], tuple[Any, Any, tuple[Any, Any]]] = OrderedDict()
        self._pool: Any = None  # the graphs' one memory pool

        self.fused = self.stream is not None and triton_available()  # gathered rows scored by serve/gather_dots.py
        self._upload(lambda: _rows_in_list_order(index, order))

    def vector_id(self, position: int) -> int:
        return int(self.ids[position])  # rows in list order

    def position(self, vector_id: int) -> int:
        import torch

        found = torch.nonzero(self.ids == vector_id)
        if not len(found):
            raise RuntimeError(f"vector {vector_id} is in none of the copy's lists")
        return int(found[0, 0])

    def describe(self) -> str:
        """One line for the log: the lists, and what a search at this copy's nprobe reads."""
        probes = min(self.nprobe, self.nlist)
        rows = int(self.most_segments[probes - 1]) * self.segment
        most = self.most_gathered(probes)
        plan = f"up to {most} queries gather their lists, more scan" if most else "every search scans"
        return (f"{self.nlist} lists of {self.ntotal // max(1, self.nlist)} rows on average (longest "
                f"{self.longest_list}); nprobe {probes} reads at most {rows} rows a query; {plan}")

    def warm_up(self, k: int) -> None:
        """Before the version serves: capture the graphs of ``k`` and this copy's ``nprobe``, one per query
        bucket, and run the eager sizes once (``eager_warm_up_queries``: gathering and scanning).

        NOTE: the eager paths' first run pays one-time costs (the first launch of each kernel loads its module
        under CUDA's lazy loading; the allocator's first blocks of that size): on the H200, a 200k-vector
        IVF2048 copy's first 16-token /search at 64 clients held ~30 requests for ~90 ms in its search span
        (``petal bench serve``'s slowest-1% line), where later runs of the same row did not."""
        if self.stream is not None and self.ntotal:
            for queries in (*GRAPH_QUERIES, *self.eager_warm_up_queries()):
                self.search(np.zeros((queries, self.d), dtype=np.float32), k)

    def eager_warm_up_queries(self) -> tuple[int, ...]:
        """Query counts past the graphs that reach each eager path at this ``nprobe``: the fewest (17), the most
        that still gather, the fewest that scan, and a full chunk (``QUERY_ROWS``)."""
        most = self.most_gathered(min(self.nprobe, self.nlist))
        sizes = {GRAPH_QUERIES[-1] + 1, most, most + 1, QUERY_ROWS}
        return tuple(sorted(n for n in sizes if GRAPH_QUERIES[-1] < n <= QUERY_ROWS))

    def with_nprobe(self, nprobe: int) -> TorchIvfIndex:
        """A view on the same GPU copy that probes ``nprobe`` lists."""
        view = copy.copy(self)
        view.nprobe = max(1, int(nprobe))
        return view

    def _chunk(self, staged: Any, k: int) -> tuple[Any, Any]:
        probes = min(self.nprobe, self.nlist)
        bucket = graph_bucket(len(staged)) if self.stream is not None else None
        if bucket is None:
            return self._top(staged.to(self.device, non_blocking=True), k, probes)
        # a few queries: one graph replay (its rows past n hold stale queries: their answers are dropped)
        graph, static_q, (scores, ids) = self._graph(bucket, k, probes)
        static_q[: len(staged)].copy_(staged, non_blocking=True)
        graph.replay()
        return scores[: len(staged)], ids[: len(staged)]

    def _graph(self, queries: int, k: int, probes: int) -> tuple[Any, Any, tuple[Any, Any]]:
        """The CUDA graph of ``_top`` for ``queries`` rows, ``k`` and ``probes`` (captured on first use; the
        ``MAX_GRAPHS`` most recently used are kept): (graph, its query input ``[queries, d]``, its outputs).

        NOTE: every graph of this copy shares one memory pool, so one graph's outputs may lie in another's
        scratch memory: they are read (copied out and synchronized) before the lock lets another replay in."""
        import torch

        key = (queries, k, probes)
        found = self._graphs.get(key)
        if found is not None:
            self._graphs.move_to_end(key)
            return found
        static_q = torch.zeros((queries, self.d), dtype=torch.float32, device=self.device)
        self._top(static_q, k, probes)  # NOTE: eager first: cuBLAS picks its kernels outside the capture
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # NOTE: thread-local capture: the engine thread keeps launching steps on its own streams meanwhile
        with torch.cuda.graph(graph, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"):
            outputs = self._top(static_q, k, probes)
        self._graphs[key] = (graph, static_q, outputs)
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return self._graphs[key]

    def gathers(self, queries: int, probes: int) -> bool:
        """Whether ``queries`` queries probing ``probes`` lists gather their lists' rows (else: one scan of
        every row, the unprobed lists masked).

        Fused (CUDA): each probed row is read once, padding not at all, so gathering pays while the rows
        the probes hold on average stay under ``FUSED_SCAN_RATIO`` times all rows. Torch: every slot up
        to the bound is read, written and read again: ``SCAN_RATIO`` of all rows."""
        return queries <= self.most_gathered(probes)

    def most_gathered(self, probes: int) -> int:
        """The most queries a search probing ``probes`` lists gathers for (0: it always scans)."""
        if self.fused:
            return int(FUSED_SCAN_RATIO * self.nlist // probes)
        return int(SCAN_RATIO * self.ntotal // (int(self.most_segments[probes - 1]) * self.segment))

    def _top(self, q: Any, k: int, probes: int) -> tuple[Any, Any]:
        """Top ``k`` (or fewer: the probed lists' size) of queries ``q`` ``[n, d]`` (float32, on the device)
        over their ``probes`` nearest lists: FAISS's scores and ids, on the device (id -1 where the lists
        ran out). Shapes depend only on ``n``, ``k`` and ``probes`` (no synchronize: a graph can hold it).

        float16: rows are scored in float16, and the top ``k'`` (a margin over ``k``) again in float32."""
        import torch

        coarse = torch.mm(q, self.centroids.T)  # [n, nlist] float32
        if self.centroid_norms is not None:  # L2: the nearest centroids have the largest 2 q.c - |c|^2
            coarse = 2 * coarse - self.centroid_norms
        lists = torch.topk(coarse, probes, dim=1).indices  # [n, probes]
        if self.gathers(q.shape[0], probes):
            scores, ids = self._gathered(q, k, lists)
        else:
            scores, ids = self._scanned(q, k, lists)
        worst = -torch.finfo(torch.float32).max
        found = scores > float("-inf")  # NOTE: not padding (-inf) nor NaN; +inf is a hit, as FAISS answers it
        if self.norms is not None:  # back to FAISS's squared L2 distance (padding: FLT_MAX, as FAISS pads)
            # (never below 0: the expansion's float32 rounding; FAISS clamps it too)
            return torch.where(found, ((q * q).sum(dim=1, keepdim=True) - scores).clamp(min=0), -worst), ids
        return torch.where(found, scores, worst), ids

    def _gathered(self, q: Any, k: int, lists: Any) -> tuple[Any, Any]:
        """The probed lists' rows gathered, in windows of segments: (higher-is-better scores, ids)."""
        import torch

        n, probes = lists.shape
        nseg = self.list_nseg[lists]  # [n, probes]
        ends = torch.cumsum(nseg, dim=1)
        totals = ends[:, -1:]  # the segments each query reads
        slots_bound = int(self.most_segments[probes - 1])  # NOTE: a bound known on the host: no synchronize
        # what a window holds per row: the gathered row (torch), or its id and score (fused)
        row_bytes = 12 if self.fused else self.d * self.dtype.itemsize
        window = max(1, GATHER_BYTES // (n * self.segment * row_bytes))
        best_scores, best_ids = [], []
        scaled, back = (q, None) if self.fused else self._storage_queries(q)  # fused: float32 q, unscaled
        for t0 in range(0, slots_bound, window):
            slots = self.slot_numbers[:, t0 : min(slots_bound, t0 + window)].expand(n, -1).contiguous()  # [n, w]
            probe = torch.searchsorted(ends, slots, right=True).clamp_(max=probes - 1)  # the slot's probe
            within = slots - (ends.gather(1, probe) - nseg.gather(1, probe))  # its place among the list's segments
            seg = torch.where(slots < totals, self.list_first[lists.gather(1, probe)] + within, self.pad_segment)
            rows = self.seg_start[seg][..., None] + self.segment_offsets  # [n, w, S]
            valid = (self.segment_offsets < self.seg_len[seg][..., None]).reshape(n, -1)  # [n, w * S]
            if self.fused:  # float32 scores of the stored rows, each read once: no second pass
                dots = gather_dots(self.vectors, torch.where(valid, rows.reshape(n, -1), -1), q)  # [n, w * S]
                rows = torch.where(valid, rows.reshape(n, -1), 0)
                scores = self._score(dots, rows).masked_fill_(~valid, float("-inf"))
                top, at = torch.topk(scores, min(k, scores.shape[1]), dim=1)
                top_rows = rows.gather(1, at)
            else:
                rows = torch.where(valid, rows.reshape(n, -1), 0)
                dots = torch.bmm(self.vectors[rows], scaled[:, :, None])[:, :, 0]  # [n, w * S]
                top, top_rows = self._best(q, k, dots, rows, valid, back)
            best_scores.append(top)
            best_ids.append(torch.where(top > float("-inf"), self.ids[top_rows], -1))  # (see _top)
        scores = torch.cat(best_scores, dim=1)
        ids = torch.cat(best_ids, dim=1)
        if len(best_scores) > 1:
            scores, at = torch.topk(scores, min(k, scores.shape[1]), dim=1)
            ids = ids.gather(1, at)
        return scores, ids

    def _scanned(self, q: Any, k: int, lists: Any) -> tuple[Any, Any]:
        """One product with every row, the rows of unprobed lists masked: (higher-is-better scores, ids)."""
        import torch

        n = lists.shape[0]
        probed = torch.zeros((n, self.nlist), dtype=torch.bool, device=self.device).scatter_(1, lists, True)
        valid = probed[:, self.row_list]  # [n, ntotal]: the row's list is probed
        scaled, back = self._storage_queries(q)
        dots = torch.mm(scaled, self.vectors.T)  # [n, ntotal]
        rows = self.row_numbers.expand(n, -1)
        top, top_rows = self._best(q, k, dots, rows, valid, back)
        return top, torch.where(top > float("-inf"), self.ids[top_rows], -1)  # (see _top)

    def _best(self, q: Any, k: int, dots: Any, rows: Any, valid: Any, back: Any = None) -> tuple[Any, Any]:
        """The top ``k`` of candidate ``rows`` ``[n, m]`` by their ``dots`` with ``q`` (in the storage dtype, of
        the rows ``_storage_queries`` gave: times ``back`` they are ``q``'s; ``valid``: not padding, not masked):
        (higher-is-better float32 scores, -inf past the valid ones; their rows). float16: the top ``k'`` of the
        float16 scores are scored again in float32."""
        import torch

        scores = self._score(dots.float(), rows, back).masked_fill_(~valid, float("-inf"))
        if self.dtype != torch.float32:
            at = torch.topk(scores, min(max(k * RESCORE_FACTOR, k + 32), scores.shape[1]), dim=1).indices
            rows, valid = rows.gather(1, at), valid.gather(1, at)
            dots = torch.bmm(self.vectors[rows].float(), q[:, :, None])[:, :, 0]
            scores = self._score(dots, rows).masked_fill_(~valid, float("-inf"))
        top, at = torch.topk(scores, min(k, scores.shape[1]), dim=1)
        return top, rows.gather(1, at)

    def _score(self, dots: Any, rows: Any, back: Any = None) -> Any:
        """Higher is better: ``q.x`` (inner product), or ``2 q.x - |x|^2`` (L2: ``|q|^2 -`` the distance), from
        ``dots`` that are ``q.x`` times ``back`` (``None``: 1). Inner product keeps float16's scaled dots (no
        ``back``): a positive factor a row does not change its order, and only the float32 pass's scores are
        answered."""
        if self.norms is None:
            return dots
        return (2 if back is None else 2 * back) * dots - self.norms[rows]


def _rows_in_list_order(index: Any, order: np.ndarray) -> Iterator[np.ndarray]:
    """The stored vectors of ``order`` (every id, in list order) as FAISS decodes them, ``UPLOAD_ROWS`` at a
    time (float32 ``[rows, d]``): ``IndexIVFFlat`` lists are read as they are (their codes are the float32
    rows), any other codes are decoded through a direct map."""
    faiss = load_faiss()
    d = int(index.d)
    if not (isinstance(index, faiss.IndexIVFFlat) and int(index.code_size) == 4 * d):
        prepare_reconstruct(index)
        for lo in range(0, len(order), UPLOAD_ROWS):
            yield np.asarray(index.reconstruct_batch(order[lo : lo + UPLOAD_ROWS]), dtype=np.float32)
        return
    pending: list[np.ndarray] = []
    held = 0
    for list_no in range(int(index.nlist)):
        size = int(index.invlists.list_size(list_no))
        if size == 0:
            continue
        pointer = index.invlists.get_codes(list_no)
        try:
            codes = np.array(faiss.rev_swig_ptr(pointer, size * 4 * d), dtype=np.uint8)
        finally:
            index.invlists.release_codes(list_no, pointer)
        pending.append(codes.view(np.float32).reshape(size, d))
        held += size
        if held >= UPLOAD_ROWS:
            yield np.concatenate(pending)
            pending, held = [], 0
    if pending:
        yield np.concatenate(pending)
