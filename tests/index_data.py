"""Test data for index tests: seeded vectors, exact search in numpy, a real embedding store."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from petal.bench.vectors import clustered_vectors, commit_shard, random_vectors, unit
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry

__all__ = ["clustered_vectors", "commit", "commit_split", "exact_top_k", "random_vectors", "unit"]


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
    return commit_shard(store, data_dir, name, ids, (vectors[lo : lo + 8192] for lo in range(0, len(ids), 8192)))


def commit_split(store: EmbeddingStore, data_dir: Path, vectors: np.ndarray, num_shards: int) -> list[StoreEntry]:
    """``vectors`` as ``num_shards`` shards with int ids 0..n-1 in order."""
    bounds = np.linspace(0, len(vectors), num_shards + 1).astype(int)
    return [commit(store, data_dir, f"part-{i:03d}.parquet", list(range(lo, hi)), vectors[lo:hi])
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]
