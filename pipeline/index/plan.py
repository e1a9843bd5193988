"""Choosing the FAISS index: by the number of vectors, their dimension and a memory budget.

``auto`` follows the FAISS wiki ("Guidelines to choose an index"):

* exact (``Flat``) while the corpus is small and fits the budget;
* else IVF with ``nlist`` = the smallest power of two >= 4*sqrt(N) (inside FAISS's 4..16*sqrt(N)),
  an HNSW coarse quantizer from 16384 lists (about 4M vectors), and the best codes that fit the budget:
  ``Flat`` (4d bytes), ``SQfp16`` (2d), ``SQ8`` (d), then ``PQ{m}`` for m = d/4, d/8, d/16 (m bytes;
  compressed codes cap recall, and the tuning then reports the target as not reached);
* when not even the smallest codes fit, ``SQ8`` inverted lists on disk (memory-mapped at query
  time; SQ8 keeps recall near exact, and disk is not the budget).

An explicit factory string is taken as given; an IVF one over the budget is built on disk.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.faiss_loader import load_faiss

# NOTE: measured on the 2-core machine at 4096 lists x 384 dims, adding through an HNSW32 quantizer
# was 2x slower than the flat one (BLAS); HNSW pays off where the wiki uses it, at 65536 lists and up.
HNSW_QUANTIZER_MIN_LISTS = 16384
HNSW_QUANTIZER_M = 32
ID_BYTES = 8  # every IVF entry stores its int64 id beside its code


@dataclass(frozen=True)
class IndexPlan:
    """What will be built, where it lives, and why."""

    factory: str
    storage: str  # "memory" | "ondisk" (IVF lists in index.ivfdata, memory-mapped)
    nlist: int  # inverted lists (0: not IVF)
    bytes_per_vector: int  # code + id
    estimated_bytes: int  # the whole index
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ivf_lists(num_vectors: int) -> int:
    """The smallest power of two >= 4*sqrt(N) (so within FAISS's recommended 4..16*sqrt(N)), but
    no more lists than leave 39 vectors each to train on (FAISS's minimum; binds below ~25k)."""
    wanted = 2 ** math.ceil(math.log2(max(1.0, 4 * math.sqrt(num_vectors))))
    trainable = 2 ** math.floor(math.log2(max(1.0, num_vectors / 39)))
    return max(1, min(wanted, trainable))


def make_index(factory: str, dim: int, metric: str) -> Any:
    """An empty FAISS index; a string FAISS rejects is a ``ValueError`` naming it."""
    faiss = load_faiss()
    metric_type = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    try:
        return faiss.index_factory(dim, factory, metric_type)
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        raise ValueError(f"--index-factory {factory!r} is not a valid FAISS factory string for dim {dim}: "
                         f"{message}") from exc


def estimate_bytes(index: Any, num_vectors: int) -> tuple[int, int]:
    """``(bytes per vector, fixed bytes)`` of ``index`` once it holds ``num_vectors`` vectors."""
    faiss = load_faiss()
    fixed = 0
    while isinstance(index, faiss.IndexPreTransform):
        for i in range(index.chain.size()):  # e.g. the OPQ rotation: d_in x d_out floats
            transform = index.chain.at(i)
            fixed += transform.d_in * transform.d_out * 4
        index = faiss.downcast_index(index.index)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        quantizer = faiss.downcast_index(ivf.quantizer)
        per_centroid = ivf.d * 4 + (2 * 4 * quantizer.hnsw.nb_neighbors(1) if hasattr(quantizer, "hnsw") else 0)
        return int(ivf.code_size) + ID_BYTES, fixed + ivf.nlist * per_centroid
    index = faiss.downcast_index(index)
    if hasattr(index, "hnsw"):
        storage = faiss.downcast_index(index.storage)
        code = int(getattr(storage, "code_size", index.d * 4))
        return code + 2 * 4 * index.hnsw.nb_neighbors(1), fixed
    if hasattr(index, "code_size"):
        return int(index.code_size), fixed
    return index.d * 4, fixed


def _plan(factory: str, storage: str, num_vectors: int, dim: int, metric: str, reason: str) -> IndexPlan:
    index = make_index(factory, dim, metric)
    per_vector, fixed = estimate_bytes(index, num_vectors)
    ivf = load_faiss().try_extract_index_ivf(index)
    return IndexPlan(factory, storage, int(ivf.nlist) if ivf is not None else 0, per_vector,
                     fixed + per_vector * num_vectors, reason)


def code_ladder(dim: int) -> list[str]:
    """IVF codes from the most to the least precise (``{q}`` stands for the coarse quantizer)."""
    ladder = ["{q},Flat", "{q},SQfp16", "{q},SQ8"]
    for m in (dim // 4, dim // 8, dim // 16):
        # NOTE: no OPQ rotation: on the 2-core machine OPQ96_384 trained 10-20x longer than PQ96
        # (212 s vs 25 s on 65k vectors) for no recall gain on the benchmark data. Ask for it
        # explicitly (--index-factory OPQ96_384,IVF4096,PQ96) where it pays.
        if m >= 4 and dim % m == 0 and f"{{q}},PQ{m}" not in ladder:
            ladder.append(f"{{q}},PQ{m}")
    return ladder


def plan_index(num_vectors: int, dim: int, settings: IndexSettings) -> IndexPlan:
    """The index for ``num_vectors`` vectors of ``dim`` under ``settings`` (factory, memory budget)."""
    budget = settings.memory_bytes
    if settings.factory != "auto":
        plan = _plan(settings.factory, "memory", num_vectors, dim, settings.metric, "asked for")
        if plan.estimated_bytes <= budget:
            return plan
        if plan.nlist and "IVFPQR" not in type(make_index(settings.factory, dim, settings.metric)).__name__:
            return _plan(settings.factory, "ondisk", num_vectors, dim, settings.metric,
                         f"asked for; {_size(plan.estimated_bytes)} > --index-memory {_size(budget)}: "
                         "inverted lists on disk")
        return IndexPlan(**{**plan.as_dict(), "reason": f"asked for; {_size(plan.estimated_bytes)} > --index-memory "
                                                        f"{_size(budget)}, but only IVF indexes can live on disk"})
    flat = _plan("Flat", "memory", num_vectors, dim, settings.metric, "")
    if num_vectors <= settings.flat_max_vectors and flat.estimated_bytes <= budget:
        return IndexPlan(**{**flat.as_dict(), "reason": f"exact: {num_vectors} vectors <= {settings.flat_max_vectors}"
                                                        f" and {_size(flat.estimated_bytes)} <= {_size(budget)}"})
    nlist = ivf_lists(max(num_vectors, 1))
    quantizer = f"IVF{nlist}" + (f"_HNSW{HNSW_QUANTIZER_M}" if nlist >= HNSW_QUANTIZER_MIN_LISTS else "")
    too_big: list[str] = []
    for codes in code_ladder(dim):
        plan = _plan(codes.format(q=quantizer), "memory", num_vectors, dim, settings.metric, "")
        if plan.estimated_bytes <= budget:
            why = f"{num_vectors} vectors > {settings.flat_max_vectors}" if num_vectors > settings.flat_max_vectors \
                else f"exact Flat needs {_size(flat.estimated_bytes)}"
            if too_big:
                why += "; " + ", ".join(too_big)
            return IndexPlan(**{**plan.as_dict(), "reason": f"{why}; {_size(plan.estimated_bytes)} <= {_size(budget)}"})
        too_big.append(f"{codes.split(',')[-1]} codes need {_size(plan.estimated_bytes)}")
    return _plan(f"{quantizer},SQ8", "ondisk", num_vectors, dim, settings.metric,
                 f"even {too_big[-1]} > --index-memory {_size(budget)}: SQ8 inverted lists on disk")


def _size(num_bytes: int) -> str:
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f}{unit}"
    return f"{num_bytes}B"
