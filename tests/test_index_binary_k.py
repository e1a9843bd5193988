"""``k`` more than a binary IVF index's probed lists hold, or than a binary HNSW's efSearch finds: the search returns
k hits (every vector, when k is more than the index holds), as a float IVF or HNSW does (README: "more than the index
holds returns what there is"). FAISS's binary IVF search finds Hamming candidates only in the nprobe lists nearest
the query: a 2000-vector BIVF32 index at nprobe 1 answered k=500 with the ~80 vectors of one list, rescored or not;
a BHNSW16 at efSearch 16 answered k=2000 with ~600. Real Parquet, real FAISS, the API and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli

NUM, DIM = 2000, 32


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("binary-ivf-k")
    vectors = np.random.default_rng(0).standard_normal((NUM, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": list(range(NUM)),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   root / "a.parquet")
    petal.index(root / "a.parquet", root / "out", vectors_column="emb", index_factory="BIVF32", quiet=True)
    petal.index(root / "a.parquet", root / "graph", vectors_column="emb", index_factory="BHNSW16", quiet=True)
    return root, vectors


@pytest.mark.parametrize("rescore", [0, 10])
def test_k_past_the_probed_lists_returns_k_hits(index, rescore):
    root, vectors = index
    queries = np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)
    with petal.open_index(root / "out", nprobe=1, rescore=rescore) as probe_one, \
            petal.open_index(root / "out", nprobe=32, rescore=rescore) as every_list:
        for k in (500, NUM, NUM + 10):
            found = probe_one.search_stored(queries, k=k)
            assert [len(hits) for hits in found] == [min(k, NUM)] * 3, (rescore, k)
            assert all(len({h.id for h in hits}) == len(hits) for hits in found)
            if k >= NUM:  # every vector: the answer of every list probed
                assert [[h.id for h in hits] for hits in found] == \
                    [[h.id for h in hits] for hits in every_list.search_stored(queries, k=k)]
        if rescore:  # every vector rescored: the exact order by float similarity (float16 copies: near ties aside)
            exact = queries @ vectors.T
            best = [h.id for h in found[0][:10]]
            assert len(set(best) & set(np.argsort(-exact[0])[:10].tolist())) >= 9
    np.save(root / "q.npy", queries)
    result = CliRunner().invoke(cli, ["query", str(root / "out"), "--vector-file", str(root / "q.npy"), "-k", "600",
                                      "--nprobe", "1", "--rescore", str(rescore), "--json"])
    assert result.exit_code == 0, result.output
    assert [len(json.loads(line)["hits"]) for line in result.stdout.splitlines()] == [600] * 3


@pytest.mark.parametrize("rescore", [0, 10])
def test_k_past_a_binary_graphs_ef_search_returns_k_hits(index, rescore):
    root, _ = index
    queries = np.random.default_rng(2).standard_normal((3, 32)).astype(np.float32)
    with petal.open_index(root / "graph", rescore=rescore) as graph:
        for k in (10, 500, NUM, NUM + 10):
            found = graph.search_stored(queries, k=k)
            assert [len(hits) for hits in found] == [min(k, NUM)] * 3, (rescore, k)
            assert all(len({h.id for h in hits}) == len(hits) for hits in found)


@pytest.mark.parametrize("factory", ["BHash8", "BHash2x8"])
@pytest.mark.parametrize("rescore", [0, 10])
def test_a_binary_hash_index_returns_k_hits_past_its_buckets(index, factory, rescore):
    """A hash index (BHash..., BHashNxB) looks up only the buckets within nflip flips of the query's hash (FAISS's
    nflip 0: its own bucket): 2000 vectors in BHash8 answered k=10 with 4 hits and k=2000 with ~10, rescored or not.
    A query left short now gets every vector's Hamming distance: k hits, every vector's when k is past them, the
    Hamming distances a BFlat index gives."""
    root, _ = index
    out = root / factory
    if not out.exists():
        petal.index(root / "a.parquet", out, vectors_column="emb", index_factory=factory, quiet=True)
        petal.index(root / "a.parquet", root / "flat", vectors_column="emb", index_factory="BFlat", quiet=True)
    queries = np.random.default_rng(3).standard_normal((5, DIM)).astype(np.float32)
    with petal.open_index(out, rescore=rescore) as hashed, petal.open_index(root / "flat", rescore=rescore) as flat:
        for k in (1, 10, 500, NUM, NUM + 10):
            found = hashed.search_stored(queries, k=k)
            assert [len(hits) for hits in found] == [min(k, NUM)] * 5, (k, [len(hits) for hits in found])
            assert all(len({h.id for h in hits}) == len(hits) for hits in found)
            if k >= NUM:  # every vector: scored as the flat index scores them
                for hits, exact in zip(found, flat.search_stored(queries, k=k)):
                    assert sorted(h.id for h in hits) == list(range(NUM))
                    np.testing.assert_allclose(sorted(h.score for h in hits), sorted(h.score for h in exact),
                                               rtol=1e-5)
