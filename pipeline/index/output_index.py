"""FAISS indexes that follow the output format (``pipeline/store/outputs.py``), built from the store.

| output | index ("auto") | bytes per vector in the index |
|---|---|---|
| float32 | ``index_writer.build_index``: Flat / IVF,Flat (IP or L2) | 4 dim |
| float16 | SQfp16 / IVF{n},SQfp16 | 2 dim |
| int8 | SQ8 / IVF{n},SQ8: per-dimension ranges learned from a sample (recorded as the calibration) | dim |
| binary | IndexBinaryFlat / IndexBinaryIVF (Hamming), + ``rescore.npy`` (float16, memory-mapped) | dim / 8 |

A binary search takes ``rescore * k`` Hamming candidates per query and, when ``rescore > 0``,
re-ranks them by the float similarity of the query to their ``rescore.npy`` rows (read from disk).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.source import StoreVectors, split_sample
from petal.pipeline.index.tune import exact_neighbours, tune
from petal.pipeline.index.writer import BuildResult, build_index
from petal.pipeline.reliability.errors import ConfigError
from petal.pipeline.store.embeddings import StoreEntry, sha256_file
from petal.pipeline.store.outputs import OutputConfig, OutputTransform

DEFAULT_RESCORE = 10  # binary: Hamming candidates per wanted hit, re-ranked with float vectors
RESCORE_FILE = "rescore.npy"
ADD_CHUNK_ROWS = 65536
TUNE_QUERIES = 500
TUNE_K = 10
TARGET_RECALL = 0.95


def check_index_factory(output: OutputConfig, factory: str) -> None:
    """``--index-factory`` is for float32 vectors; the other formats pick their index (conflicting flags)."""
    if factory != "auto" and (output.quantize != "none" or output.output_dtype != "float32"):
        chosen = f"--quantize {output.quantize}" if output.quantize != "none" else "--output-dtype float16"
        raise ValueError(f"--index-factory {factory!r} conflicts with {chosen}, which picks the index type "
                         "(SQ8, SQfp16 or a binary index); leave --index-factory auto")


def output_factory(num_vectors: int, transform: OutputTransform, settings: IndexSettings) -> str:
    """Exact search up to ``flat_max_vectors``, IVF with ~4 sqrt(N) lists (a power of two) above;
    the codes follow the output (``B``-prefixed factories are binary indexes)."""
    nlist = 2 ** round(math.log2(4 * math.sqrt(max(num_vectors, 1))))
    ivf = num_vectors > settings.flat_max_vectors
    if transform.quantize == "binary":
        return f"BIVF{nlist}" if ivf else "BFlat"
    code = "SQ8" if transform.quantize == "int8" else "SQfp16" if transform.output_dtype == "float16" else "Flat"
    return f"IVF{nlist},{code}" if ivf else code


def build_output_index(entries: list[StoreEntry], transform: OutputTransform, settings: IndexSettings,
                       staging: Path) -> tuple[BuildResult, OutputTransform]:
    """Write the index for ``transform``'s stored vectors; returns the result and the transform with
    the int8 calibration the index learned (unchanged for other formats). float32 vectors go to
    ``index_writer.build_index`` (the spine's path)."""
    if transform.quantize == "none" and transform.output_dtype == "float32":
        return build_index(entries, transform.dim, settings, staging), transform
    check_index_factory(OutputConfig(transform.dim, transform.quantize, transform.output_dtype), settings.factory)
    started = time.perf_counter()
    vectors = StoreVectors(entries, transform.dim)
    factory = output_factory(vectors.total, transform, settings)
    if transform.quantize == "binary":
        search_params, tuning = _build_binary(vectors, transform, factory, settings, staging)
        files = ("index.faiss", "ids.parquet", RESCORE_FILE)
    else:
        search_params, tuning, transform = _build_scalar(vectors, transform, factory, settings, staging)
        files = ("index.faiss", "ids.parquet")
    vectors.write_ids(staging / "ids.parquet")
    result = BuildResult(factory=factory, metric=settings.metric, num_vectors=vectors.total,
                         superseded=vectors.superseded, search_params=search_params, tuning=tuning)
    result.files = {name: sha256_file(staging / name) for name in files}
    result.seconds = time.perf_counter() - started
    return result, transform


def _build_scalar(vectors: StoreVectors, transform: OutputTransform, factory: str, settings: IndexSettings,
                  staging: Path) -> tuple[dict[str, Any], dict[str, Any], OutputTransform]:
    import faiss

    metric = faiss.METRIC_INNER_PRODUCT if settings.metric == "ip" else faiss.METRIC_L2
    index = faiss.index_factory(transform.dim, factory, metric)
    ivf = faiss.try_extract_index_ivf(index)
    nlist = 1
    if ivf is not None:
        ivf.cp.seed = settings.seed  # NOTE: seeded k-means: same input, same index
        # NOTE: codes of the vectors themselves (not of residuals), so the learned ranges are the calibration.
        ivf.by_residual = False
        nlist = ivf.nlist
    sample = vectors.sample(max(256 * nlist, 10_000), settings.seed)
    if len(sample) < nlist:
        raise ValueError(f"index {factory!r} needs at least {nlist} vectors to train, the store has {len(sample)}")
    index.train(sample)
    for _, chunk in vectors.chunks(ADD_CHUNK_ROWS):
        index.add(chunk)
    search_params: dict[str, Any] = {}
    tuning: dict[str, Any] = {}
    if ivf is not None and vectors.total > 1:
        # the same tuner as float indexes: nprobe against exact float search over the stored vectors
        query_ids, _ = split_sample(vectors.total, settings.tune_queries, 0, settings.seed)
        queries = vectors.take(query_ids)
        truth = exact_neighbours(queries, vectors, TUNE_K + 1, settings.metric, ADD_CHUNK_ROWS)
        tuning = tune(index, queries, query_ids, truth, settings.target_recall).as_dict()
        search_params = tuning["params"]
    if transform.quantize == "int8":
        trained = faiss.vector_to_array(index.sq.trained)  # IndexScalarQuantizer or IndexIVFScalarQuantizer
        transform = transform.with_calibration(trained[: transform.dim], trained[transform.dim :])
    faiss.write_index(index, str(staging / "index.faiss"))
    return search_params, tuning, transform


def _build_binary(vectors: StoreVectors, transform: OutputTransform, factory: str, settings: IndexSettings,
                  staging: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import faiss

    index = faiss.index_binary_factory(transform.dim, factory)
    sample = None
    if not index.is_trained:
        index.cp.seed = settings.seed
        sample = np.packbits(vectors.sample(max(256 * index.nlist, 10_000), settings.seed) >= 0, axis=1)
        if len(sample) < index.nlist:
            raise ValueError(f"index {factory!r} needs at least {index.nlist} vectors to train, the store has "
                             f"{len(sample)}")
        index.train(sample)
    # NOTE: float16 rows in FAISS id order, memory-mapped at query time: rescoring reads only candidates.
    rescore = np.lib.format.open_memmap(staging / RESCORE_FILE, mode="w+", dtype=np.float16,
                                        shape=(vectors.total, transform.dim))
    for ids, chunk in vectors.chunks(ADD_CHUNK_ROWS):
        index.add(np.packbits(chunk >= 0, axis=1))
        rescore[ids[0] : ids[-1] + 1] = chunk
    rescore.flush()
    del rescore
    search_params: dict[str, Any] = {}
    tuning: dict[str, Any] = {}
    if sample is not None and vectors.total:
        search_params, tuning = _tune_binary_nprobe(index, sample[:TUNE_QUERIES])
    faiss.write_index_binary(index, str(staging / "index.faiss"))
    return search_params, tuning


def _tune_binary_nprobe(index: Any, queries: np.ndarray) -> tuple[dict[str, Any], dict[str, Any]]:
    """Smallest power-of-two nprobe whose top-10 overlaps the all-lists Hamming search's by ``TARGET_RECALL``.

    NOTE: binary indexes are outside FAISS's ParameterSpace, which the float tuner (index_tuning) drives.
    """
    search: Callable[[], np.ndarray] = lambda: index.search(queries, TUNE_K)[1]
    ivf = index
    ivf.nprobe = ivf.nlist
    truth = search()
    nprobe = 1
    while True:
        ivf.nprobe = nprobe
        started = time.perf_counter()
        found = search()
        seconds = time.perf_counter() - started
        recall = float(np.mean([len(set(a) & set(b)) / TUNE_K for a, b in zip(found, truth)]))
        if recall >= TARGET_RECALL or nprobe >= ivf.nlist:
            break
        nprobe = min(nprobe * 2, ivf.nlist)
    return {"nprobe": nprobe}, {"target_recall_at_10": TARGET_RECALL, "recall_at_10": recall,
                                "ms_per_query": 1000 * seconds / len(queries), "queries": len(queries)}


class BinaryIndex:
    """A published binary index: float queries -> sign bits -> Hamming candidates -> float rescoring.

    ``search`` returns scores (larger is better for ``ip``: the rescored similarity, or
    ``1 - 2 hamming / dim`` without rescoring; for ``l2``: squared distance or Hamming distance).
    """

    def __init__(self, index: Any, rescore_vectors: np.ndarray | None, metric: str, rescore: int) -> None:
        self.index = index
        self.rescore_vectors = rescore_vectors
        self.metric = metric
        self.rescore = rescore if rescore_vectors is not None else 0
        self.d = int(index.d)
        self.ntotal = int(index.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``queries [n, dim]`` float32 (stored space) -> ``(scores [n, k], ids [n, k])``; ids -1 pad."""
        codes = np.packbits(queries >= 0, axis=1)
        wanted = min(self.ntotal, k * max(self.rescore, 1))
        hamming, ids = self.index.search(codes, wanted)
        if not self.rescore:
            scores = hamming.astype(np.float32)
            return (1.0 - 2.0 * scores / self.d if self.metric == "ip" else scores)[:, :k], ids[:, :k]
        assert self.rescore_vectors is not None
        out_scores = np.full((len(queries), k), -np.inf if self.metric == "ip" else np.inf, dtype=np.float32)
        out_ids = np.full((len(queries), k), -1, dtype=np.int64)
        for q, (query, row) in enumerate(zip(queries, ids)):
            valid = np.sort(row[row >= 0])
            # NOTE: fancy indexing a memmap reads only the candidates' rows from disk (sorted: sequential reads).
            vectors = np.asarray(self.rescore_vectors[valid], dtype=np.float32)
            if self.metric == "ip":
                scores = vectors @ query
                order = np.argsort(-scores, kind="stable")[:k]
            else:
                scores = ((vectors - query) ** 2).sum(axis=1)
                order = np.argsort(scores, kind="stable")[:k]
            out_scores[q, : len(order)] = scores[order]
            out_ids[q, : len(order)] = valid[order]
        return out_scores, out_ids


def open_binary_index(version_dir: Path, manifest: dict[str, Any], nprobe: int | None = None,
                      rescore: int | None = None) -> BinaryIndex:
    """Open ``version_dir``'s binary index (its files already checked by ``IndexReader``), memory-mapped."""
    import faiss

    from petal.pipeline.index.mmap import read_binary_index_mapped

    files = manifest.get("index", {}).get("files", {})
    rescore_path = version_dir / RESCORE_FILE
    if RESCORE_FILE not in files or not rescore_path.is_file():
        raise ConfigError(f"{version_dir}: {RESCORE_FILE} is missing or not listed in the manifest")
    # NOTE: its size and head/tail checksum were checked with the other files (IndexReader, verify.py);
    # petal verify checks every byte.
    index = read_binary_index_mapped(version_dir / "index.faiss")
    params = dict(manifest.get("index", {}).get("search_params", {}))
    if nprobe is not None:
        params["nprobe"] = nprobe
    if isinstance(index, faiss.IndexBinaryIVF) and "nprobe" in params:
        index.nprobe = int(params["nprobe"])
    vectors = np.load(rescore_path, mmap_mode="r", allow_pickle=False)
    return BinaryIndex(index, vectors, str(manifest.get("metric", "ip")),
                       DEFAULT_RESCORE if rescore is None else rescore)
