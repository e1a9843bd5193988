"""FAISS indexes that follow the output format (``pipeline/outputs.py``), built from the store.

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

import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import IndexSettings
from pipeline.errors import BadInputError, ConfigError
from pipeline.index_writer import (
    TUNE_K,
    TUNE_QUERIES,
    BuildResult,
    _select,
    _training_sample,
    _tune_nprobe,
    _vector_chunks,
    _write_ids,
    auto_factory,
    build_index,
)
from pipeline.outputs import OutputConfig, OutputTransform
from pipeline.store import StoreEntry, sha256_file

DEFAULT_RESCORE = 10  # binary: Hamming candidates per wanted hit, re-ranked with float vectors
RESCORE_FILE = "rescore.npy"


def check_index_factory(output: OutputConfig, factory: str) -> None:
    """``--index-factory`` is for float32 vectors; the other formats pick their index (conflicting flags)."""
    if factory != "auto" and (output.quantize != "none" or output.output_dtype != "float32"):
        chosen = f"--quantize {output.quantize}" if output.quantize != "none" else "--output-dtype float16"
        raise ValueError(f"--index-factory {factory!r} conflicts with {chosen}, which picks the index type "
                         "(SQ8, SQfp16 or a binary index); leave --index-factory auto")


def output_factory(num_vectors: int, transform: OutputTransform, settings: IndexSettings) -> str:
    """The index factory string for ``transform``'s vectors (``B``-prefixed for binary indexes)."""
    base = auto_factory(num_vectors, settings)  # "Flat" or "IVF{n},Flat"
    if transform.quantize == "binary":
        return "BFlat" if base == "Flat" else "B" + base.split(",")[0]
    if transform.quantize == "int8":
        return base.replace("Flat", "SQ8")
    if transform.output_dtype == "float16":
        return base.replace("Flat", "SQfp16")
    return base


def build_output_index(entries: list[StoreEntry], transform: OutputTransform, settings: IndexSettings,
                       staging: Path) -> tuple[BuildResult, OutputTransform]:
    """Write the index for ``transform``'s stored vectors; returns the result and the transform with
    the int8 calibration the index learned (unchanged for other formats)."""
    if transform.quantize == "none" and transform.output_dtype == "float32":
        return build_index(entries, transform.dim, settings, staging), transform
    check_index_factory(OutputConfig(transform.dim, transform.quantize, transform.output_dtype), settings.factory)
    started = time.perf_counter()
    row_tables = [entry.rows() for entry in entries]
    selected = _select(entries, row_tables)
    factory = output_factory(selected.total, transform, settings)
    if transform.quantize == "binary":
        search_params, tuning = _build_binary(entries, row_tables, selected, transform, factory, settings, staging)
        files = ("index.faiss", "ids.parquet", RESCORE_FILE)
    else:
        search_params, tuning, transform = _build_scalar(entries, row_tables, selected, transform, factory,
                                                         settings, staging)
        files = ("index.faiss", "ids.parquet")
    _write_ids(entries, row_tables, selected, staging / "ids.parquet")
    result = BuildResult(factory=factory, metric=settings.metric, num_vectors=selected.total,
                         superseded=selected.superseded, search_params=search_params, tuning=tuning)
    result.files = {name: sha256_file(staging / name) for name in files}
    result.seconds = time.perf_counter() - started
    return result, transform


def _build_scalar(entries: list[StoreEntry], row_tables: list[Any], selected: Any, transform: OutputTransform,
                  factory: str, settings: IndexSettings,
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
    sample = _training_sample(entries, row_tables, selected, max(256 * nlist, 10_000), settings.seed)
    if len(sample) < nlist:
        raise ValueError(f"index {factory!r} needs at least {nlist} vectors to train, the store has {len(sample)}")
    index.train(sample)
    for chunk in _vector_chunks(entries, row_tables, selected):
        index.add(chunk)
    search_params, tuning = _tune_nprobe(index, sample) if ivf is not None and selected.total else ({}, {})
    if transform.quantize == "int8":
        trained = faiss.vector_to_array((ivf if ivf is not None else index).sq.trained)
        transform = transform.with_calibration(trained[: transform.dim], trained[transform.dim :])
    faiss.write_index(index, str(staging / "index.faiss"))
    return search_params, tuning, transform


def _build_binary(entries: list[StoreEntry], row_tables: list[Any], selected: Any, transform: OutputTransform,
                  factory: str, settings: IndexSettings, staging: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import faiss

    index = faiss.index_binary_factory(transform.dim, factory)
    sample = None
    if not index.is_trained:
        index.cp.seed = settings.seed
        sample = _training_sample(entries, row_tables, selected, max(256 * index.nlist, 10_000), settings.seed)
        if len(sample) < index.nlist:
            raise ValueError(f"index {factory!r} needs at least {index.nlist} vectors to train, the store has "
                             f"{len(sample)}")
        index.train(np.packbits(sample >= 0, axis=1))
    rescore = np.lib.format.open_memmap(staging / RESCORE_FILE, mode="w+", dtype=np.float16,
                                        shape=(selected.total, transform.dim))
    offset = 0
    for chunk in _vector_chunks(entries, row_tables, selected):
        index.add(np.packbits(chunk >= 0, axis=1))
        rescore[offset : offset + len(chunk)] = chunk
        offset += len(chunk)
    rescore.flush()
    del rescore
    search_params: dict[str, Any] = {}
    tuning: dict[str, Any] = {}
    if sample is not None and selected.total:
        search_params, tuning = _tune_binary_nprobe(index, np.packbits(sample[:TUNE_QUERIES] >= 0, axis=1))
    faiss.write_index_binary(index, str(staging / "index.faiss"))
    return search_params, tuning


def _tune_binary_nprobe(index: Any, queries: np.ndarray, k: int = TUNE_K,
                        target: float = 0.95) -> tuple[dict[str, Any], dict[str, Any]]:
    """Smallest power-of-two nprobe whose Hamming top-k overlaps the exhaustive one by ``target``."""
    index.nprobe = index.nlist
    _, truth = index.search(queries, k)
    nprobe = 1
    while True:
        index.nprobe = nprobe
        started = time.perf_counter()
        _, found = index.search(queries, k)
        seconds = time.perf_counter() - started
        recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth)]))
        if recall >= target or nprobe >= index.nlist:
            break
        nprobe = min(nprobe * 2, index.nlist)
    return {"nprobe": nprobe}, {"target_recall_at_10": target, "recall_at_10": recall,
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
    """Open ``version_dir``'s binary index (its ``rescore.npy`` checked against the manifest's sha256)."""
    import faiss

    files = manifest.get("index", {}).get("files", {})
    rescore_path = version_dir / RESCORE_FILE
    if RESCORE_FILE not in files or not rescore_path.is_file():
        raise ConfigError(f"{version_dir}: {RESCORE_FILE} is missing or not listed in the manifest")
    actual = sha256_file(rescore_path)
    if actual != files[RESCORE_FILE]:
        raise BadInputError(f"{rescore_path}: sha256 {actual[:16]}... does not match the manifest; the index is "
                            "corrupt, rebuild it")
    index = faiss.read_index_binary(str(version_dir / "index.faiss"))
    params = dict(manifest.get("index", {}).get("search_params", {}))
    if nprobe is not None:
        params["nprobe"] = nprobe
    if isinstance(index, faiss.IndexBinaryIVF) and "nprobe" in params:
        index.nprobe = int(params["nprobe"])
    vectors = np.load(rescore_path, mmap_mode="r", allow_pickle=False)
    return BinaryIndex(index, vectors, str(manifest.get("metric", "ip")),
                       DEFAULT_RESCORE if rescore is None else rescore)
