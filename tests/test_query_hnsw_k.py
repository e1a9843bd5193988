"""``k`` larger than an HNSW index's tuned ``efSearch``: the search returns k hits (or every vector, when k is more
than the index holds), as for every other index kind (README: "more than the index holds returns what there is").
FAISS's HNSW search keeps at most about efSearch candidates: with efSearch 16 a 400-vector index answered k=400
with ~125 hits, and the filtered (``where``) search the same. Real Parquet, real FAISS, the API and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli

NUM, DIM = 400, 16


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    root = tmp_path_factory.mktemp("hnsw-k")
    flat = np.random.default_rng(0).standard_normal((NUM, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": list(range(NUM)), "lang": ["en", "fr"] * (NUM // 2),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), root / "a.parquet")
    return root


@pytest.mark.parametrize("factory", ["HNSW8", "IDMap2,HNSW8", "HNSW8,RFlat"])
def test_k_past_the_tuned_ef_search_returns_k_hits(shard, factory):
    out = shard / factory.replace(",", "_")
    petal.index(shard / "a.parquet", out, vectors_column="emb", index_factory=factory, keep_columns="lang",
                quiet=True)
    queries = np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)
    exact = queries @ np.random.default_rng(0).standard_normal((NUM, DIM)).astype(np.float32).T
    with petal.open_index(out) as index:
        assert index.info["index"]["search_params"]["efSearch"] < 200  # the tuned value stays what it was
        for k in (200, NUM, NUM + 50):
            found = index.search_stored(queries, k=k)
            assert [len(hits) for hits in found] == [min(k, NUM)] * 3, (factory, k)
            for q, hits in enumerate(found):
                assert len({h.id for h in hits}) == len(hits)
                assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
                if k >= NUM:  # every vector: the order is the exact one
                    assert [h.id for h in hits] == list(np.argsort(-exact[q], kind="stable"))
        filtered = index.search_stored(queries, k=NUM, where="lang = 'en'")
        assert [len(hits) for hits in filtered] == [NUM // 2] * 3
        assert all(h.fields["lang"] == "en" for hits in filtered for h in hits)
        small = index.search_stored(queries, k=5)  # a k under efSearch: as before
        assert [len(hits) for hits in small] == [5] * 3
    np.save(shard / "q.npy", queries)
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(shard / "q.npy"), "-k", str(NUM + 1),
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert [len(json.loads(line)["hits"]) for line in result.stdout.splitlines()] == [NUM] * 3


@pytest.mark.parametrize("factory", ["HNSW4", "HNSW8", "HNSW8,SQ8", "HNSW8,PQ4", "HNSW8,RFlat"])
def test_k_past_the_nodes_a_graph_reaches_returns_every_vector(tmp_path, factory):
    """A node no other node links to is reached by no walk, at any efSearch: 500 vectors in HNSW8 under l2 answered
    k=600 with 497 hits (HNSW4: 482; HNSW8,RFlat of 3000 vectors: 2990 of k=5000), filtered by a column every row
    matches too. A query still short once efSearch reaches every vector scans the graph's vectors (a refine
    wrapper's own codes): every vector."""
    vectors = np.random.default_rng(5).standard_normal((500, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": list(range(500)), "lang": ["en"] * 500,
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   tmp_path / "a.parquet")
    petal.index(tmp_path / "a.parquet", tmp_path / "out", vectors_column="emb", index_factory=factory, metric="l2",
                keep_columns="lang", quiet=True)
    queries = np.random.default_rng(6).standard_normal((10, DIM)).astype(np.float32)
    wheres = [None] if factory.endswith("PQ4") else [None, "lang = 'en'"]  # FAISS's PQ scan takes no selector
    with petal.open_index(tmp_path / "out") as index:
        for where in wheres:
            for hits in index.search_stored(queries, k=600, where=where):
                assert sorted(h.id for h in hits) == list(range(500)), (where, len(hits))
