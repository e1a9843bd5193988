"""A binary index's search holds bounded memory however many Hamming candidates ``k x rescore`` asks for (up to the
whole index: ``petal serve`` takes ``rescore`` up to 65536 from any request). Before, every query's candidates
were read as one float32 block (``candidates x dim``) and all queries' candidates came back from one FAISS call
(12 bytes each x queries): a 5M-vector index and one request of 256 queries asked for tens of GB.

Real FAISS binary indexes; the hits are the same as scoring every candidate at once (as the code did before), and
equal vectors (equal scores) rank by id wherever the chunks cut."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from petal.pipeline.index import binary
from petal.pipeline.index.binary import BinaryIndex
from petal.pipeline.index.faiss_loader import load_faiss


def make_index(num_vectors: int, dim: int, metric: str, rescore: int, seed: int = 0) -> BinaryIndex:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((num_vectors, dim)).astype(np.float32)
    vectors[num_vectors // 2: num_vectors // 2 + 40] = vectors[:40]  # equal rows: ties the order must settle
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = load_faiss().IndexBinaryFlat(dim)
    index.add(np.packbits(vectors >= 0, axis=1))
    return BinaryIndex(index, vectors.astype(np.float16), metric, rescore)


def all_at_once(index: BinaryIndex, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The search as it was: one FAISS call, each query's candidates scored in one block (a row's score computed
    as the index computes it, so that equal scores are equal)."""
    wanted = min(index.ntotal, k * max(index.rescore, 1))
    _, ids = index.index.search(np.packbits(queries >= 0, axis=1), wanted)
    scores_out = np.full((len(queries), k), -np.inf if index.metric == "ip" else np.inf, dtype=np.float32)
    ids_out = np.full((len(queries), k), -1, dtype=np.int64)
    assert index.rescore_vectors is not None
    for q, (query, row) in enumerate(zip(queries, ids)):
        valid = np.sort(row[row >= 0])
        vectors = np.asarray(index.rescore_vectors[valid], dtype=np.float32)
        scores = (vectors * query).sum(axis=1) if index.metric == "ip" else ((vectors - query) ** 2).sum(axis=1)
        order = np.argsort(-scores if index.metric == "ip" else scores, kind="stable")[:k]
        scores_out[q, :len(order)], ids_out[q, :len(order)] = scores[order], valid[order]
    return scores_out, ids_out


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("rows, per_call", [(7, 50), (64, 1), (1 << 16, 1 << 22)])
def test_chunked_search_finds_what_one_block_does(monkeypatch, metric, rows, per_call):
    index = make_index(3000, 64, metric, rescore=40)
    rng = np.random.default_rng(1)
    queries = rng.standard_normal((9, 64)).astype(np.float32)
    queries[0] = index.rescore_vectors[5].astype(np.float32)  # an indexed row and its copy: a tie at the top
    expected_scores, expected_ids = all_at_once(index, queries, k=25)
    monkeypatch.setattr(binary, "RESCORE_ROWS", rows)
    monkeypatch.setattr(binary, "CANDIDATES_PER_CALL", per_call)
    for k in (25, 1, 3000 // 40 + 7):  # k x rescore up to past the whole index
        scores, ids = index.search(queries, k)
        want_scores, want_ids = (expected_scores, expected_ids) if k == 25 else all_at_once(index, queries, k)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
    assert ids[0, 0] == 5 and ids[0, 1] == 1500 + 5  # the tie: the lower id first


def test_without_rescoring_the_queries_are_searched_in_slices(monkeypatch):
    index = make_index(2000, 64, "ip", rescore=0)
    queries = np.random.default_rng(2).standard_normal((11, 64)).astype(np.float32)
    expected = index.search(queries, 30)
    monkeypatch.setattr(binary, "CANDIDATES_PER_CALL", 65)  # two queries a call
    got = index.search(queries, 30)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])


def test_a_search_over_the_whole_index_holds_bounded_memory(monkeypatch):
    """k x rescore past 200k vectors of 64 dims, 16 queries: scored at once that is 51 MB of float32 a query and
    38 MB of candidates; in bounded slices a few MB."""
    index = make_index(200_000, 64, "ip", rescore=1 << 16)
    queries = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    monkeypatch.setattr(binary, "RESCORE_ROWS", 1 << 13)
    monkeypatch.setattr(binary, "CANDIDATES_PER_CALL", 1 << 18)
    tracemalloc.start()
    try:
        scores, ids = index.search(queries, 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 << 20, f"peak {peak / (1 << 20):.1f} MiB"
    assert (ids >= 0).all() and np.all(np.diff(scores, axis=1) <= 0)
    best = np.argmax(index.rescore_vectors.astype(np.float32) @ queries.T, axis=0)  # every vector was a candidate
    np.testing.assert_array_equal(ids[:, 0], best)
