"""Building the FAISS index of a version from the embedding store, into a staging directory.

plan (``plan.py``: by size, memory budget and output format) -> train on a seeded sample (``gpu.py``)
-> add shard by shard (``build.py``: in memory, or parts merged on disk; ``binary.py``: sign bits +
rescoring vectors) -> tune search parameters on held-out vectors (``tune.py``) -> write
``index.faiss`` (+ ``index.ivfdata``, ``rescore.npy``) and ``ids.parquet`` -> sha256 of every file.

| output | exact | IVF (codes that fit --index-memory) | on disk |
|---|---|---|---|
| float32 | Flat | Flat, SQfp16, SQ8, PQ | SQ8 |
| float16 | SQfp16 | SQfp16, SQ8, PQ | SQfp16 |
| int8 | SQ8 (ranges = the calibration) | SQ8 | SQ8 |
| binary | BFlat (Hamming) | BIVF | no (in memory) |
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.background_checksums import BackgroundChecksums
from petal.pipeline.index.binary import DEFAULT_RESCORE, RESCORE_FILE, BinaryIndex
from petal.pipeline.index.build import add_in_memory, build_on_disk
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.files import IDS_FILE, INDEX_FILE, write_index
from petal.pipeline.index.gpu import num_gpus, train
from petal.pipeline.index.graph_holdout import queries_unlinked
from petal.pipeline.index.graph_repair import link_unreachable
from petal.pipeline.index.kmeans_floor import floored_kmeans, thin_warning
from petal.pipeline.index.plan import (
    LIVE_VECTORS,
    MIN_TRAIN_POINTS_PER_CENTROID,
    IndexPlan,
    check_index_factory,
    faiss_failure,
    index_kind,
    index_nodes,
    is_binary,
    make_index,
    plan_index,
    train_rows,
    vectors_to_train,
)
from petal.pipeline.index.source import StoreVectors, split_sample
from petal.pipeline.index.tune import (
    SINGLE_QUERY_SAMPLES,
    TRUTH_EXTRA,
    TUNE_K,
    RecallAtK,
    Tuning,
    exact_neighbours,
    exact_tuning,
    is_exact,
    tune,
    walks_a_graph,
    without_ids,
)
from petal.pipeline.manifest import DeviceRecord, IndexRecord, PlanRecord, TuningRecord
from petal.pipeline.reliability.errors import FAISS_WRITE_ERRORS, FlagError, PetalError
from petal.pipeline.reliability.notes import say
from petal.pipeline.store.embeddings import StoreEntry
from petal.pipeline.store.outputs import OutputTransform

MAX_CHUNK_ROWS = 65536
MIN_CHUNK_ROWS = 1024
PQ_TRAIN_POINTS = 65536  # 256 centroids per sub-quantizer x 256 points (FAISS's own cap)


def auto_factory(num_vectors: int, dim: int, settings: IndexSettings, kind: str = "float32") -> str:
    """The factory string ``--index-factory auto`` picks (see ``pipeline/index/plan.py``)."""
    return plan_index(num_vectors, dim, settings, kind).factory


@dataclass
class BuildResult:
    factory: str
    metric: str
    num_vectors: int
    superseded: int  # vectors dropped because a later shard has the same document id
    plan: IndexPlan | None = None
    tuning: Tuning | None = None
    device: DeviceRecord | None = None  # where training and adding ran
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    pending: BackgroundChecksums | None = None  # checksums still running (``build_index(..., wait=False)``)
    timings_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    output: OutputTransform | None = None  # the stored vectors' transform, with any learned int8 calibration

    @property
    def storage(self) -> str:
        return self.plan.storage if self.plan is not None else "memory"

    @property
    def search_params(self) -> dict[str, int]:
        return dict(self.tuning.params) if self.tuning is not None else {}

    def join_checksums(self) -> None:
        """Wait for the background checksums (``build_index(..., wait=False)``) into ``files``; the wait is
        added to ``timings_s["checksum"]``."""
        if self.pending is None:
            return
        t0 = time.perf_counter()
        pending, self.pending = self.pending, None
        self.files.update(pending.result())
        self.timings_s["checksum"] = round(self.timings_s.get("checksum", 0.0) + time.perf_counter() - t0, 3)

    def record(self, settings: IndexSettings) -> IndexRecord:
        """The manifest's ``index`` section."""
        return IndexRecord(requested_factory=settings.factory, settings=settings, factory=self.factory,
                           metric=self.metric, storage=self.storage, num_vectors=self.num_vectors,
                           superseded=self.superseded, search_params=self.search_params, files=dict(self.files),
                           plan=PlanRecord.of(self.plan) if self.plan is not None else None,
                           tuning=TuningRecord.of(self.tuning) if self.tuning is not None else None,
                           device=self.device, timings_s=dict(self.timings_s), build_seconds=round(self.seconds, 3))

    def recall_warning(self) -> str | None:
        """What a run says on stderr when the tuning could not reach the recall target (the index's codes cap
        it, at its best search setting), else ``None``: the manifest and the report record it too, but a job that
        reads neither would serve an index that finds few of the true neighbours without a word."""
        tuning = self.tuning
        if tuning is None or tuning.reached or self.num_vectors == 0:
            return None
        # NOTE: a binary index takes no refine step (a binary factory with ,RFlat is refused): its sign bits cap it,
        # and petal query re-ranks more of their candidates with the float vectors at a larger --rescore
        remedy = ("query with a larger --rescore (default 10), or index without --quantize binary and a binary "
                  "--index-factory" if is_binary(self.factory) else
                  "give finer codes or a refine step (--index-factory ...,RFlat)")
        # NOTE: a mean of 0.9497 printed '0.95 ... below --target-recall 0.95'; the target holds against the mean
        # less two standard errors, so a mean above it is not reaching it
        return (f"warning: the {self.factory!r} index reaches recall@10 {TuningRecord.of(tuning).recall_text()} at "
                f"its best search setting, below --target-recall {tuning.target_recall_at_10:g}; for more recall "
                f"{remedy}, or a lower --target-recall")

    def report(self, settings: IndexSettings) -> dict[str, Any]:
        """What ``petal index``/``rebuild`` report about the index (the run report's ``index``): with the ``settings``
        it was built with (those given, the live version's kept for the others), as its manifest records them."""
        return {"factory": self.factory, "requested_factory": settings.factory, "settings": settings.as_dict(),
                "metric": self.metric, "num_vectors": self.num_vectors,
                "superseded": self.superseded, "search_params": self.search_params,
                "tuning": self.tuning.as_dict() if self.tuning is not None else {}, "storage": self.storage,
                "device": asdict(self.device) if self.device is not None else {}, "timings_s": dict(self.timings_s)}


def chunk_rows(dim: int, settings: IndexSettings) -> int:
    """Vectors read from the store per add call: 1/16 of the memory budget, 1024..65536 rows."""
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, settings.memory_bytes // 16 // (4 * dim)))


def part_rows(plan: IndexPlan, settings: IndexSettings) -> int:
    """Vectors per part (on disk, or on the GPU): a quarter of the memory budget of codes."""
    return max(MIN_CHUNK_ROWS, settings.memory_bytes // 4 // max(1, plan.bytes_per_vector))


def training_size(plan: IndexPlan, dim: int, settings: IndexSettings, needed: int = 1) -> int:
    """Points to train on: ``train_points_per_centroid`` per IVF list (PQ codes want 64k), never more than half the
    memory budget holds (``plan.train_rows``), nor fewer than the ``needed`` the factory's parts need to train at all
    (``plan.vectors_to_train``; ``check_index_factory`` refused a factory whose ``needed`` is over the budget's half).
    NOTE: the floors of 30 a list and 64k for PQ were taken over the budget: ``--index-factory auto`` picks fewer
    lists instead (``plan.affordable_lists``), and an explicit factory trains on what the budget holds (a thin
    k-means is said as a warning)."""
    wanted = settings.train_points_per_centroid * max(plan.nlist, 1)
    if "PQ" in plan.factory or plan.nlist == 0:
        wanted = max(wanted, PQ_TRAIN_POINTS)
    affordable = train_rows(dim, settings)
    assert needed <= affordable, f"{needed} training vectors of dim {dim} are over half of {settings.memory_bytes} B"
    return max(min(wanted, affordable), needed)


def _train(index: Any, sample: np.ndarray, plan: IndexPlan, seed: int, ngpu: int) -> str:
    """Train ``index`` on ``sample [n, dim]`` (seeded; sign bits for a binary index); returns where it ran. A sample
    too thin for the factory's k-means (fewer than 30 vectors a centroid: a small store) is said as a warning."""
    faiss = load_faiss()
    if len(sample) < max(plan.nlist, 1):
        raise ValueError(f"index {plan.factory!r} needs at least {plan.nlist} vectors to train, "
                         f"the store has {len(sample)}")
    binary = isinstance(index, faiss.IndexBinary)
    if binary and isinstance(index, faiss.IndexBinaryIVF):
        index.cp.seed = seed  # NOTE: seeded k-means on a seeded sample: same input, same index
    ivf = None if binary else faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.cp.seed = seed  # NOTE: seeded k-means on a seeded sample: same input, same index
    if not binary:
        no_polysemous_training(index)
    # NOTE: FAISS's k-means prints "WARNING clustering 342 points to 16 centroids" with fprintf(stderr) below 39
    # points a centroid (quiet=True, cron logs): every k-means of the index asks for no more than the sample gives
    # (kmeans_floor.py), and petal says the thin ones itself (to the petal logger under quiet=True)
    with floored_kmeans(index, len(sample), MIN_TRAIN_POINTS_PER_CENTROID) as thin:
        where = train(index, np.packbits(sample >= 0, axis=1) if binary else sample, ngpu, seed)
    if thin:
        say(thin_warning(plan.factory, thin, MIN_TRAIN_POINTS_PER_CENTROID))
    return where


def no_polysemous_training(index: Any) -> None:
    """Switch off the polysemous training of every PQ in ``index``: the top level or at any depth (under an IVF, an
    id map, a pre-transform (OPQ), a refine wrapper, or as an HNSW or NSG graph's storage: ``plan.index_nodes``).

    NOTE: on by default for IVF-PQ and a plain ``PQ8`` (``IndexPQ``): annealing per sub-quantizer that took 12 s
    for 2,000 vectors of 32 dims, minutes at scale, and only polysemous search (the ``ht`` parameter, never set
    here) uses it.
    """
    for node in index_nodes(index):
        if getattr(node, "do_polysemous_training", False):
            node.do_polysemous_training = False


def output_codes(index: Any, plan: IndexPlan, output: OutputTransform | None) -> bool:
    """True when the index holds the output format's own codes (SQfp16 of float16 vectors, SQ8 of
    int8): they then code the vectors themselves, not IVF residuals, so SQ8's learned ranges are
    the int8 calibration."""
    faiss = load_faiss()
    if output is None or output.quantize == "binary" or isinstance(index, faiss.IndexBinary):
        return False
    own = "SQ8" if output.quantize == "int8" else "SQfp16" if output.output_dtype == "float16" else None
    if own is None or not plan.factory.endswith(own):
        return False
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.by_residual = False
    return True


def _add_binary(index: Any, source: StoreVectors, staging: Path, rows: int) -> str:
    """Sign bits into ``index``; the float vectors as float16 into ``rescore.npy`` (FAISS id order)."""
    # NOTE: memory-mapped at query time: rescoring reads only the candidates' rows.
    rescore = np.lib.format.open_memmap(staging / RESCORE_FILE, mode="w+", dtype=np.float16,
                                        shape=(source.total, source.dim))
    for ids, vectors in source.chunks(rows):
        index.add(np.packbits(vectors >= 0, axis=1))
        rescore[ids[0] : ids[-1] + 1] = vectors
    rescore.flush()
    del rescore
    return "cpu"


def build_index(entries: list[StoreEntry], dim: int, settings: IndexSettings, staging: Path,
                output: OutputTransform | None = None, wait: bool = True,
                shard_paths: dict[str, str] | None = None, source: StoreVectors | None = None) -> BuildResult:
    """Write the index of ``entries`` (store entries in shard order; vectors ``[rows, dim]``) into
    ``staging``: ``index.faiss`` (+ ``index.ivfdata`` on disk, + ``rescore.npy`` for binary) and
    ``ids.parquet``. Every output format goes through the same planner, training, adding and tuner;
    ``output`` (the stored vectors' transform) picks the codes, and ``result.output`` is it with the
    int8 calibration the index learned. ``shard_paths``: each shard's path as the version's manifest records it (by
    absolute path), written in ``ids.parquet``'s ``shard``.

    Every file is hashed (and fsynced) in the background once written; ``wait=False`` returns with
    ``result.pending`` still running, for the caller to ``join_checksums()`` after writing the rest.

    ``source``: the ``StoreVectors`` of ``entries`` when the caller has made them (``petal rebuild`` checks the
    factory against their count first); else made here.

    Raises ``ValueError`` for a factory string FAISS rejects or too few vectors to train it.
    """
    checksums = BackgroundChecksums()
    try:
        result = _build_index(entries, dim, settings, staging, output, checksums, shard_paths, source)
    except BaseException:
        checksums.cancel()
        raise
    result.pending = checksums
    if wait:
        result.join_checksums()
    return result


def _build_index(entries: list[StoreEntry], dim: int, settings: IndexSettings, staging: Path,
                 output: OutputTransform | None, checksums: BackgroundChecksums,
                 shard_paths: dict[str, str] | None = None, source: StoreVectors | None = None) -> BuildResult:
    faiss = load_faiss()
    started = time.perf_counter()
    timings: dict[str, float] = {}
    if source is None:
        source = StoreVectors(entries, dim, shard_paths)
    kind = index_kind(output.quantize, output.output_dtype) if output is not None else "float32"
    # NOTE: no vectors (every document deleted, every shard dropped): an empty index of the factory asked, as
    # trained as FAISS makes it without data; nothing to train, calibrate or tune, and searches answer no hits
    empty = source.total == 0
    check_index_factory(settings, kind, dim, None if empty else source.total, LIVE_VECTORS)
    plan = plan_index(source.total, dim, settings, kind)
    index = make_index(plan.factory, dim, settings.metric)
    binary = isinstance(index, faiss.IndexBinary)
    calibrates = output_codes(index, plan, output) and output is not None and output.quantize == "int8" \
        and not empty
    ngpu = num_gpus()
    rows = chunk_rows(dim, settings)
    # NOTE: at least what every part of the factory needs (a residual quantizer one vector per dimension, after
    # 64 points for each of 4 IVF lists gave it 256 of 384 vectors): the check before the work counted on it
    num_train = 0 if index.is_trained or empty else \
        training_size(plan, dim, settings, vectors_to_train(index, plan.factory)[0])
    num_queries = settings.tune_queries if source.total > 1 else 0
    query_ids, train_ids = split_sample(source.total, num_queries, num_train, settings.seed)
    trained_on, train_points = None, None

    if not index.is_trained and not empty:
        t0 = time.perf_counter()
        trained_on, train_points = _train(index, source.take(train_ids), plan, settings.seed, ngpu), len(train_ids)
        timings["train"] = round(time.perf_counter() - t0, 3)
    if calibrates:
        assert output is not None
        ivf = faiss.try_extract_index_ivf(index)
        trained = faiss.vector_to_array(faiss.downcast_index(ivf if ivf is not None else index).sq.trained)
        output = output.with_calibration(trained[:dim], trained[dim:])

    t0 = time.perf_counter()
    if binary:
        added_on = _add_binary(index, source, staging, rows)
    elif plan.storage == "ondisk":
        index, added_on = build_on_disk(index, source, staging, part_rows(plan, settings), rows, ngpu > 0)
    else:
        # NOTE: lists grown by doubling hold up to twice their codes: sized first only where that could pass the
        # budget (the sizing pass assigns every vector once more: the add took 5.9 s, not 3.1 s, at 100k x 1024)
        reserve = 2 * plan.estimated_bytes > settings.memory_bytes
        added_on = add_in_memory(index, source, part_rows(plan, settings), rows, ngpu > 0, reserve)
    # NOTE: before tuning: the graph tuned is the graph written; a node it leaves unreached fails the build (a bug,
    # exit 1) rather than publish documents no search returns
    link_unreachable(index)
    timings["add"] = round(time.perf_counter() - t0, 3)
    device = DeviceRecord(gpus=ngpu, train=trained_on, add=added_on, train_points=train_points)

    searched = BinaryIndex(index, np.load(staging / RESCORE_FILE, mmap_mode="r", allow_pickle=False), settings.metric,
                           DEFAULT_RESCORE) if binary else index
    tuning = None
    if len(query_ids):
        t0 = time.perf_counter()
        queries = source.take(query_ids)
        if is_exact(searched):  # NOTE: exhaustive search: no ground truth to compute, nothing to tune
            tuning = exact_tuning(searched, queries[:SINGLE_QUERY_SAMPLES], settings.target_recall)
        else:
            graph = walks_a_graph(searched)
            # NOTE: the queries' nodes are unlinked while a graph is tuned (graph_holdout.py), so no hit can be
            # another query: the truth is the nearest of the other vectors
            truth = exact_neighbours(queries, source, TUNE_K + 1 + TRUTH_EXTRA, settings.metric, rows)
            if graph:
                truth = without_ids(truth, query_ids, truth.shape[1])
            recall = RecallAtK(queries, query_ids, truth, TUNE_K, source.take, settings.metric)
            with queries_unlinked(searched, query_ids):
                tuning = tune(searched, queries, recall, settings.target_recall)
        timings["tune"] = round(time.perf_counter() - t0, 3)
    del searched

    t0 = time.perf_counter()
    if binary:
        faiss.write_index_binary(index, str(staging / INDEX_FILE))
    elif plan.storage == "memory":
        write_index(index, staging / INDEX_FILE)
    num_vectors = int(index.ntotal)
    del index  # NOTE: an on-disk index maps index.ivfdata read-write until released
    for done in sorted(staging.iterdir()):  # index.faiss (+ index.ivfdata, rescore.npy): hashed while ids are written
        if done.is_file():
            checksums.add(done)
    source.write_ids(staging / IDS_FILE)
    checksums.add(staging / IDS_FILE)
    timings["write"] = round(time.perf_counter() - t0, 3)
    assert num_vectors == source.total, f"index holds {num_vectors} vectors, the store selection {source.total}"
    result = BuildResult(factory=plan.factory, metric=settings.metric, num_vectors=num_vectors,
                         superseded=source.superseded, plan=plan, tuning=tuning, device=device, timings_s=timings,
                         output=output)
    for late in sorted(staging.iterdir()):  # every file of the version is hashed, whoever wrote it
        if late.is_file() and late.name not in checksums.names():
            checksums.add(late)
    result.seconds = time.perf_counter() - started
    return result


def version_vectors(entries: list[StoreEntry], dim: int, settings: IndexSettings,
                    shard_paths: dict[str, str] | None = None) -> StoreVectors:
    """The ``StoreVectors`` ``build_version_index`` would make of ``entries``, for a caller that checks the factory
    against their count (``total``) first; an error reading them is the one ``build_version_index`` raises."""
    try:
        return StoreVectors(entries, dim, shard_paths)
    except (RuntimeError, ValueError) as exc:
        failure = _version_failure(exc, settings, dim, None)
        if failure is None:
            raise
        raise failure from exc


def build_version_index(entries: list[StoreEntry], dim: int, settings: IndexSettings, staging: Path,
                        output: OutputTransform | None = None, wait: bool = True,
                        shard_paths: dict[str, str] | None = None, source: StoreVectors | None = None) -> BuildResult:
    """``build_index`` for a version being published (``petal index``, ``--vectors-column``, ``petal
    rebuild``): a FAISS error or a factory the stored vectors cannot train is a ``ConfigError`` (78)
    naming the factory and the vectors it was built from (the embeddings stay in the store); write errors go
    on to ``writing()`` (74). The caller removes ``staging`` when this raises. NOTE: the count was the rows embedded,
    rows ``--delete`` removed and those a later shard's same id supersedes included: 'FAISS cannot build index 'PQ8'
    from 300 vectors' while the check it wrapped said 'at most 250'."""
    try:
        if source is None:
            source = StoreVectors(entries, dim, shard_paths)
        return build_index(entries, dim, settings, staging, output, wait, shard_paths, source)
    except (RuntimeError, ValueError) as exc:
        failure = _version_failure(exc, settings, dim, source)
        if failure is None:
            raise
        raise failure from exc


def _version_failure(exc: RuntimeError | ValueError, settings: IndexSettings, dim: int,
                     source: StoreVectors | None) -> PetalError | None:
    """What ``build_version_index`` raises for ``exc`` (``None``: ``exc`` itself): a ``PetalError`` or a write error
    as it is; anything else the contract's FAISS failure (78, embeddings kept), with the count of the vectors it was
    built from (``source``; ``None``: not counted yet)."""
    # NOTE: a FlagError here is the factory check run again at build time, against the stored vectors:
    # after embedding it is the contract's FAISS failure (78, embeddings kept), not a usage error
    if (isinstance(exc, PetalError) and not isinstance(exc, FlagError)) \
            or any(m in str(exc) for m in FAISS_WRITE_ERRORS):
        return None
    return faiss_failure(exc, settings.factory, dim, source.total if source is not None else None)
