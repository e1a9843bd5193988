"""Every document of an HNSW index can be reached by a search. FAISS's pruning leaves some nodes that no walk from
the entry point reaches at level 0 (no link leads to them, or only links from nodes no walk reaches: 5,000 Gaussian
32-dim vectors under HNSW8 left about 100), so their documents were in no search's hits, even searched for with their
own vectors at any efSearch. Each build now links every such node from the nearest node a walk reaches
(pipeline/index/graph_repair.py) before the graph is tuned. Real Parquet, real FAISS, the API."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.graph_holdout import hnsw_graph
from petal.pipeline.index.graph_repair import Level0, link_unreachable

NUM, DIM = 5000, 32


@pytest.fixture(scope="module")
def vectors():
    return np.random.default_rng(0).standard_normal((NUM, DIM)).astype(np.float32)


def _unreached(index) -> int:
    return int((~Level0(hnsw_graph(index)).reached()).sum())


def _lost(index, vectors, ef: int = 256) -> set[int]:
    """The documents a search for their own vector does not find first."""
    hnsw_graph(index).efSearch = ef
    _, found = index.search(vectors, 1)
    return set(np.flatnonzero(found[:, 0] != np.arange(len(vectors))).tolist())


@pytest.mark.parametrize("factory", ["HNSW8", "HNSW4,SQ8", "IDMap2,HNSW8", "HNSW16"])
def test_a_walk_reaches_every_node_after_the_repair(vectors, factory):
    faiss = load_faiss()
    index = faiss.index_factory(DIM, factory, faiss.METRIC_L2)
    index.train(vectors)
    if factory.startswith("IDMap"):
        index.add_with_ids(vectors, np.arange(NUM, dtype=np.int64))
    else:
        index.add(vectors)
    unreached = np.flatnonzero(~Level0(hnsw_graph(index)).reached())
    assert len(unreached), "the case needs nodes no walk reaches to begin with"
    lost = _lost(index, vectors)
    # such a document is found only where the walk down the upper levels ends on it (a node of those levels)
    assert len(set(unreached.tolist()) & lost) >= 0.9 * len(unreached)
    assert link_unreachable(index) >= 1
    assert _unreached(index) == 0
    assert len(_lost(index, vectors)) < len(lost)
    assert link_unreachable(index) == 0  # nothing left to do


def test_a_binary_hnsw_is_repaired_too():
    faiss = load_faiss()
    codes = np.random.default_rng(2).integers(0, 256, (NUM, 8), dtype=np.uint8)
    index = faiss.IndexBinaryHNSW(64, 4)
    index.add(codes)
    assert _unreached(index) > 0
    assert link_unreachable(index) >= 1
    assert _unreached(index) == 0


def test_an_index_without_a_graph_is_left_alone(vectors):
    faiss = load_faiss()
    index = faiss.index_factory(DIM, "IVF16,Flat", faiss.METRIC_L2)
    index.train(vectors)
    index.add(vectors)
    assert link_unreachable(index) == 0


@pytest.mark.parametrize("factory", ["HNSW8", "HNSW8,SQ8"])
def test_a_published_hnsw_index_reaches_every_document(tmp_path, vectors, factory):
    """What petal index writes: every node reached, and each document searched for with its own vector found at a
    wide efSearch far more often than in the graph FAISS built (about 100 of 5,000 never came back)."""
    pq.write_table(pa.table({"id": list(range(NUM)),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   tmp_path / "a.parquet")
    out = tmp_path / "out"
    petal.index(tmp_path / "a.parquet", out, vectors_column="emb", index_factory=factory, metric="l2", quiet=True)
    faiss = load_faiss()
    index = faiss.read_index(str(next((out / "versions").glob("*/index.faiss"))))
    assert _unreached(index) == 0
    built = faiss.index_factory(DIM, factory, faiss.METRIC_L2)  # the same graph, as FAISS leaves it
    built.train(vectors)
    built.add(vectors)
    assert len(_lost(index, vectors)) < len(_lost(built, vectors)) - 20
    with petal.open_index(out) as opened:  # and the API finds the document a walk could not reach before
        unreachable_before = np.flatnonzero(~Level0(hnsw_graph(built)).reached())
        assert len(unreachable_before)
        hits = opened.search_stored(vectors[unreachable_before[:20]], k=10)
        found = sum(int(i) in {h.id for h in row} for i, row in zip(unreachable_before[:20], hits))
        assert found >= 15, found
