"""Test data for index tests: seeded vectors, exact search in numpy, a real embedding store.

The tests' own generators (benchmarks have theirs in petal.bench: tests do not import benchmark code).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import preflight
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, StoreSink, settings_fingerprint

SYNTHETIC_SETTINGS = {"model": "synthetic", "normalize": True}


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def random_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    """``[n, dim]`` uniform on the unit sphere: no structure, the hardest case for IVF."""
    return unit(np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32))


def vector_shard(data: Path, n: int, rows: int = 20, dim: int = 8) -> Path:
    """``data/v{n}.parquet``: ids ``100 n + i`` and a seeded ``emb`` column of ``dim`` floats (``--vectors-column``)."""
    flat = np.random.default_rng(n).standard_normal((rows, dim)).astype(np.float32).ravel()
    path = data / f"v{n}.parquet"
    pq.write_table(pa.table({"id": np.arange(rows) + 100 * n,
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), dim)}), path)
    return path


def clustered_vectors(n: int, dim: int, seed: int, num_clusters: int = 256, spread: float = 0.6) -> np.ndarray:
    """``[n, dim]`` unit vectors around ``num_clusters`` random unit centers (Dirichlet-drawn sizes);
    ``spread``: the noise norm relative to the center."""
    rng = np.random.default_rng(seed)
    centers = unit(rng.standard_normal((num_clusters, dim), dtype=np.float32))
    labels = rng.choice(num_clusters, size=n, p=rng.dirichlet(np.full(num_clusters, 2.0)))
    noise = rng.standard_normal((n, dim), dtype=np.float32) * np.float32(spread / np.sqrt(dim))
    return unit(noise + centers[labels])


def commit_shard(store: EmbeddingStore, data_dir: Path, name: str, ids: list, vectors: np.ndarray) -> StoreEntry:
    """Write a Parquet shard (id, text) and commit ``vectors [len(ids), dim]`` as its store entry, through
    the real ``StoreSink`` (in chunks, as ``petal index`` does)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / name
    pq.write_table(pa.table({"id": ids, "text": [f"text {i}" for i in ids]}), path)
    info = preflight([path], ReadConfig())[0]
    fingerprint = store.fingerprint(info, settings_fingerprint(SYNTHETIC_SETTINGS))
    sink = StoreSink(store, [info], [fingerprint], SYNTHETIC_SETTINGS, vectors.shape[1])
    assert sink.expect(0, len(ids), [], [], final=True) == []
    committed = []
    for lo in range(0, len(ids), 8192):
        chunk = vectors[lo : lo + 8192]
        committed += sink.add([(0, r, ids[r]) for r in range(lo, lo + len(chunk))], chunk)
    assert len(committed) == 1, f"{len(vectors)} vectors for {len(ids)} ids"
    return committed[0][1]


def exact_top_k(queries: np.ndarray, base: np.ndarray, k: int) -> np.ndarray:
    """``[q, k]`` row numbers of the largest inner products, by numpy (independent of FAISS)."""
    out = np.empty((len(queries), k), dtype=np.int64)
    for lo in range(0, len(queries), 256):
        scores = queries[lo : lo + 256] @ base.T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        out[lo : lo + 256] = np.take_along_axis(top, order, axis=1)
    return out


def commit(store: EmbeddingStore, data_dir: Path, name: str, ids: list, vectors: np.ndarray) -> StoreEntry:
    """Commit ``vectors [len(ids), dim]`` as the store entry of a new Parquet shard ``name``."""
    return commit_shard(store, data_dir, name, ids, vectors)


def commit_split(store: EmbeddingStore, data_dir: Path, vectors: np.ndarray, num_shards: int) -> list[StoreEntry]:
    """``vectors`` as ``num_shards`` shards with int ids 0..n-1 in order."""
    bounds = np.linspace(0, len(vectors), num_shards + 1).astype(int)
    return [commit(store, data_dir, f"part-{i:03d}.parquet", list(range(lo, hi)), vectors[lo:hi])
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]
