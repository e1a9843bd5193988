"""Building a FAISS index from the embedding store, into a staging directory.

Vectors are added shard by shard from the store's memory-mapped entries (never all in RAM at
once). A document id seen in several shards keeps the vector of the last shard in sorted order.
FAISS ids are 0..N-1 in insertion order; ``ids.parquet`` maps them back to documents.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import IndexSettings
from pipeline.store import StoreEntry, sha256_file

ADD_CHUNK_ROWS = 65536
TUNE_QUERIES = 500
TUNE_K = 10
TARGET_RECALL = 0.95


def _faiss():  # heavy import, kept out of module import time
    import faiss

    return faiss


def auto_factory(num_vectors: int, settings: IndexSettings) -> str:
    """Exact search for small corpora; IVF with ~4*sqrt(N) lists (a power of two) above."""
    if num_vectors <= settings.flat_max_vectors:
        return "Flat"
    nlist = 2 ** round(math.log2(4 * math.sqrt(num_vectors)))
    return f"IVF{nlist},Flat"


@dataclass
class BuildResult:
    factory: str
    metric: str
    num_vectors: int
    superseded: int  # vectors dropped because a later shard has the same document id
    search_params: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    seconds: float = 0.0


@dataclass(frozen=True)
class _Selected:
    """Which rows of each entry go into the index (after cross-shard de-duplication)."""

    keep: list[np.ndarray]  # per entry: positions into entry.rows() that are indexed
    total: int
    superseded: int


def _select(entries: list[StoreEntry], row_tables: list[pa.Table]) -> _Selected:
    id_type = pa.string() if any(t.schema.field("id").type == pa.string() for t in row_tables) else pa.int64()
    ids = pa.concat_arrays([t.column("id").combine_chunks().cast(id_type) for t in row_tables]) if row_tables \
        else pa.array([], id_type)
    seq = pa.array(np.arange(len(ids), dtype=np.int64))
    last = pa.table({"id": ids, "seq": seq}).group_by("id").aggregate([("seq", "max")])
    kept = np.zeros(len(ids), dtype=bool)
    kept[last.column("seq_max").to_numpy()] = True
    keep, offset = [], 0
    for table in row_tables:
        keep.append(np.flatnonzero(kept[offset : offset + table.num_rows]))
        offset += table.num_rows
    total = int(kept.sum())
    return _Selected(keep, total, len(ids) - total)


def _vector_chunks(entries: list[StoreEntry], row_tables: list[pa.Table], selected: _Selected) -> Iterator[np.ndarray]:
    for entry, table, keep in zip(entries, row_tables, selected.keep):
        if len(keep) == 0:
            continue
        vectors = entry.embeddings()
        rows = table.column("row").to_numpy()[keep]
        for start in range(0, len(rows), ADD_CHUNK_ROWS):
            yield np.ascontiguousarray(vectors[rows[start : start + ADD_CHUNK_ROWS]], dtype=np.float32)


def _training_sample(entries: list[StoreEntry], row_tables: list[pa.Table], selected: _Selected, size: int,
                     seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(selected.total, size=min(size, selected.total), replace=False))
    out, offset = [], 0
    for entry, table, keep in zip(entries, row_tables, selected.keep):
        lo, hi = np.searchsorted(picks, [offset, offset + len(keep)])
        if hi > lo:
            rows = table.column("row").to_numpy()[keep[picks[lo:hi] - offset]]
            out.append(np.asarray(entry.embeddings()[rows], dtype=np.float32))
        offset += len(keep)
    return np.concatenate(out)


def _tune_nprobe(index: Any, sample: np.ndarray, k: int = TUNE_K,
                 target: float = TARGET_RECALL) -> tuple[dict[str, Any], dict[str, Any]]:
    """Smallest power-of-two nprobe reaching ``target`` recall@k against exact search on ``sample``."""
    faiss = _faiss()
    ivf = faiss.extract_index_ivf(index)
    queries = sample[: min(TUNE_QUERIES, len(sample))]
    # NOTE: ground truth is the same index searched over every list (exact for IVF-Flat), so it
    # covers all indexed vectors, not just the sample.
    ivf.nprobe = ivf.nlist
    _, truth = index.search(queries, k)
    nprobe, recall = 1, 0.0
    while True:
        ivf.nprobe = nprobe
        started = time.perf_counter()
        _, found = index.search(queries, k)
        seconds = time.perf_counter() - started
        recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth)]))
        if recall >= target or nprobe >= ivf.nlist:
            break
        nprobe = min(nprobe * 2, ivf.nlist)
    return {"nprobe": nprobe}, {"target_recall_at_10": target, "recall_at_10": recall,
                                "ms_per_query": 1000 * seconds / len(queries), "queries": len(queries)}


def build_index(entries: list[StoreEntry], dim: int, settings: IndexSettings, staging: Path) -> BuildResult:
    """Write ``index.faiss`` and ``ids.parquet`` for the store entries (in shard order) into ``staging``."""
    faiss = _faiss()
    started = time.perf_counter()
    row_tables = [entry.rows() for entry in entries]
    selected = _select(entries, row_tables)
    factory = auto_factory(selected.total, settings) if settings.factory == "auto" else settings.factory
    metric_type = faiss.METRIC_INNER_PRODUCT if settings.metric == "ip" else faiss.METRIC_L2
    try:
        index = faiss.index_factory(dim, factory, metric_type)
    except RuntimeError as exc:
        raise ValueError(f"--index-factory {factory!r} is not a valid FAISS factory string: {exc}") from exc

    sample = None
    ivf = faiss.try_extract_index_ivf(index)
    if not index.is_trained:
        nlist = ivf.nlist if ivf is not None else 1
        if ivf is not None:
            ivf.cp.seed = settings.seed  # NOTE: seeded k-means: same input, same index
        sample = _training_sample(entries, row_tables, selected, max(256 * nlist, 10_000), settings.seed)
        if len(sample) < nlist:
            raise ValueError(f"index {factory!r} needs at least {nlist} vectors to train, the store has {len(sample)}")
        index.train(sample)
    for chunk in _vector_chunks(entries, row_tables, selected):
        index.add(chunk)

    search_params: dict[str, Any] = {}
    tuning: dict[str, Any] = {}
    if ivf is not None and selected.total > 0:
        if sample is None:
            sample = _training_sample(entries, row_tables, selected, TUNE_QUERIES, settings.seed)
        search_params, tuning = _tune_nprobe(index, sample)

    faiss.write_index(index, str(staging / "index.faiss"))
    _write_ids(entries, row_tables, selected, staging / "ids.parquet")
    result = BuildResult(factory=factory, metric=settings.metric, num_vectors=int(index.ntotal),
                         superseded=selected.superseded, search_params=search_params, tuning=tuning)
    result.files = {name: sha256_file(staging / name) for name in ("index.faiss", "ids.parquet")}
    result.seconds = time.perf_counter() - started
    return result


def _write_ids(entries: list[StoreEntry], row_tables: list[pa.Table], selected: _Selected, path: Path) -> None:
    id_type = pa.string() if any(t.schema.field("id").type == pa.string() for t in row_tables) else pa.int64()
    schema = pa.schema([("faiss_id", pa.int64()), ("id", id_type), ("shard", pa.string()), ("row", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        next_id = 0
        for entry, table, keep in zip(entries, row_tables, selected.keep):
            if len(keep) == 0:
                continue
            part = table.take(pa.array(keep))
            n = part.num_rows
            writer.write_table(pa.table({
                "faiss_id": pa.array(np.arange(next_id, next_id + n, dtype=np.int64)),
                "id": part.column("id").cast(id_type),
                "shard": pa.array([entry.meta["source"]["path"]] * n, pa.string()),
                "row": part.column("row"),
            }, schema=schema))
            next_id += n
        if next_id == 0:
            writer.write_table(schema.empty_table())
