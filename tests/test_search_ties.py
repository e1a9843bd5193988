"""Hits of equal score come in ascending id, whatever the index and metric, as a binary index's rescoring orders
them. FAISS's result heaps leave ties in either order: a Flat index of a document duplicated in a second shard
answered its later copy first under ``ip`` and the earlier under ``l2``, and a zero query (every score 0) got
ids 3, 2, 1, 0. Real Parquet, real FAISS, the API."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal

NUM, DIM = 40, 16


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("ties")
    vectors = np.random.default_rng(0).standard_normal((NUM, DIM)).astype(np.float32)
    for name, first in (("a", 0), ("b", NUM)):  # b holds a's vectors again, under other ids
        pq.write_table(pa.table({"id": list(range(first, first + NUM)),
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                       root / f"{name}.parquet")
    return root, vectors


@pytest.mark.parametrize("factory", ["Flat", "IVF2,Flat", "HNSW8", "SQ8"])
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_hits_of_equal_score_come_in_ascending_id(shards, factory, metric):
    root, vectors = shards
    out = root / f"{factory.replace(',', '_')}-{metric}"
    petal.index([root / "a.parquet", root / "b.parquet"], out, vectors_column="emb", index_factory=factory,
                metric=metric, quiet=True)
    queries = np.concatenate([vectors[:5], np.zeros((1, DIM), np.float32)])
    with petal.open_index(out) as index:
        for k in (2, 4, 2 * NUM):
            for hits in index.search_stored(queries, k=k):
                assert len(hits) == k
                keys = [(-h.score if metric == "ip" else h.score, h.faiss_id) for h in hits]
                assert keys == sorted(keys), [(h.faiss_id, h.score) for h in hits]
        first = index.search_stored(vectors[:5], k=2)
        assert [[h.id for h in hits] for hits in first] == [[i, NUM + i] for i in range(5)]
