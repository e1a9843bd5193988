"""A search of an HNSW index under any wrapper, with any codes, returns ``min(k, matches)`` hits, filtered or not. A
walk reaches no node that no other node links to, at any efSearch; the queries left short scanned the graph's vectors
only for a bare HNSW (or one under a refine wrapper), and only over Flat or SQ codes when filtered (FAISS's PQ scan
takes no filter): 500 vectors in HNSW4,PQ8 answered a filter matching 244 rows, k=244, with 238 hits, and
IDMap2,HNSW4, PCA16,HNSW4 or OPQ4,HNSW4,PQ4 answered k=500 with 485 to 489. Real Parquet, real FAISS, the API; the
hits against brute force in numpy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal

NUM, DIM = 500, 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("filtered-hnsw-variants")
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((NUM, DIM)).astype(np.float32)
    lang = np.array(["en", "fr"])[rng.integers(0, 2, NUM)]
    pq.write_table(pa.table({"id": list(range(NUM)), "lang": lang,
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   root / "a.parquet")
    return root, vectors, lang


# exact: the codes score as brute force does (the hits' order is checked too)
@pytest.mark.parametrize(("factory", "exact"), [("HNSW4,PQ8", False), ("IDMap2,HNSW4,PQ8", False),
                                                ("OPQ4,HNSW4,PQ4", False), ("IDMap2,HNSW4", True),
                                                ("PCA16,HNSW4", True), ("PCA8,HNSW4,RFlat", True)])
def test_every_hnsw_variant_returns_every_match_it_asks_for(corpus, factory, exact):
    root, vectors, lang = corpus
    out = root / factory.replace(",", "_")
    petal.index(root / "a.parquet", out, vectors_column="emb", index_factory=factory, metric="l2",
                keep_columns="lang", target_recall=0.5, quiet=True)
    queries = np.random.default_rng(1).standard_normal((20, DIM)).astype(np.float32)
    distances = ((queries[:, None] - vectors[None]) ** 2).sum(-1)
    with petal.open_index(out) as index:
        for where, mask in (("lang = 'en'", lang == "en"), (None, np.ones(NUM, dtype=bool))):
            rows = np.flatnonzero(mask)
            found = index.search_stored(queries, k=len(rows), where=where)
            for hits, dist in zip(found, distances):
                got = [h.id for h in hits]
                assert sorted(got) == rows.tolist(), (factory, where, len(got), len(rows))  # each match, once
                if exact:
                    assert got == rows[np.argsort(dist[rows], kind="stable")].tolist(), (factory, where)
                    assert np.allclose([h.score for h in hits], np.sort(dist[rows]), rtol=1e-4, atol=1e-3)
