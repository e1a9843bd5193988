"""``--search-device cuda``: top-k over a copy of the index's stored vectors on the GPU (torch), for a CUDA
server whose FAISS is the CPU build. This file is the exact search (every vector scored: a Flat index,
or ``--search-exact``) and the choice between it and an IVF index's own lists (``serve/gpu_ivf.py``).

```
load   every stored vector, decoded by FAISS (reconstruct_n; IVF through its direct map) -> GPU
       as float16 (default, 2 bytes a value: 1M x 1024 is 2 GiB) or float32
search queries [nq, d] -> page-locked staging -> GPU -> each row scaled by a power of two (float16: see
       below) -> one matmul against all vectors (float16 scores) -> top k' candidates straight from them
       (k' = max(4k, k+32)) -> only those rows scored again in float32 (the unscaled rows) -> top k -> one
       copy back and one synchronize -> FAISS's (scores, ids) -> IndexReader's hits
```

Exact over what the index stores: the hits are the true top k of the stored vectors (an IVF's
approximate search can only miss some of them). Scores agree with FAISS's to float16 storage
precision (about 1e-3), or to float32 rounding with ``--search-dtype float32``. Filters (``where``)
and binary indexes keep the FAISS path. A search runs on its own CUDA stream, beside engine steps.

float16 and the queries' range: a query is cast to float16 for the matmul only after its row is scaled by a
power of two (``GpuCopy._storage_queries``: its largest |value| brought to ``2**(query_exponent - 1)``, chosen
at load so that no product with a stored vector passes ``HALF_DOT_BOUND``). Exact: every float16 value and
score is the unscaled one times that power of two, so a row that float16 holds scores as before; a row
beyond float16 (|x| > 65504, or products that would pass 65504) or below it (subnormal: 1e-6, flushed: 1e-8)
ranks its candidates as FAISS does instead of as inf/NaN or zeros. The float32 pass scores the unscaled row.

float16 and the stored vectors' range: the copy is float16 only where float16 holds what is stored as exactly as
it holds unit vectors (``storage_dtype``, decided per copy while it uploads): no stored value beyond 65504
(inf), no row whose largest |value| is below float16's normal range (2**-14: a row scaled down to 1e-9 would be
zeros), a scaled query whose values stay normal, and products of the smallest rows that stay clear of float16's
subnormals. Else the copy is float32 (said in the log, ``/ready``'s ``search`` and ``petal_search_copy``): an
index of unnormalised rows beyond float16 (or of rows of very different norms) searches exactly, at 4 bytes a
value.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.files import INDEX_FILE, IVFDATA_FILE
from petal.pipeline.index.search import IndexReader, is_binary_manifest
from petal.pipeline.index.widen import searched_again
from petal.pipeline.reliability.errors import BadInputError

log = logging.getLogger("petal.serve")
UPLOAD_ROWS = 65536  # rows decoded and copied to the GPU at a time (256 MiB of float32 at dim 1024)
QUERY_ROWS = 256  # queries per matmul (scores [256, ntotal] in the storage dtype)
RESCORE_FACTOR = 4  # float16: candidates scored again in float32 = max(k * this, k + 32)
MEMORY_MARGIN = 1.25  # free GPU memory needed: this times the copy
HALF_DOT_BOUND = 2.0 ** 14  # float16: a scaled query's products with any stored vector stay under this (65504)
MAX_QUERY_EXPONENT = 14  # float16: a scaled query's values stay under 2**14
HALF_MAX = 65504.0  # float16's largest finite value
HALF_NORMAL = 2.0 ** -14  # float16's smallest normal value (below: subnormal, 2**-24 apart; below 2**-25: zero)
MIN_QUERY_EXPONENT = -13  # float16: a scaled query's largest value, 2**(t-1), stays normal
# float16: the products of a scaled query with the smallest stored row stay this far above float16's subnormals
# (2**-14): their rounding there is at most 2**-15 of the product's norms, under the float16 rows' own rounding
SMALL_PRODUCT = 2.0 ** -10


class NoRoom(Exception):
    """The GPU has no room for the copy (raised before it is made, or before a float32 copy replaces a float16
    one): the version is searched with FAISS on the CPU."""


class StoredNotFinite(Exception):
    """A stored vector holds NaN or infinite values (met while the copy uploads every row): the index is damaged,
    since petal never stores such a vector. ``gpu_reader`` says it as ``BadInputError`` naming the file."""

    def __init__(self, vector_id: int) -> None:
        super().__init__(f"vector {vector_id} holds NaN or infinite values")


@dataclass(frozen=True)
class StoredRange:
    """What decides whether float16 holds a copy's stored vectors: over the rows that are not all zeros, the
    largest |value|, the smallest of the rows' largest |value| (a row's peak), and the largest and smallest
    row norm. Rows of zeros are exact in float16 and left out."""

    largest: float = 0.0
    smallest_peak: float = math.inf
    largest_norm: float = 0.0
    smallest_norm: float = math.inf

    @classmethod
    def of(cls, peaks: np.ndarray, norms: np.ndarray) -> StoredRange:
        """From each row's largest |value| and its norm (float arrays of the same length)."""
        peaks = np.asarray(peaks, dtype=np.float64)
        norms = np.asarray(norms, dtype=np.float64)
        live = peaks != 0  # NOTE: NaN counts as live (and beyond every range)
        if not live.any():
            return cls()
        peaks, norms = peaks[live], norms[live]
        return cls(_worst(np.max, peaks), _worst(np.min, peaks), _worst(np.max, norms), _worst(np.min, norms))

    def merge(self, other: StoredRange) -> StoredRange:
        return StoredRange(max(self.largest, other.largest), min(self.smallest_peak, other.smallest_peak),
                           max(self.largest_norm, other.largest_norm), min(self.smallest_norm, other.smallest_norm))


def _worst(reduce: Callable[[np.ndarray], Any], values: np.ndarray) -> float:
    """``reduce(values)``, or inf where a value is not finite (nothing float16 can hold)."""
    return float(reduce(values)) if np.isfinite(values).all() else math.inf


def half_value_problem(stored: StoredRange) -> str | None:
    """Why float16 cannot hold the stored values themselves (``None``: it can, to its 11 bits a value)."""
    if not stored.largest <= HALF_MAX:
        return f"a stored value of {stored.largest:.4g} is beyond float16's range ({HALF_MAX:g})"
    if stored.smallest_peak < HALF_NORMAL:
        return (f"a stored row's largest |value| is {stored.smallest_peak:.4g}, below float16's normal range "
                f"({HALF_NORMAL:.3g}): float16 would round it coarsely or to zeros")
    return None


def storage_dtype(requested: str, stored: StoredRange, d: int) -> tuple[str, str | None]:
    """The GPU copy's dtype for stored vectors of ``stored``'s range at dimension ``d``, and why it is not the
    ``requested`` one (``None``: it is). float16 only where every stored value, the scaled queries
    (``query_exponent`` of the largest norm) and their products with the smallest rows stay in float16's normal
    range, so that a float16 score is as exact as the float16 rows it comes from; else float32."""
    if requested == "float32":
        return "float32", None
    problem = half_value_problem(stored)
    if problem is None and stored.largest_norm > 0:
        exact = math.floor(math.log2(HALF_DOT_BOUND / (math.sqrt(d) * stored.largest_norm)))
        if exact < MIN_QUERY_EXPONENT:
            problem = (f"stored norms up to {stored.largest_norm:.4g} at dimension {d}: a query scaled for float16 "
                       "products would leave float16's normal range")
        elif 2.0 ** (query_exponent(stored.largest_norm, d) - 1) * stored.smallest_norm < SMALL_PRODUCT:
            problem = (f"stored norms from {stored.smallest_norm:.4g} to {stored.largest_norm:.4g}: float16 products "
                       "with the smallest rows would fall below its normal range")
    if problem is None:
        return requested, None
    return "float32", problem


def query_exponent(max_norm: float, d: int) -> int:
    """float16: the exponent ``t`` that scaled queries' largest |value| stays under (``2**t``): their products
    with stored vectors of norm up to ``max_norm`` stay under ``HALF_DOT_BOUND`` (Cauchy-Schwarz: |q.x| <=
    sqrt(d) max|q| |x|), as large as that allows so that small scores do not fall below float16's normal range."""
    if not np.isfinite(max_norm) or max_norm <= 0:
        return MAX_QUERY_EXPONENT
    return int(np.clip(np.floor(np.log2(HALF_DOT_BOUND / (np.sqrt(d) * max_norm))), -MAX_QUERY_EXPONENT,
                       MAX_QUERY_EXPONENT))


def power_of_two(exponent: Any) -> Any:
    """``2.0 ** exponent`` (an int32 tensor, within -126..127) as float32, exactly: built from its bits."""
    import torch

    return torch.bitwise_left_shift(exponent + 127, 23).view(torch.float32)


def stored_vectors(index: Any, start: int, count: int) -> np.ndarray:
    """Vectors ``start..start+count`` as FAISS decodes them (float32, the index's space)."""
    return np.asarray(index.reconstruct_n(start, count), dtype=np.float32)


def prepare_reconstruct(index: Any) -> None:
    """Let ``reconstruct_n`` reach IVF vectors (a direct map: 8 bytes a vector, built once)."""
    faiss = load_faiss()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and ivf.direct_map.type == faiss.DirectMap.NoMap:
        ivf.make_direct_map()


class GpuCopy:
    """What both GPU copies share: the two attributes and the ``search`` of a FAISS index that
    ``IndexReader.search`` uses, the copy of the stored vectors (and their squared norms, for L2), a CUDA
    stream of their own and page-locked staging for the queries (one search at a time).

    A subclass calls ``_setup``, then ``_upload`` with the rows in the order it keeps them, and implements
    ``_chunk``."""

    def _setup(self, index: Any, device: str, dtype: str) -> None:
        import torch

        faiss = load_faiss()
        self.ntotal = int(index.ntotal)
        self.d = int(index.d)
        self.inner_product = index.metric_type == faiss.METRIC_INNER_PRODUCT
        self.device = torch.device(device)
        self.requested_dtype = dtype
        self.dtype = {"float16": torch.float16, "float32": torch.float32}[dtype]
        self.dtype_reason: str | None = None  # why the copy is not `requested_dtype` (storage_dtype)
        cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        # NOTE: page-locked staging made once: a query's copy in and the answer's copy out are asynchronous
        # (a pageable copy is a sync of its own), and the one synchronize of a search waits for both
        self._queries_host = torch.empty((QUERY_ROWS, self.d), dtype=torch.float32, pin_memory=cuda)
        self._lock = threading.Lock()  # one search at a time owns the staging buffers (views share it)

    def _upload(self, chunks: Callable[[], Iterable[np.ndarray]]) -> None:
        """``vectors [ntotal, d]`` in the storage dtype and, for L2, ``norms [ntotal]`` (float32) from float32
        row chunks, in order (``chunks()``: a new pass over them). The storage dtype is ``storage_dtype``'s for
        what the rows hold: a float16 copy that float16 cannot hold is made again, from a second pass, as
        float32 (``NoRoom`` when the GPU cannot take it)."""
        import torch

        stored = self._fill(chunks(), stop_early=self.dtype == torch.float16)
        chosen, self.dtype_reason = storage_dtype(self.requested_dtype, stored, self.d)
        if chosen == "float32" and self.dtype != torch.float32:
            self.vectors = torch.empty(0, device=self.device)  # NOTE: the float16 copy's memory back first
            self.dtype = torch.float32
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
                need = self.ntotal * self.d * 4 + self.ntotal * 4
                free, _ = torch.cuda.mem_get_info(self.device)
                if free < MEMORY_MARGIN * need:
                    raise NoRoom(f"{self.dtype_reason}, and a float32 copy needs {need >> 20} MiB, "
                                 f"{free >> 20} MiB are free")
            stored = self._fill(chunks(), stop_early=False)
        self.query_exponent = query_exponent(stored.largest_norm, self.d)
        if self.stream is not None:  # NOTE: the copy was written on the default stream; searches run on their own
            torch.cuda.synchronize(self.device)

    def _fill(self, chunks: Iterable[np.ndarray], stop_early: bool) -> StoredRange:
        """One pass of ``_upload`` into ``vectors`` (made here) and ``norms``: the range of the rows it read
        (``stop_early``: it stops after the first chunk whose values float16 cannot hold)."""
        import torch

        self.vectors = torch.empty((self.ntotal, self.d), dtype=self.dtype, device=self.device)
        norms = torch.empty(self.ntotal, dtype=torch.float32, device=self.device)
        stored = StoredRange()
        lo = 0
        for chunk in chunks:
            rows = torch.from_numpy(np.ascontiguousarray(chunk, dtype=np.float32)).to(self.device)
            self.vectors[lo : lo + len(rows)] = rows.to(self.dtype)
            squares = (rows * rows).sum(dim=1)
            norms[lo : lo + len(rows)] = squares
            lo += len(rows)
            peaks = rows.abs().amax(dim=1).cpu().numpy()
            damaged = np.flatnonzero(~np.isfinite(peaks))
            if len(damaged):  # NOTE: NaN scores no row and torch ranks it first: a search would drop or return it
                raise StoredNotFinite(self.vector_id(lo - len(rows) + int(damaged[0])))
            stored = stored.merge(StoredRange.of(peaks, squares.double().sqrt().cpu().numpy()))
            if stop_early and half_value_problem(stored) is not None:
                return stored
        self.norms = None if self.inner_product else norms
        return stored

    def vector_id(self, position: int) -> int:
        """The FAISS id of the copy's row ``position`` (rows in id order here; a subclass may keep another)."""
        return position

    def reconstruct(self, vector_id: int) -> np.ndarray:
        """The stored vector ``vector_id`` as the copy holds it (float32 ``[d]``), as FAISS's ``reconstruct``
        (``IndexReader`` looks at the vector of a hit scored NaN or infinite)."""
        import torch

        if not 0 <= vector_id < self.ntotal:
            raise RuntimeError(f"vector {vector_id} is not in the copy of {self.ntotal} vectors")
        with torch.inference_mode():
            row = self.vectors[self.position(vector_id)].float()
        return row.cpu().numpy()

    def position(self, vector_id: int) -> int:
        """The copy's row holding ``vector_id`` (the inverse of ``vector_id``)."""
        return vector_id

    def describe_dtype(self) -> str:
        """The copy's dtype for the log, and why it is not the one asked for."""
        name = "float16" if self.dtype_name == "float16" else "float32"
        return name if self.dtype_reason is None else f"{name} (not {self.requested_dtype}: {self.dtype_reason})"

    @property
    def dtype_name(self) -> str:
        import torch

        return "float16" if self.dtype == torch.float16 else "float32"

    def _storage_queries(self, q: Any) -> tuple[Any, Any]:
        """Queries ``q`` ``[n, d]`` (float32, on the device) for a product with the copy: (the rows in the storage
        dtype, ``back`` ``[n, 1]``: what their products are multiplied by to be ``q``'s; ``None``: float32, they
        are ``q``'s, or inner product, where only their order in a row is used).

        float16: each row scaled by a power of two first (its largest |value| to ``2**(query_exponent - 1)``), so
        that neither the row nor its products leave float16's normal range; exact, and one max-abs a row."""
        import torch

        if self.dtype == torch.float32:
            return q, None
        largest = torch.linalg.vector_norm(q, float("inf"), dim=1, keepdim=True)  # [n, 1]
        shift = (self.query_exponent - torch.frexp(largest).exponent).clamp_(-126, 126)  # a zero row: any
        scale = power_of_two(shift)
        return (q * scale).to(self.dtype), None if self.norms is None else scale.reciprocal()  # exact: 2**-shift

    def _width(self, k: int) -> int:
        """The answer's columns for ``k``."""
        return k

    def _chunk(self, staged: Any, k: int) -> tuple[Any, Any]:
        """Top ``k`` of the queries in ``staged`` (``[n, d]`` float32, page-locked on the host): FAISS's
        scores and ids, on the device (``[n, <= k]``)."""
        raise NotImplementedError

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's answer shape: scores ``[nq, k]`` (inner product: high first; L2: squared distance, low
        first) and ids ``[nq, k]``; fewer hits than ``k`` pad with id -1, as FAISS pads."""
        import torch

        width = max(0, self._width(k))
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        worst = np.float32(-np.finfo(np.float32).max if self.inner_product else np.finfo(np.float32).max)
        scores_out = np.full((len(queries), width), worst, dtype=np.float32)
        ids_out = np.full((len(queries), width), -1, dtype=np.int64)
        if width == 0 or len(queries) == 0 or self.ntotal == 0:
            return scores_out, ids_out
        context = torch.cuda.stream(self.stream) if self.stream is not None else _nothing()
        with self._lock, torch.inference_mode(), context:
            for lo in range(0, len(queries), QUERY_ROWS):
                n = min(QUERY_ROWS, len(queries) - lo)
                staged = self._queries_host[:n]
                staged.numpy()[:] = queries[lo : lo + n]
                scores, ids = self._chunk(staged, width)
                scores_host = scores.to("cpu", non_blocking=True)
                ids_host = ids.to("cpu", non_blocking=True)
                if self.stream is not None:
                    self.stream.synchronize()  # NOTE: the one synchronize of this chunk
                found = scores_host.shape[1]
                scores_out[lo : lo + n, :found] = scores_host.numpy()
                ids_out[lo : lo + n, :found] = ids_host.numpy()
        return scores_out, ids_out


class TorchExactIndex(GpuCopy):
    """Every stored vector scored: the exact top k."""

    def __init__(self, index: Any, device: str = "cuda", dtype: str = "float16") -> None:
        self._setup(index, device, dtype)
        prepare_reconstruct(index)
        self._upload(lambda: (stored_vectors(index, start, min(UPLOAD_ROWS, self.ntotal - start))
                              for start in range(0, self.ntotal, UPLOAD_ROWS)))

    def _width(self, k: int) -> int:
        return min(k, self.ntotal)

    def _chunk(self, staged: Any, k: int) -> tuple[Any, Any]:
        return self._top(staged.to(self.device, non_blocking=True), k)

    def _top(self, q: Any, k: int) -> tuple[Any, Any]:
        """Top ``k`` of queries ``q`` ``[n, d]`` (float32, on the device): FAISS's scores and ids, on the device.

        float16: one matmul in float16, the top ``k'`` (a margin over ``k``) straight from its float16
        scores, then only those ``k'`` rows scored again in float32 and the top ``k`` of them."""
        import torch

        # higher is better: q.x for inner product, 2 q.x - |x|^2 (= |q|^2 - distance) for L2
        scaled, back = self._storage_queries(q)
        coarse = torch.mm(scaled, self.vectors.T)  # [n, ntotal] in the storage dtype (float16: scaled rows)
        if self.norms is not None:
            coarse = coarse.float() * (2 if back is None else 2 * back) - self.norms
        if self.dtype == torch.float32:
            best, idx = torch.topk(coarse, k, dim=1)
        else:
            candidates = min(self.ntotal, max(k * RESCORE_FACTOR, k + 32))
            _, idx = torch.topk(coarse, candidates, dim=1, sorted=False)
            rows = self.vectors[idx].float()  # [n, candidates, d]: the only rows read again
            fine = torch.bmm(rows, q.unsqueeze(2)).squeeze(2)  # [n, candidates], float32
            if self.norms is not None:
                fine = 2 * fine - self.norms[idx]
            best, order = torch.topk(fine, k, dim=1)
            idx = torch.gather(idx, 1, order)
        if self.norms is not None:  # back to FAISS's squared L2 distance (never below 0: FAISS clamps it too)
            best = ((q * q).sum(dim=1, keepdim=True) - best).clamp_(min=0)
        return best, idx


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class GpuCopyReader(IndexReader):
    """An ``IndexReader`` whose ``index`` is a GPU copy (``gpu_reader``): a search left short of ``k`` by the lists
    it probed is searched again on the copy, with 4x the lists, up to every list, as ``IndexReader`` does with
    FAISS's parameters (which the copy does not take); an exact copy is never short."""

    # NOTE: no hit past k: the copy's CUDA graphs are captured for the k it serves (warm_up); a tie across the k-th
    # keeps whichever the copy's top k keeps
    TIE_PROBE = 0

    def _widened(self, queries: np.ndarray, k: int, scores: np.ndarray, ids: np.ndarray,
                 search_params: dict[str, int], selector: Any) -> tuple[np.ndarray, np.ndarray]:
        from petal.pipeline.serve.gpu_ivf import TorchIvfIndex

        index = self.index
        if not isinstance(index, TorchIvfIndex):
            return scores, ids
        assert selector is None  # NOTE: a filtered search keeps the FAISS reader (GpuReaders.get's callers)

        def wider() -> Iterator[int]:  # NOTE: from the view's nprobe (a request's, GpuReaders.get), not search_params'
            nprobe = index.nprobe
            while nprobe < index.nlist:
                nprobe = min(index.nlist, 4 * nprobe)
                yield nprobe

        return searched_again(lambda rows, nprobe: index.with_nprobe(nprobe).search(rows, k), queries, k, scores, ids,
                              wider())


def gpu_reader(reader: IndexReader, device: str = "cuda", dtype: str = "float16",
               exact: bool = False, warm_k: int | None = None) -> IndexReader | None:
    """A copy of ``reader`` that searches a GPU copy of its vectors (``None``: a binary index, or not
    enough free GPU memory; the FAISS path then serves, as said in the log).

    An IVF index searches its own lists there (``serve/gpu_ivf.py``: FAISS's answer, with the reader's
    ``nprobe``) unless ``exact``; any other searches every vector (the exact top k)."""
    import torch

    from petal.pipeline.serve.gpu_ivf import TorchIvfIndex, coarse_problem, is_plain_ivf
    from petal.pipeline.serve.requests import DEFAULT_K

    if is_binary_manifest(reader.manifest):
        log.warning("petal serve: --search-device cuda: a binary index searches with FAISS on the CPU")
        return None
    lists = not exact and is_plain_ivf(reader.index)
    problem = coarse_problem(reader.index) if lists else None
    if problem is not None:
        log.warning("petal serve: --search-device cuda: the lists of %s are not copied (%s): searching every "
                    "vector on the GPU instead", reader.dir.name, problem)
        lists = False
    need = reader.ntotal * reader.dim * (2 if dtype == "float16" else 4) + reader.ntotal * (28 if lists else 4)
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        if free < MEMORY_MARGIN * need:
            log.warning("petal serve: --search-device cuda: %d MiB free on the GPU, the index needs %d MiB: "
                        "searching with FAISS on the CPU", free >> 20, need >> 20)
            return None
    out = copy.copy(reader)  # NOTE: shares the ids, columns and manifest; only `index` differs
    out.__class__ = GpuCopyReader  # NOTE: its searches left short widen on the copy, not through FAISS parameters
    try:
        if lists:
            nprobe = int(reader.search_params.get("nprobe", 1))
            try:
                lists_copy = TorchIvfIndex(reader.index, nprobe, device, dtype)
            except RuntimeError as exc:  # FAISS cannot hand over this index's centroids or lists
                log.warning("petal serve: --search-device cuda: the lists of %s are not copied (%s): searching "
                            "every vector on the GPU instead", reader.dir.name, str(exc).strip()[:200])
            else:
                # the graphs of default requests (k left out: 10, or --max-k when lower), before the version serves
                lists_copy.warm_up(DEFAULT_K if warm_k is None else warm_k)
                log.info("petal serve: the GPU copy of %s: %s; %s", reader.dir.name, lists_copy.describe(),
                         lists_copy.describe_dtype())
                out.index = lists_copy  # type: ignore[assignment]  # FAISS duck type
                return out
        exact_copy = TorchExactIndex(reader.index, device, dtype)
    except NoRoom as exc:
        log.warning("petal serve: --search-device cuda: the GPU copy of %s is not made (%s): searching with FAISS "
                    "on the CPU", reader.dir.name, exc)
        return None
    except StoredNotFinite as exc:
        # NOTE: the copy reads every stored vector, past the head/tail records an open checks: damage in the body
        # of the file is found here, before the version serves (FAISS on the CPU finds it only when a search meets
        # it), and refused as IndexReader refuses it then (_check_scores)
        held_in = IVFDATA_FILE if reader.storage == "ondisk" else INDEX_FILE
        raise BadInputError(f"{reader.dir / held_in}: {exc}: the index is corrupt; run petal verify and rebuild "
                            "it") from None
    if exact_copy.dtype_reason is not None:
        log.info("petal serve: the GPU copy of %s: every vector scored; %s", reader.dir.name,
                 exact_copy.describe_dtype())
    out.index = exact_copy  # type: ignore[assignment]  # FAISS duck type
    return out


class GpuReaders:
    """The GPU copy of each served version, built when the version loads (before it serves) and freed
    with it."""

    def __init__(self, device: str, dtype: str, exact: bool = False, warm_k: int | None = None) -> None:
        self.device = device
        self.dtype = dtype
        self.exact = exact
        self.warm_k = warm_k  # the k of a /search that leaves it out (the graphs captured before a version serves)
        self._readers: dict[int, IndexReader | None] = {}

    def prepare(self, reader: IndexReader) -> None:
        key = id(reader)
        if key in self._readers:
            return
        self._readers[key] = gpu_reader(reader, self.device, self.dtype, self.exact, self.warm_k)
        weakref.finalize(reader, self._readers.pop, key, None)

    def describe(self, reader: IndexReader) -> dict[str, Any]:
        """How ``reader``'s version is searched (``/ready``'s ``search``): on the GPU copy (``copy``: ``lists`` or
        ``exact``; its ``dtype``, and ``dtype_reason`` when it is not the one asked for), or FAISS on the CPU
        (no copy: a binary index, no room on the GPU; the log says which)."""
        from petal.pipeline.serve.gpu_ivf import TorchIvfIndex

        found = self._readers.get(id(reader))
        if found is None:
            return {"device": "cpu", "copy": None}
        index = found.index
        assert isinstance(index, GpuCopy)
        out: dict[str, Any] = {"device": str(index.device), "copy": "lists" if isinstance(index, TorchIvfIndex)
                               else "exact", "dtype": index.dtype_name}
        if index.dtype_reason is not None:
            out["dtype_reason"] = index.dtype_reason
        return out

    def get(self, reader: IndexReader, nprobe: int | None = None) -> IndexReader | None:
        """The GPU copy of ``reader`` (``None``: none was made); with ``nprobe``, a view that probes that
        many lists (``None`` when the copy has no lists to probe: an exact copy, whose FAISS index then
        answers a request's ``nprobe``)."""
        from petal.pipeline.serve.gpu_ivf import TorchIvfIndex

        found = self._readers.get(id(reader))
        if found is None or nprobe is None:
            return found
        if not isinstance(found.index, TorchIvfIndex):
            return None
        view = copy.copy(found)
        view.index = found.index.with_nprobe(nprobe)  # type: ignore[assignment]  # FAISS duck type
        return view
