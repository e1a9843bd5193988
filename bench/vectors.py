"""Seeded synthetic embeddings for index benchmarks and tests (unit vectors, float32), committed to a
real embedding store the way ``petal index`` commits a shard."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

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


class ClusteredVectors:
    """A mixture of Gaussian blobs around random unit centers (sizes drawn from a Dirichlet), normalized.

    ``spread`` is the noise norm relative to the unit center: a point's cosine to its center is
    about ``1 / sqrt(1 + spread**2)``. Draws are reproducible per ``seed`` and chunk size.
    """

    def __init__(self, dim: int, seed: int, num_clusters: int = 256, spread: float = 0.6) -> None:
        self.dim, self.spread = dim, spread
        self.rng = np.random.default_rng(seed)
        self.centers = unit(self.rng.standard_normal((num_clusters, dim), dtype=np.float32))
        self.weights = self.rng.dirichlet(np.full(num_clusters, 2.0))

    def reseeded(self, seed: int) -> ClusteredVectors:
        """The same clusters, with fresh points (e.g. queries that are not in the corpus)."""
        other = copy.copy(self)
        other.rng = np.random.default_rng(seed)
        return other

    def draw(self, n: int) -> np.ndarray:
        """``[n, dim]`` float32."""
        labels = self.rng.choice(len(self.centers), size=n, p=self.weights)
        noise = self.rng.standard_normal((n, self.dim), dtype=np.float32)
        noise *= np.float32(self.spread / np.sqrt(self.dim))
        noise += self.centers[labels]
        return unit(noise)

    def chunks(self, n: int, chunk_rows: int = 65536) -> Iterator[np.ndarray]:
        for lo in range(0, n, chunk_rows):
            yield self.draw(min(chunk_rows, n - lo))

    def by_cluster(self, n: int, chunk_rows: int = 65536) -> Iterator[np.ndarray]:
        """``n`` points as ``chunks`` draws them, but one cluster after another (data appended by topic: each
        shard of a store cut from it holds a few clusters), in chunks of at most ``chunk_rows``."""
        counts = self.rng.multinomial(n, self.weights)
        pending: list[np.ndarray] = []
        held = 0
        for label, count in enumerate(counts):
            for lo in range(0, int(count), chunk_rows):
                rows = min(chunk_rows, int(count) - lo)
                noise = self.rng.standard_normal((rows, self.dim), dtype=np.float32)
                noise *= np.float32(self.spread / np.sqrt(self.dim))
                noise += self.centers[label]
                pending.append(unit(noise))
                held += rows
                if held >= chunk_rows:
                    joined = np.concatenate(pending)
                    yield joined[:chunk_rows]
                    pending, held = [joined[chunk_rows:]], held - chunk_rows
        if held:
            yield np.concatenate(pending)


class SphereVectors:
    """Uniform on the unit sphere (``random_vectors``), drawn in chunks: no clusters, the hardest case for graph
    and IVF search alike (at 32 dimensions a 20k-vector HNSW32 needs several times the efSearch of clustered
    data)."""

    def __init__(self, dim: int, seed: int) -> None:
        self.dim = dim
        self.rng = np.random.default_rng(seed)

    def reseeded(self, seed: int) -> SphereVectors:
        return SphereVectors(self.dim, seed)

    def draw(self, n: int) -> np.ndarray:
        return unit(self.rng.standard_normal((n, self.dim), dtype=np.float32))

    def chunks(self, n: int, chunk_rows: int = 65536) -> Iterator[np.ndarray]:
        for lo in range(0, n, chunk_rows):
            yield self.draw(min(chunk_rows, n - lo))


def clustered_vectors(n: int, dim: int, seed: int, num_clusters: int = 256, spread: float = 0.6) -> np.ndarray:
    """``[n, dim]`` from ``ClusteredVectors`` in one draw."""
    return ClusteredVectors(dim, seed, num_clusters, spread).draw(n)


def commit_shard(store: EmbeddingStore, data_dir: Path, name: str, ids: list, chunks: Iterable[np.ndarray],
                 settings: dict[str, Any] | None = None) -> StoreEntry:
    """Write a Parquet shard (id, text) and commit the vectors of ``chunks`` (``[rows, dim]`` each, in
    row order, ``len(ids)`` rows in all) as its embedding store entry, through the real ``StoreSink``."""
    settings = settings or SYNTHETIC_SETTINGS
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / name
    pq.write_table(pa.table({"id": ids, "text": [f"text {i}" for i in ids]}), path)
    info = preflight([path], ReadConfig())[0]
    committed, row, sink = [], 0, None
    for vectors in chunks:
        if sink is None:
            fp = store.fingerprint(info, settings_fingerprint(settings))
            sink = StoreSink(store, [info], [fp], settings, vectors.shape[1])
            assert sink.expect(0, len(ids), [], [], final=True) == []
        keys = [(0, r, ids[r]) for r in range(row, row + len(vectors))]
        committed += sink.add(keys, vectors)
        row += len(vectors)
    assert row == len(ids) and len(committed) == 1, f"{row} vectors for {len(ids)} ids"
    return committed[0][1]
