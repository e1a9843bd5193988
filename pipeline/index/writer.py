"""Building the FAISS index of a version from the embedding store, into a staging directory.

plan (``index_factory``) -> train on a seeded sample -> add shard by shard (``index_build``: in
memory, or parts merged on disk) -> tune search parameters on held-out vectors (``index_tuning``)
-> write ``index.faiss`` (+ ``index.ivfdata``) and ``ids.parquet`` -> sha256 of every file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.build import add_in_memory, build_on_disk
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.files import IDS_FILE, INDEX_FILE, write_index
from petal.pipeline.index.gpu import num_gpus, train
from petal.pipeline.index.plan import IndexPlan, make_index, plan_index
from petal.pipeline.index.source import StoreVectors, split_sample
from petal.pipeline.index.tune import SINGLE_QUERY_SAMPLES, TUNE_K, exact_neighbours, exact_tuning, is_exact, tune
from petal.pipeline.store.embeddings import StoreEntry, sha256_file

MAX_CHUNK_ROWS = 65536
MIN_CHUNK_ROWS = 1024
MIN_TRAIN_POINTS_PER_CENTROID = 30  # FAISS warns below 39; the wiki's floor is 30
PQ_TRAIN_POINTS = 65536  # 256 centroids per sub-quantizer x 256 points (FAISS's own cap)


def auto_factory(num_vectors: int, dim: int, settings: IndexSettings) -> str:
    """The factory string ``--index-factory auto`` picks (see ``pipeline/index/plan.py``)."""
    return plan_index(num_vectors, dim, settings).factory


@dataclass
class BuildResult:
    factory: str
    metric: str
    num_vectors: int
    superseded: int  # vectors dropped because a later shard has the same document id
    plan: dict[str, Any] = field(default_factory=dict)
    search_params: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)  # where training and adding ran
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    timings_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def manifest(self, settings: IndexSettings) -> dict[str, Any]:
        """The manifest's ``index`` section."""
        return {
            "requested_factory": settings.factory,
            "settings": settings.as_dict(),
            "factory": self.factory,
            "metric": self.metric,
            "storage": self.plan.get("storage", "memory"),
            "num_vectors": self.num_vectors,
            "superseded": self.superseded,
            "plan": self.plan,
            "search_params": self.search_params,
            "tuning": self.tuning,
            "device": self.device,
            "files": self.files,
            "timings_s": self.timings_s,
            "build_seconds": round(self.seconds, 3),
        }


def chunk_rows(dim: int, settings: IndexSettings) -> int:
    """Vectors read from the store per add call: 1/16 of the memory budget, 1024..65536 rows."""
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, settings.memory_bytes // 16 // (4 * dim)))


def part_rows(plan: IndexPlan, settings: IndexSettings) -> int:
    """Vectors per part (on disk, or on the GPU): a quarter of the memory budget of codes."""
    return max(MIN_CHUNK_ROWS, settings.memory_bytes // 4 // max(1, plan.bytes_per_vector))


def training_size(plan: IndexPlan, dim: int, settings: IndexSettings) -> int:
    """Points to train on: ``train_points_per_centroid`` per IVF list, capped at half the memory
    budget but never under 30 per list; PQ codes want at least 64k."""
    wanted = settings.train_points_per_centroid * max(plan.nlist, 1)
    affordable = settings.memory_bytes // 2 // (4 * dim)
    size = max(min(wanted, affordable), MIN_TRAIN_POINTS_PER_CENTROID * plan.nlist)
    if "PQ" in plan.factory or plan.nlist == 0:
        size = max(size, PQ_TRAIN_POINTS)
    return size


def _train(index: Any, sample: np.ndarray, plan: IndexPlan, seed: int, ngpu: int) -> dict[str, Any]:
    """Train ``index`` on ``sample [n, dim]`` (seeded); returns where it ran and on how many points."""
    faiss = load_faiss()
    if len(sample) < max(plan.nlist, 1):
        raise ValueError(f"index {plan.factory!r} needs at least {plan.nlist} vectors to train, "
                         f"the store has {len(sample)}")
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.cp.seed = seed  # NOTE: seeded k-means on a seeded sample: same input, same index
        ivf = faiss.downcast_index(ivf)
        if getattr(ivf, "do_polysemous_training", False):
            # NOTE: on by default for IVF-PQ, minutes of annealing per sub-quantizer, and only
            # polysemous search (the ``ht`` parameter, never set here) uses it.
            ivf.do_polysemous_training = False
    return {"train": train(index, sample, ngpu, seed), "train_points": len(sample)}


def build_index(entries: list[StoreEntry], dim: int, settings: IndexSettings, staging: Path) -> BuildResult:
    """Write the index of ``entries`` (store entries in shard order; vectors ``[rows, dim]``) into
    ``staging``: ``index.faiss`` (+ ``index.ivfdata`` on disk) and ``ids.parquet``.

    Raises ``ValueError`` for a factory string FAISS rejects or too few vectors to train it.
    """
    started = time.perf_counter()
    timings: dict[str, float] = {}
    source = StoreVectors(entries, dim)
    plan = plan_index(source.total, dim, settings)
    index = make_index(plan.factory, dim, settings.metric)
    ngpu = num_gpus()
    rows = chunk_rows(dim, settings)
    num_train = 0 if index.is_trained else training_size(plan, dim, settings)
    num_queries = settings.tune_queries if source.total > 1 else 0
    query_ids, train_ids = split_sample(source.total, num_queries, num_train, settings.seed)
    device: dict[str, Any] = {"gpus": ngpu, "train": None, "add": "cpu"}

    if not index.is_trained:
        t0 = time.perf_counter()
        device.update(_train(index, source.take(train_ids), plan, settings.seed, ngpu))
        timings["train"] = round(time.perf_counter() - t0, 3)

    t0 = time.perf_counter()
    if plan.storage == "ondisk":
        index, device["add"] = build_on_disk(index, source, staging, part_rows(plan, settings), rows, ngpu > 0)
    else:
        device["add"] = add_in_memory(index, source, part_rows(plan, settings), rows, ngpu > 0)
    timings["add"] = round(time.perf_counter() - t0, 3)

    tuning: dict[str, Any] = {}
    if len(query_ids):
        t0 = time.perf_counter()
        queries = source.take(query_ids)
        if is_exact(index):  # NOTE: exhaustive search: no ground truth to compute, nothing to tune
            tuning = exact_tuning(index, queries[:SINGLE_QUERY_SAMPLES], settings.target_recall).as_dict()
        else:
            truth = exact_neighbours(queries, source, TUNE_K + 1, settings.metric, rows)
            tuning = tune(index, queries, query_ids, truth, settings.target_recall).as_dict()
        timings["tune"] = round(time.perf_counter() - t0, 3)

    if plan.storage == "memory":
        write_index(index, staging / INDEX_FILE)
    num_vectors = int(index.ntotal)
    del index  # NOTE: an on-disk index maps index.ivfdata read-write until released
    source.write_ids(staging / IDS_FILE)
    assert num_vectors == source.total, f"index holds {num_vectors} vectors, the store selection {source.total}"
    result = BuildResult(factory=plan.factory, metric=settings.metric, num_vectors=num_vectors,
                         superseded=source.superseded, plan=plan.as_dict(), search_params=tuning.get("params", {}),
                         tuning=tuning, device=device, timings_s=timings)
    result.files = {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}
    result.seconds = time.perf_counter() - started
    return result
