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

The codes follow the output format of the stored vectors (``pipeline/store/outputs.py``), through
the same rule (``KINDS``): float32 as above; float16 ``SQfp16`` codes (exact), then SQ8/PQ;
int8 ``SQ8`` codes only (their ranges are the calibration); binary ``BFlat``/``BIVF{n}`` (Hamming,
sign bits; binary indexes cannot live on disk). ``check_index_factory`` is the one check of an
``--index-factory`` string: against the output format, the dimension and the number of vectors.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.reliability.errors import ConfigError, FlagError

# NOTE: measured on the 2-core machine at 4096 lists x 384 dims, adding through an HNSW32 quantizer
# was 2x slower than the flat one (BLAS); HNSW pays off where the wiki uses it, at 65536 lists and up.
HNSW_QUANTIZER_MIN_LISTS = 16384
HNSW_QUANTIZER_M = 32
ID_BYTES = 8  # every IVF entry stores its int64 id beside its code
MIN_TRAIN_POINTS_PER_CENTROID = 30  # FAISS warns below 39; the wiki's floor is 30


@dataclass(frozen=True)
class CodeKind:
    """What an output format lets the index hold: exact codes, IVF codes (best first), on-disk codes."""

    exact: str
    ivf: str  # the IVF codes: "ladder" (``code_ladder``), "ladder-from-SQfp16", or one factory ("{q}": quantizer)
    ondisk: str | None  # None: cannot live on disk
    flag: str  # the flag that picked it (for messages)


KINDS: dict[str, CodeKind] = {
    "float32": CodeKind("Flat", "ladder", "{q},SQ8", ""),
    "float16": CodeKind("SQfp16", "ladder-from-SQfp16", "{q},SQfp16", "--output-dtype float16"),
    "int8": CodeKind("SQ8", "{q},SQ8", "{q},SQ8", "--quantize int8"),
    "binary": CodeKind("BFlat", "B{q}", None, "--quantize binary"),
}


def ivf_ladder(codes: CodeKind, dim: int) -> list[str]:
    """The IVF codes to try for ``codes``, most precise first."""
    if codes.ivf == "ladder":
        return code_ladder(dim)
    if codes.ivf == "ladder-from-SQfp16":
        return code_ladder(dim)[1:]  # float16 vectors: Flat codes would only store them wider
    return [codes.ivf]


def index_kind(quantize: str, output_dtype: str) -> str:
    """The ``KINDS`` key of an output format."""
    return quantize if quantize != "none" else output_dtype


def is_binary(factory: str) -> bool:
    """FAISS's binary factories (``BFlat``, ``BIVF...``, ``BHNSW...``, ``BHash...``: Hamming distance over packed
    bits). Another string that starts with ``B`` (a typo) is judged as a float factory, and its error says so."""
    return re.match(r"B(Flat|IVF|HNSW|Hash)", factory) is not None


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


def train_rows(dim: int, settings: IndexSettings) -> int:
    """The most training vectors of ``dim`` float32 the memory budget holds: half of ``--index-memory``. NOTE: the
    other half is FAISS's working copy while it trains (an IVF's residuals of the sample, a k-means subsample): the
    sample was floored at 30 vectors a list and 64k for PQ whatever the budget (61,440 x 1024 dims, 240 MiB, under
    --index-memory 256M)."""
    return max(1, settings.memory_bytes // 2 // (4 * dim))


def affordable_lists(dim: int, settings: IndexSettings) -> int:
    """The most IVF lists (a power of two) whose training sample of 30 vectors a list fits ``train_rows``."""
    return 2 ** math.floor(math.log2(max(1, train_rows(dim, settings) // MIN_TRAIN_POINTS_PER_CENTROID)))


def make_index(factory: str, dim: int, metric: str) -> Any:
    """An empty FAISS index (binary for ``B`` factories); a string FAISS rejects is a ``FlagError`` naming it (one
    FAISS builds only for L2 distance, under ``--metric ip``, says to give ``--metric l2``)."""
    faiss = load_faiss()
    metric_type = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    try:
        if is_binary(factory):
            return faiss.index_binary_factory(dim, factory)
        return faiss.index_factory(dim, factory, metric_type)
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        # FAISS prefixes its C++ function and source line ("Error in ... at .../index_factory.cpp:1228: ")
        message = re.sub(r"^Error in .*? at \S+:\d+: (Error: )?", "", message) or message
        if metric == "ip" and not is_binary(factory) and _builds(faiss, dim, factory, faiss.METRIC_L2):
            raise FlagError(f"--index-factory {factory!r} is an L2-only FAISS index ({message}): give --metric l2, "
                            "or another factory for --metric ip") from exc
        raise FlagError(f"--index-factory {factory!r} is not a valid FAISS factory string for dim {dim}: "
                        f"{message}") from exc


def _builds(faiss: Any, dim: int, factory: str, metric_type: int) -> bool:
    try:
        faiss.index_factory(dim, factory, metric_type)
    except RuntimeError:
        return False
    return True


# where FAISS keeps an index's inner indexes: id maps and pre-transforms (``index``), refine wrappers
# (``base_index``, ``refine_index``), graph indexes (``storage``), IVF (``quantizer``)
INNER_INDEXES = ("index", "base_index", "refine_index", "storage", "quantizer")


def index_nodes(index: Any) -> list[Any]:
    """Every float index inside ``index``, itself first, each downcast to its FAISS class (each C++ index once)."""
    faiss = load_faiss()
    found: list[Any] = []
    seen: set[int] = set()
    pending = [index]
    while pending:
        node = faiss.downcast_index(pending.pop(0))
        if int(node.this) in seen:  # NOTE: another Python wrapper of the same C++ index: compare the pointers
            continue
        seen.add(int(node.this))
        found.append(node)
        pending.extend(inner for name in INNER_INDEXES if (inner := getattr(node, name, None)) is not None)
    return found


def _under_transforms(index: Any) -> Any:
    """``index`` without the pre-transforms (PCA, OPQ, ITQ...) around it, downcast."""
    faiss = load_faiss()
    node = faiss.downcast_index(index)
    while isinstance(node, faiss.IndexPreTransform):
        node = faiss.downcast_index(node.index)
    return node


def takes_ids(index: Any) -> bool:
    """True when vectors go into ``index`` with their FAISS ids (``add_with_ids``): an IVF or an id map (IDMap,
    IDMap2), bare or under pre-transforms. The others (Flat, HNSW, PQ, a refine wrapper...) number their vectors in
    the order they are added, and most refuse ids."""
    faiss = load_faiss()
    return isinstance(_under_transforms(index), (faiss.IndexIVF, faiss.IndexIDMap))


def lists_hold_everything(index: Any) -> bool:
    """True when the inverted lists of ``index`` hold all it stores per vector: an IVF bare or under pre-transforms.
    Only such an index can be filled in parts whose lists are merged afterwards (on disk, from a GPU): an id map or a
    refine wrapper (and IVFPQR's refinement codes) keep per-vector data beside the lists, which a merge of the lists
    would leave empty."""
    faiss = load_faiss()
    node = _under_transforms(index)
    return isinstance(node, faiss.IndexIVF) and not isinstance(node, faiss.IndexIVFPQR)


def estimate_bytes(index: Any, num_vectors: int) -> tuple[int, int]:
    """``(bytes per vector, fixed bytes)`` of ``index`` once it holds ``num_vectors`` vectors (through its wrappers:
    an id map adds its ids, a refine wrapper its refinement codes, a pre-transform its matrices)."""
    faiss = load_faiss()
    if isinstance(index, faiss.IndexBinary):
        if isinstance(index, faiss.IndexBinaryIVF):
            return int(index.code_size) + ID_BYTES, index.nlist * index.code_size
        return int(index.code_size), 0
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        fixed = 0
        for i in range(index.chain.size()):  # e.g. the OPQ rotation: d_in x d_out floats
            transform = index.chain.at(i)
            fixed += transform.d_in * transform.d_out * 4
        per_vector, inner_fixed = estimate_bytes(index.index, num_vectors)
        return per_vector, fixed + inner_fixed
    if isinstance(index, faiss.IndexIDMap):  # its ids (IDMap2: and the reverse map, a hash table entry each)
        per_vector, fixed = estimate_bytes(index.index, num_vectors)
        return per_vector + ID_BYTES * (4 if isinstance(index, faiss.IndexIDMap2) else 1), fixed
    if isinstance(index, faiss.IndexRefine):  # the base index's codes and the refinement codes
        base, base_fixed = estimate_bytes(index.base_index, num_vectors)
        refine, refine_fixed = estimate_bytes(index.refine_index, num_vectors)
        return base + refine, base_fixed + refine_fixed
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        quantizer = faiss.downcast_index(ivf.quantizer)
        per_centroid = ivf.d * 4 + (2 * 4 * quantizer.hnsw.nb_neighbors(1) if hasattr(quantizer, "hnsw") else 0)
        return int(ivf.code_size) + ID_BYTES, ivf.nlist * per_centroid
    if hasattr(index, "hnsw"):
        storage = faiss.downcast_index(index.storage)
        code = int(getattr(storage, "code_size", index.d * 4))
        return code + 2 * 4 * index.hnsw.nb_neighbors(1), 0
    if hasattr(index, "code_size"):
        return int(index.code_size), 0
    return index.d * 4, 0


def _nlist(index: Any) -> int:
    faiss = load_faiss()
    if isinstance(index, faiss.IndexBinary):
        return int(index.nlist) if isinstance(index, faiss.IndexBinaryIVF) else 0
    ivf = faiss.try_extract_index_ivf(index)
    return int(ivf.nlist) if ivf is not None else 0


def _plan(factory: str, storage: str, num_vectors: int, dim: int, metric: str, reason: str) -> IndexPlan:
    index = make_index(factory, dim, metric)
    per_vector, fixed = estimate_bytes(index, num_vectors)
    return IndexPlan(factory, storage, _nlist(index), per_vector, fixed + per_vector * num_vectors, reason)


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


def plan_index(num_vectors: int, dim: int, settings: IndexSettings, kind: str = "float32") -> IndexPlan:
    """The index for ``num_vectors`` vectors of ``dim`` in output format ``kind`` under ``settings``
    (factory, memory budget)."""
    budget = settings.memory_bytes
    if settings.factory != "auto":
        plan = _plan(settings.factory, "memory", num_vectors, dim, settings.metric, "asked for")
        if plan.estimated_bytes <= budget:
            return plan
        if plan.nlist and lists_hold_everything(make_index(settings.factory, dim, settings.metric)):
            return _plan(settings.factory, "ondisk", num_vectors, dim, settings.metric,
                         f"asked for; {_size(plan.estimated_bytes)} > --index-memory {_size(budget)}: "
                         "inverted lists on disk")
        why = (f"asked for; {_size(plan.estimated_bytes)} > --index-memory {_size(budget)}, but only IVF indexes "
               "(bare or under pre-transforms: no id map, no refine wrapper) can live on disk")
        return IndexPlan(**{**plan.as_dict(), "reason": why})
    codes = KINDS[kind]
    flat = _plan(codes.exact, "memory", num_vectors, dim, settings.metric, "")
    if num_vectors <= settings.flat_max_vectors and flat.estimated_bytes <= budget:
        return IndexPlan(**{**flat.as_dict(), "reason": f"exact: {num_vectors} vectors <= {settings.flat_max_vectors}"
                                                        f" and {_size(flat.estimated_bytes)} <= {_size(budget)}"})
    nlist = ivf_lists(max(num_vectors, 1))
    budget_lists = affordable_lists(dim, settings)
    # NOTE: 30 training vectors a list must fit half the budget (``train_rows``): fewer lists, never a thinner sample
    lowered = (f"; {budget_lists} lists, not {nlist}: 30 training vectors a list fit half of --index-memory "
               f"{_size(budget)}") if budget_lists < nlist else ""
    nlist = min(nlist, budget_lists)
    binary = is_binary(codes.exact)
    quantizer = f"IVF{nlist}" + (f"_HNSW{HNSW_QUANTIZER_M}" if nlist >= HNSW_QUANTIZER_MIN_LISTS and not binary else "")
    too_big: list[str] = []
    for ladder_codes in ivf_ladder(codes, dim):
        if "PQ" in ladder_codes and train_rows(dim, settings) < 256:
            continue  # NOTE: a PQ's 256 centroids per sub-quantizer need 256 training vectors: over half the budget
        plan = _plan(ladder_codes.format(q=quantizer), "memory", num_vectors, dim, settings.metric, "")
        if plan.estimated_bytes <= budget:
            why = f"{num_vectors} vectors > {settings.flat_max_vectors}" if num_vectors > settings.flat_max_vectors \
                else f"exact {codes.exact} needs {_size(flat.estimated_bytes)}"
            if too_big:
                why += "; " + ", ".join(too_big)
            return IndexPlan(**{**plan.as_dict(),
                                "reason": f"{why}; {_size(plan.estimated_bytes)} <= {_size(budget)}{lowered}"})
        too_big.append(f"{ladder_codes.split(',')[-1].format(q='IVF')} codes need {_size(plan.estimated_bytes)}")
    if codes.ondisk is None:
        why = (f"even {too_big[-1]} > --index-memory {_size(budget)}, but binary indexes cannot live on disk: built "
               f"in memory{lowered}")
        return IndexPlan(**{**plan.as_dict(), "reason": why})
    return _plan(codes.ondisk.format(q=quantizer), "ondisk", num_vectors, dim, settings.metric,
                 f"even {too_big[-1]} > --index-memory {_size(budget)}: "
                 f"{codes.ondisk.split(',')[-1]} inverted lists on disk{lowered}")


PQ_RE = re.compile(r"(?:^|,|_)O?PQ(\d+)")
# a number of zeros right after a letter: IVF0, HNSW0, NSG0, PQ8x0, BIVF0 (no valid factory has one)
ZERO_RE = re.compile(r"[A-Za-z]+0+(?![0-9])")
IVF_RE = re.compile(r"IVF(\d+)")
IMI_RE = re.compile(r"IMI(\d+)x(\d+)")  # a multi-index quantizer: 2 ** (M * nbits) lists


def factory_lists(factory: str) -> int:
    """The most inverted lists ``factory`` names (``IVF65536``, ``IMI2x10``: 2 ** 20), 0 for none; read from the text,
    so a count too large to build is told before FAISS allocates its list table (16 GB for ``IVF100000000``)."""
    return max([int(m.group(1)) for m in IVF_RE.finditer(factory)]
               + [1 << min(int(m.group(1)) * int(m.group(2)), 64) for m in IMI_RE.finditer(factory)], default=0)


def vectors_to_train(index: Any, factory: str) -> tuple[int, str]:
    """``(vectors, why)``: the fewest vectors FAISS can train ``index`` on (1 and "" for none), at any depth of it
    (under id maps, pre-transforms, refine wrappers, graph indexes): one per IVF list, ``2**nbits`` per product or
    residual quantizer and per OPQ rotation's (k-means needs at least as many points as centroids), ``d_out`` per
    PCA and per OPQ rotation, one per dimension a residual quantizer quantizes; an NSG graph is built over more than
    100 vectors."""
    faiss = load_faiss()
    needs = [(1, "")]
    if isinstance(index, faiss.IndexBinary):
        needs.extend((int(m.group(1)), f"{m.group(1)} IVF lists") for m in IVF_RE.finditer(factory))
        return max(needs)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        needs.append((int(ivf.nlist), f"{ivf.nlist} IVF lists"))
    nodes = index_nodes(index)
    if ivf is None and any(isinstance(node, faiss.IndexNSG) for node in nodes):
        needs.append((NSG_MIN_NODES, f"NSG graphs of at least {NSG_MIN_NODES} nodes"))
    for node in nodes:
        for name in ("pq", "refine_pq"):
            if (pq := getattr(node, name, None)) is not None:
                needs.append((int(pq.ksub), f"{pq.ksub} centroids per PQ sub-quantizer ({pq.nbits} bits)"))
        for name in ("rq", "prq"):
            if (aq := getattr(node, name, None)) is not None and aq.nbits.size():
                bits = int(max(faiss.vector_to_array(aq.nbits)))
                needs.append((1 << bits, f"{1 << bits} centroids per residual quantizer step ({bits} bits)"))
                needs.extend(progressive_dims(faiss, aq))
        if isinstance(node, faiss.IndexPreTransform):
            for i in range(node.chain.size()):
                transform = faiss.downcast_VectorTransform(node.chain.at(i))
                if isinstance(transform, faiss.OPQMatrix):
                    needs.append((256, "256 centroids per sub-quantizer of the OPQ rotation's training"))
                    # NOTE: and one vector per output dimension: FAISS's OPQ training over fewer (OPQ8 at d 384 on
                    # 342 vectors) aborted the process (a C++ exception thrown while one unwinds: exit 134, or 139)
                    needs.append((int(transform.d_out), f"an OPQ rotation to {transform.d_out} dimensions"))
                elif isinstance(transform, faiss.PCAMatrix):
                    needs.append((int(transform.d_out), f"a PCA to {transform.d_out} dimensions"))
    return max(needs)


def progressive_dims(faiss: Any, aq: Any) -> list[tuple[int, str]]:
    """What a residual quantizer's progressive-dimension training needs (FAISS's default ``train_type``): one
    vector per dimension it quantizes, for each residual quantizer of ``aq`` (itself, or a product one's parts)."""
    parts = [faiss.downcast_AdditiveQuantizer(aq.subquantizer(i)) for i in range(aq.nsplits)] \
        if isinstance(aq, faiss.ProductAdditiveQuantizer) else [aq]
    # NOTE: FAISS trains each step on a PCA of the residuals to the quantizer's full dimension: over fewer vectors
    # than that it fails inside the build, after every vector is embedded ("PCA matrix cannot output 384
    # dimensions from 384"), naming a PCA the factory never asked for
    return [(int(part.d), f"the {part.d} dimensions a residual quantizer trains over")
            for part in parts if isinstance(part, faiss.ResidualQuantizer)
            and part.train_type & faiss.ResidualQuantizer.Train_progressive_dim]


NSG_MIN_NODES = 101  # NOTE: FAISS's NNDescent builds no graph of 100 nodes or fewer ('n > NUM_EVAL_POINTS')


def unusable(index: Any, metric: str) -> str | None:
    """Why petal cannot build, publish or search ``index`` (a fresh one from ``make_index``), or ``None``. Judged
    before any work: FAISS itself would only fail once the vectors are embedded and trained (78), or publish an index
    its own manifest contradicts."""
    faiss = load_faiss()
    if isinstance(index, faiss.IndexBinary):
        return None
    for node in index_nodes(index):
        if isinstance(node, faiss.IndexRowwiseMinMaxBase):
            return ("MinMax/MinMaxFP16 indexes only encode and decode (FAISS implements no add or search for them); "
                    "pick another factory")
        if isinstance(node, faiss.IndexLattice):
            return ("ZnLattice indexes are not supported (FAISS writes no standard header for them); pick another "
                    "factory")
        if isinstance(node, faiss.IndexPreTransform):
            for i in range(node.chain.size()):
                transform = faiss.downcast_VectorTransform(node.chain.at(i))
                if isinstance(transform, faiss.PCAMatrix) and transform.d_out > transform.d_in:
                    return (f"a PCA cannot output more dimensions ({transform.d_out}) than it is given "
                            f"({transform.d_in}); ask for at most {transform.d_in}")
    wanted = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    if index.metric_type != wanted:  # NOTE: HNSW/NSG over PQ, IVF spectral hash, HNSW 2-level: FAISS makes them L2
        return (f"FAISS builds this index for L2 distance whatever the metric asked (--metric {metric}): give "
                "--metric l2, or another factory")
    if any(isinstance(node, faiss.Index2Layer) for node in searched_nodes(index)):  # NOTE: as an HNSW's storage it is
        return "Residual... indexes (FAISS's Index2Layer) cannot be searched; pick another factory"  # not searched
    ivf = faiss.try_extract_index_ivf(index)
    trains_alone = getattr(ivf, "quantizer_trains_alone", 0)  # NOTE: a C char: SWIG gives a 1-character str
    if ivf is not None and (ord(trains_alone) if isinstance(trains_alone, str) else trains_alone) == 2:
        # NOTE: FAISS trains such a coarse quantizer (NSG, PQ, SQ: not flat) on the k-means centroids of the lists
        needed, why = vectors_to_train(ivf.quantizer, "")
        if needed > ivf.nlist:
            return (f"its coarse quantizer is built from the {ivf.nlist} list centroids, and {why} need at least "
                    f"{needed}: ask for at least {needed} lists, or a flat or HNSW quantizer (IVFn, IVFn_HNSW32)")
    return None


def searched_nodes(index: Any) -> list[Any]:
    """``index`` and the indexes its search goes through to find candidates, downcast: through id maps and
    pre-transforms (``index``) and refine wrappers (``base_index``), not a refine wrapper's own codes, an IVF's
    quantizer nor a graph's storage."""
    faiss = load_faiss()
    nodes = [faiss.downcast_index(index)]
    for _ in range(16):  # wrappers nest a few deep at most
        inner = getattr(nodes[-1], "index", None)
        inner = getattr(nodes[-1], "base_index", None) if inner is None else inner
        if inner is None:
            break
        nodes.append(faiss.downcast_index(inner))
    return nodes


class TrainingMemoryError(FlagError):
    """An ``--index-factory`` whose training set is over half of ``--index-memory``: the budget's fault as much as the
    factory's, so a usage error (2) whichever of the two flags was given (``jobs/settings.check_kept_factory``)."""


UPPER_BOUND = "the rows read and the kept shards'"  # what a run's check before any work counts
LIVE_VECTORS = "its rows, less those skipped, deleted by --delete or superseded by the same id in a later shard"


def check_index_factory(settings: IndexSettings, kind: str = "float32", dim: int | None = None,
                        num_vectors: int | None = None, counted: str = UPPER_BOUND, *,
                        kept_output: bool = False) -> None:
    """The one check of ``--index-factory`` (``FlagError``, exit 2, with the numbers), before any work
    and again before a build: only float32 output takes an explicit factory (the other formats pick
    their codes); with ``dim``, FAISS must build it and PQ sub-quantizers must divide the dimension;
    with ``num_vectors`` (an upper bound is enough: the rows read plus the kept shards' vectors), there
    must be enough vectors to train it (IVF lists, PQ centroids). ``counted``: what ``num_vectors`` counts, as
    the message says it (``LIVE_VECTORS``: the build's exact count). ``kept_output``: ``kind`` is the live version's
    output, kept by ``petal rebuild`` (which has no ``--quantize`` or ``--output-dtype``), as the message says."""
    factory = settings.factory
    if factory == "auto":
        return
    if kind != "float32":
        # NOTE: petal rebuild said "conflicts with --quantize int8", a flag it does not take and the user never gave
        picked = f"the live version's output ({KINDS[kind].flag}; a rebuild keeps it)" if kept_output \
            else KINDS[kind].flag
        raise FlagError(f"--index-factory {factory!r} conflicts with {picked}, which picks the index type "
                        "(SQ8, SQfp16 or a binary index); leave --index-factory auto")
    if dim is None:
        return
    zero = ZERO_RE.search(factory)
    if zero is not None:  # NOTE: FAISS builds them, then fails, hangs (NSG0) or asserts only when trained or searched
        raise FlagError(f"--index-factory {factory!r}: {zero.group(0)} asks for zero (lists, neighbours, codes or "
                        "bits); give a positive number")
    lists = factory_lists(factory)
    if num_vectors is not None and lists > num_vectors:  # NOTE: before FAISS builds it (memory in proportion)
        raise FlagError(f"--index-factory {factory!r} needs at least {lists} vectors of dim {dim} to train: {lists} "
                        f"IVF lists need at least {lists} vectors; this run can index at most {num_vectors} vectors "
                        f"({counted}): pick a smaller factory or leave --index-factory auto")
    try:
        index = make_index(factory, dim, settings.metric)
    except FlagError:
        # NOTE: said in petal's words only where FAISS failed: after a PCA or OPQ rotation (PCA384,PQ96 of 1024
        # dims) the PQ splits the transform's output, not the input dimension
        for match in PQ_RE.finditer(factory):
            m = int(match.group(1))
            if m < 1 or dim % m:
                raise FlagError(f"--index-factory {factory!r}: PQ{m} splits vectors into {m} sub-quantizers, "
                                f"which must divide the dimension {dim}") from None
        raise
    problem = unusable(index, settings.metric)
    if problem is not None:
        raise FlagError(f"--index-factory {factory!r}: {problem}")
    needed, why = vectors_to_train(index, factory)
    if num_vectors is not None and num_vectors < needed:
        raise FlagError(f"--index-factory {factory!r} needs at least {needed} vectors of dim {dim} to train: {why} "
                        f"need at least {needed} vectors; this run can index at most {num_vectors} vectors "
                        f"({counted}): pick a smaller factory or leave --index-factory auto")
    if needed > train_rows(dim, settings):
        sample_bytes = needed * dim * 4
        raise TrainingMemoryError(f"--index-factory {factory!r} cannot be trained within --index-memory "
                        f"{_size(settings.memory_bytes)}: {why} need at least {needed} training vectors of dim {dim}, "
                        f"{_size(sample_bytes)}, and the training sample may take half of --index-memory (FAISS "
                        f"works on a copy of it): give --index-memory {-(-2 * sample_bytes // (1 << 20))}M or more, "
                        "a smaller factory, or --index-factory auto")


def faiss_failure(exc: BaseException, factory: str, dim: int, num_vectors: int | None) -> ConfigError:
    """A FAISS error (``RuntimeError``) or a factory that cannot be trained (``ValueError``) during a
    build, as a configuration error (78): the embeddings stay in the store, a rerun embeds nothing again."""
    count = f"{num_vectors} vectors" if num_vectors is not None else "the stored vectors"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigError(f"FAISS cannot build index {factory!r} from {count} of dim {dim}: {first}. Nothing was "
                       "published; the embeddings are kept in the store: rerun with another --index-factory "
                       "(or petal rebuild OUT --index-factory ...) to index them without embedding again")


def _size(num_bytes: int) -> str:
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f}{unit}"
    return f"{num_bytes}B"
