"""Every k-means FAISS runs to train an index, found and told what the sample allows, so FAISS never prints.

FAISS's ``Clustering`` writes ``WARNING clustering 342 points to 16 centroids: please provide at least 624
training points`` with C's ``fprintf(stderr)`` whenever it gets fewer than ``min_points_per_centroid`` (39 by
default) points per centroid: past Python's ``sys.stderr``, the ``petal`` logger and ``quiet=True``, into an API
caller's stderr or a cron log. An ``OPQ8,IVF16,PQ8`` on 342 vectors printed it 409 times (8 sub-quantizers a
round, 50 rounds of the rotation's own PQ). Here each k-means gets ``min_points_per_centroid`` no higher than its
points allow, and the thin ones come back for petal's own warning (``writer._train`` says it).

Where FAISS runs k-means (``faiss/Clustering.cpp``, its only training print outside ``verbose``): an IVF's lists
(``cp``, float or binary; ``Index2Layer``'s ``q1.cp``), every product quantizer (``pq``, ``refine_pq``: IVF-PQ,
PQ, fast-scan, IMI's quantizer, HNSW-PQ's storage), every residual quantizer step (``rq``, a product residual
quantizer's parts), and an OPQ rotation's own PQ (``pq_default`` inside ``OPQMatrix::train``, which only a
``pq`` of ours replaces). A coarse quantizer FAISS trains alone on the list centroids (``IVF16(PQ4),Flat``,
``quantizer_trains_alone`` 2) gets ``nlist`` points, not the sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from petal.pipeline.index.faiss_loader import load_faiss

OPQ_PQ_BITS = 8  # NOTE: OPQMatrix::train's own PQ is ProductQuantizer(d_out, M, 8) when none is given


@dataclass(frozen=True)
class KMeans:
    """One k-means a training runs: ``centroids`` fitted to ``points`` vectors."""

    what: str  # "IVF lists", "centroids per PQ sub-quantizer", ...
    centroids: int
    points: int
    kind: str = "codes"  # what to give fewer of: "lists", "codes", "opq" (its PQ is 8 bits), "coarse"
    under: str = ""  # "the coarse quantizer's ": inside one FAISS trains on the list centroids

    @property
    def per_centroid(self) -> int:
        return self.points // max(self.centroids, 1)


@contextmanager
def floored_kmeans(index: Any, num_points: int, floor: int) -> Iterator[list[KMeans]]:
    """For the block (``index.train`` of ``num_points`` vectors): every k-means inside ``index`` (float or binary,
    at any depth) asks for at most ``floor`` points per centroid and never more than it gets, so FAISS prints
    nothing; yields those given fewer than ``floor`` per centroid (none: the sample is enough)."""
    faiss = load_faiss()
    found: list[tuple[KMeans, Any]] = []
    attached: list[Any] = []  # OPQ rotations given a PQ of ours: detached after, their PQs kept alive till then
    kept: list[Any] = []
    _walk(faiss, index, num_points, found, attached, kept, set(), "")
    for kmeans, params in found:
        params.min_points_per_centroid = max(1, min(floor, kmeans.per_centroid))
    try:
        yield [kmeans for kmeans, _ in found if kmeans.per_centroid < floor]
    finally:
        for opq in attached:
            opq.pq = None  # NOTE: a raw pointer to ``kept``; the rotation itself is written without it
        kept.clear()


def _walk(faiss: Any, index: Any, points: int, found: list[tuple[KMeans, Any]], attached: list[Any],
          kept: list[Any], seen: set[int], coarse: str) -> None:
    """``coarse``: "" at the top; "the coarse quantizer's " under an IVF whose quantizer FAISS trains on the list
    centroids (fewer of them is no remedy: a flat quantizer is)."""

    def add(what: str, centroids: int, kmeans_points: int, params: Any, kind: str) -> None:
        found.append((KMeans(what, centroids, kmeans_points, "coarse" if coarse else kind, coarse), params))

    if isinstance(index, faiss.IndexBinary):
        index = faiss.downcast_IndexBinary(index)
        if isinstance(index, faiss.IndexBinaryIVF):
            add("IVF lists", int(index.nlist), points, index.cp, "lists")
        return
    node = faiss.downcast_index(index)
    if int(node.this) in seen:  # NOTE: another Python wrapper of the same C++ index: compare the pointers
        return
    seen.add(int(node.this))
    if isinstance(node, faiss.IndexPreTransform):
        for i in range(node.chain.size()):
            transform = faiss.downcast_VectorTransform(node.chain.at(i))
            if isinstance(transform, faiss.OPQMatrix):
                opq_points = min(points, int(transform.max_train_points))
                if transform.pq is None:
                    pq = faiss.ProductQuantizer(int(transform.d_out), int(transform.M), OPQ_PQ_BITS)
                    kept.append(pq)
                    transform.pq = pq
                    attached.append(transform)
                pq = transform.pq
                add("centroids per sub-quantizer of the OPQ rotation's PQ", int(pq.ksub), opq_points, pq.cp, "opq")
    if isinstance(node, faiss.IndexIVF):
        add("IVF lists", int(node.nlist), points, node.cp, "lists")
        alone = node.quantizer_trains_alone  # NOTE: a C char: SWIG gives a 1-character str
        alone = ord(alone) if isinstance(alone, str) else int(alone)
        if alone == 2:  # NOTE: FAISS trains it on the list centroids, after the lists' k-means
            _walk(faiss, node.quantizer, int(node.nlist), found, attached, kept, seen, "the coarse quantizer's ")
        elif alone == 1:  # it trains itself on the sample (IMI, a residual coarse quantizer)
            _walk(faiss, node.quantizer, points, found, attached, kept, seen, coarse)
    q1 = getattr(node, "q1", None)  # Index2Layer's level-1 quantizer
    if q1 is not None:
        add("IVF lists", int(q1.nlist), points, q1.cp, "lists")
    for name in ("pq", "refine_pq"):
        pq = getattr(node, name, None)
        if pq is not None:
            add("centroids per PQ sub-quantizer", int(pq.ksub), points, pq.cp, "codes")
    quantizers = {}
    for name in ("rq", "prq", "aq"):  # NOTE: ``aq`` is ``rq``/``prq`` again: one entry per C++ quantizer
        aq = getattr(node, name, None)
        if aq is not None:
            aq = faiss.downcast_AdditiveQuantizer(aq)
            quantizers[int(aq.this)] = aq
    for aq in quantizers.values():
        parts = [faiss.downcast_AdditiveQuantizer(aq.subquantizer(i)) for i in range(aq.nsplits)] \
            if isinstance(aq, faiss.ProductAdditiveQuantizer) else [aq]
        for part in parts:
            if isinstance(part, faiss.ResidualQuantizer) and part.nbits.size():
                bits = int(max(faiss.vector_to_array(part.nbits)))
                add("centroids per residual quantizer step", 1 << bits, points, part.cp, "codes")
    for name in ("index", "base_index", "refine_index", "storage"):  # id maps, pre-transforms, refine, graphs
        inner = getattr(node, name, None)
        if inner is not None:
            _walk(faiss, inner, points, found, attached, kept, seen, coarse)


def thin_warning(factory: str, thin: list[KMeans], floor: int) -> str:
    """petal's warning for the k-means of ``factory`` that got fewer than ``floor`` points per centroid (``thin``,
    from ``floored_kmeans``): how many each got, and what to give instead."""
    said: list[str] = []
    remedies: list[str] = []
    for kmeans in thin:
        part = (f"{kmeans.under}{kmeans.centroids} {kmeans.what}: {kmeans.per_centroid} each "
                f"(of {kmeans.points} vectors)")
        most = kmeans.points // floor
        bits = most.bit_length() - 1
        if kmeans.kind == "lists":
            ivf = "BIVF" if factory.startswith("B") else "IVF"  # NOTE: binary factories spell their lists BIVFn
            remedy = f"at most {most} lists ({ivf}{most})" if most else f"no {ivf} (a Flat or HNSW index)"
        elif kmeans.kind == "codes" and "fs" in factory:
            # NOTE: fast-scan PQ (PQnx4fs) takes 4-bit codes only: fewer bits is no factory FAISS parses
            remedy = f"no fast-scan PQ (its 4-bit codes need {floor * kmeans.centroids} vectors)"
        elif kmeans.kind == "codes":
            remedy = f"codes of at most {bits} bits (x{bits})" if bits > 0 else "no trained codes (Flat, SQ8)"
        elif kmeans.kind == "opq":
            remedy = f"no OPQ rotation (its PQ takes 8 bits: {floor * kmeans.centroids} vectors)"
        else:
            remedy = "a flat or HNSW coarse quantizer (IVFn, IVFn_HNSW32)"
        said += [part] if part not in said else []
        remedies += [remedy] if remedy not in remedies else []
    return (f"warning: the {factory!r} index trained its k-means on too few vectors (fewer than {floor} a centroid): "
            f"{'; '.join(said)}; centroids placed from so few vectors cost recall and speed: give "
            f"{' and '.join(remedies)}, --index-factory auto, or index more vectors")
