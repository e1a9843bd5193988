"""``petal serve``'s search path without HTTP: the search batcher (many requests, one FAISS call) against
``IndexReader.search`` one request at a time, the exact GPU-copy search (run here on the CPU through torch,
and on CUDA when there is one) against FAISS, and the response encoders with and without orjson."""

from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
import json
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.serve.searching import search_params
from tests._serve_shared import copy_sample_out
from tests.conftest import SAMPLE_DATA

torch = pytest.importorskip("torch")
faiss = pytest.importorskip("faiss")

QUERIES = ["how do glaciers move", "espresso and coffee", "volcano eruption", "sourdough bread starter",
           "the history of rome", "training for a marathon"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, minilm_dir):
    """sample_data indexed by petal index (the packaged MiniLM, Flat), with a kept column to filter on: a copy of
    the session's index (tests/_serve_shared.py) indexed again with --keep-columns topic (its vectors reused)."""
    out = copy_sample_out(tmp_path_factory, tmp_path_factory.mktemp("serve-search") / "out")
    result = CliRunner().invoke(cli, ["index", str(SAMPLE_DATA), "--out", str(out), "-q", "--keep-columns", "topic"])
    assert result.exit_code == 0, result.output
    return out


def _hits(found):
    return [[(h.id, h.shard, h.row) for h in hits] for hits in found]


def test_batched_searches_equal_one_request_at_a_time(sample_index, minilm_spec):
    """Requests with different k, filters and overrides queued together: each gets what searching it
    alone gives (the query path of petal query: model vectors -> index-time transform -> FAISS)."""
    from petal.pipeline.jobs.query import QueryModel, SearchIndex, engine_config
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    index = SearchIndex.open(sample_index, minilm_spec)
    model = QueryModel(minilm_spec, engine_config(minilm_spec, "cpu"))
    vectors = model.embed(QUERIES)
    topic = index.reader.columns.rows([0], ["topic"])[0]["topic"]
    where = f"topic = '{topic}'"
    requests = [(vectors[i : i + 1], 3 + i % 3, where if i % 2 else None) for i in range(len(QUERIES))]
    requests.append((vectors[:3], 5, None))  # several rows in one request
    batcher = SearchBatcher(SharedExclusiveLock())

    async def scenario():
        tasks = [batcher.search(index, rows, True, k, where=w) for rows, k, w in requests]
        bad = batcher.search(index, vectors[:1], True, 3, where="colour = 'red'")
        batcher.start()  # everything is queued first: one batch
        return await asyncio.gather(*tasks), await asyncio.gather(bad, return_exceptions=True)

    try:
        answers, (error,) = asyncio.run(scenario())
    finally:
        batcher.close()
    for (rows, k, w), got in zip(requests, answers):
        want = index.search(rows, k, where=w)
        assert _hits(got) == _hits(want)
        np.testing.assert_allclose([h.score for hs in got for h in hs], [h.score for hs in want for h in hs],
                                   atol=1e-5)
        if w:
            assert all(h.fields["topic"] == topic for hs in got for h in hs)
    assert isinstance(error, ValueError) and "colour" in str(error)


def test_the_search_queue_is_bounded_in_query_rows(sample_index, minilm_spec):
    """Requests by vectors skip the engine's bounded queue: the search queue has its own bound (503)."""
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.batcher import Overloaded
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    index = SearchIndex.open(sample_index, minilm_spec)
    rows = np.random.default_rng(3).standard_normal((3, index.reader.dim)).astype(np.float32)
    batcher = SearchBatcher(SharedExclusiveLock(), max_queue_rows=4)

    async def scenario():
        first = asyncio.ensure_future(batcher.search(index, rows, False, 2))  # queued; no thread yet
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="--max-queue-texts"):
            await batcher.search(index, rows[:2], False, 2)
        batcher.start()
        return await first, await batcher.search(index, rows[:2], False, 2)

    try:
        first, second = asyncio.run(scenario())
    finally:
        batcher.close()
    assert _hits(first) == _hits(index.search_stored(rows, 2)) and len(second) == 2
    assert batcher.outstanding == 0
    with pytest.raises(Overloaded, match="shutting down"):  # closed: 503, not a 500
        asyncio.run(batcher.search(index, rows, False, 2))


def test_searches_queued_from_the_engine_thread(sample_index, minilm_spec):
    """A search by texts: admitted before its embedding (503 first, no engine work), its vectors handed from
    the engine thread straight to the search queue; it answers what embedding then searching answers, and a
    refused or failed embedding gives its place in the search queue back."""
    from petal.pipeline.jobs.query import QueryModel, SearchIndex, engine_config
    from petal.pipeline.serve.batcher import Overloaded, TokenBatcher
    from petal.pipeline.serve.metrics import ServeMetrics
    from petal.pipeline.serve.requests import RequestError
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    index = SearchIndex.open(sample_index, minilm_spec)
    model = QueryModel(minilm_spec, engine_config(minilm_spec, "cpu"), max_tokens=16)
    tokens = TokenBatcher(model.engine, ServeMetrics(), tokenizers=dict(model.tokenizers))
    searcher = SearchBatcher(SharedExclusiveLock(), max_queue_rows=3)
    submitted_from = []

    async def one(texts, k, where=None):
        ticket = searcher.reserve(index, len(texts), k, where=where)
        try:
            def then(rows, lone):
                submitted_from.append(threading.current_thread().name)
                ticket.submit(rows, lone)
            await tokens.embed_texts(texts, "query", False, "query", then=then)
        finally:
            ticket.cancel()
        return await ticket.future

    async def scenario():
        held = searcher.reserve(index, 2, 3)  # two of the three rows taken
        with pytest.raises(Overloaded, match="--max-queue-texts"):
            await one(list(QUERIES[:2]), 3)  # refused before any embedding
        held.cancel()
        tokens.start()
        searcher.start()
        answers = await asyncio.gather(one([QUERIES[0]], 3), one(list(QUERIES[1:3]), 4))
        too_long = await asyncio.gather(one(["word " * 40], 3), return_exceptions=True)
        bad_filter = await asyncio.gather(one([QUERIES[0]], 3, where="colour = 'red'"), return_exceptions=True)
        return answers, too_long[0], bad_filter[0]

    try:
        (first, second), too_long, bad_filter = asyncio.run(scenario())
    finally:
        tokens.close()
        searcher.close()
    assert _hits(first) == _hits(index.search(model.embed([QUERIES[0]]), 3))
    assert _hits(second) == _hits(index.search(model.embed(list(QUERIES[1:3])), 4))
    assert isinstance(too_long, RequestError) and too_long.status == 413
    assert isinstance(bad_filter, ValueError) and "colour" in str(bad_filter)
    assert submitted_from and set(submitted_from) == {"petal-engine"}
    assert searcher.outstanding == 0 and tokens.outstanding == 0  # every place given back


@pytest.mark.parametrize("device", DEVICES)
def test_a_lone_search_on_a_gpu_copy_runs_on_the_engine_thread(sample_index, minilm_spec, device):
    """A lone search by text whose version has a GPU copy (torch, on the CPU or CUDA) is searched on the engine
    thread itself; searches that find another queued or running, a filtered one and a server without a copy
    go to the search thread. Every path answers what embedding then searching answers."""
    from petal.pipeline.jobs.query import QueryModel, SearchIndex, engine_config
    from petal.pipeline.serve.batcher import TokenBatcher
    from petal.pipeline.serve.gpu_search import GpuReaders
    from petal.pipeline.serve.metrics import ServeMetrics
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    index = SearchIndex.open(sample_index, minilm_spec)
    model = QueryModel(minilm_spec, engine_config(minilm_spec, "cpu"), max_tokens=32)
    gpu = GpuReaders(device, "float32")
    gpu.prepare(index.reader)
    topic = index.reader.columns.rows([0], ["topic"])[0]["topic"]
    reference = SearchBatcher(SharedExclusiveLock())  # FAISS on the search thread: what every path must answer
    results = {}

    def run(searcher, requests):
        tokens = TokenBatcher(model.engine, ServeMetrics(), tokenizers=dict(model.tokenizers))
        searched_on = []

        async def one(texts, k, where=None):
            ticket = searcher.reserve(index, len(texts), k, where=where)
            try:
                await tokens.embed_texts(texts, "query", False, "query", then=ticket.submit)
            finally:
                ticket.cancel()
            found = await ticket.future
            searched_on.append(ticket.inline_s > 0)
            return found

        async def scenario():
            tokens.start()
            searcher.start()
            out = []
            for group in requests:  # each group concurrently, the groups one after another
                for found in await asyncio.gather(*(one(*r) for r in group)):
                    out.extend(found)  # a request's rows of hits, one list per query text
            return out

        try:
            found = asyncio.run(scenario())
        finally:
            tokens.close()
            searcher.close()
        assert searcher.outstanding == 0 and tokens.outstanding == 0
        return found, searched_on

    lone = [[([q], 3)] for q in QUERIES[:3]] + [[(list(QUERIES[3:5]), 4)], [([QUERIES[5]], 2, f"topic = '{topic}'")]]
    together = [[([q], 5) for q in QUERIES]]
    for name, searcher in (("gpu", SearchBatcher(SharedExclusiveLock(), gpu)),
                           ("faiss", SearchBatcher(SharedExclusiveLock())), ("reference", reference)):
        results[name] = run(searcher, lone)
        if name == "gpu":
            results["gpu-together"] = run(SearchBatcher(SharedExclusiveLock(), gpu), together)
            results["faiss-together"] = run(SearchBatcher(SharedExclusiveLock()), together)
    assert results["gpu"][1] == [True, True, True, True, False]  # the filtered one keeps the search thread
    assert results["faiss"][1] == [False] * 5  # no GPU copy: FAISS on the search thread
    assert _hits(results["gpu"][0]) == _hits(results["reference"][0]) == _hits(results["faiss"][0])
    np.testing.assert_allclose([h.score for hs in results["gpu"][0] for h in hs],
                               [h.score for hs in results["reference"][0] for h in hs], atol=1e-5)
    # six at once: the engine batches them into one step, so none is lone and the search thread takes them
    assert not any(results["gpu-together"][1])
    assert _hits(results["gpu-together"][0]) == _hits(results["faiss-together"][0])


def test_filters_are_cached_boundedly_and_survive_a_pruned_version(sample_index, tmp_path):
    """`where` is the clients' choice: the selector cache keeps the last few, not one mask per expression
    ever seen; a version still served after its directory was pruned still filters."""
    import shutil

    from petal.pipeline.index.search import MAX_SELECTORS, IndexReader

    version = sample_index / "versions" / (sample_index / "CURRENT").read_text().strip()
    copy = tmp_path / version.name
    shutil.copytree(version, copy)
    reader = IndexReader(copy)
    for n in range(MAX_SELECTORS + 20):
        reader.selector(f"topic = 'topic-{n}'")
    assert len(reader._selectors) == MAX_SELECTORS
    topic = reader.columns.rows([0], ["topic"])[0]["topic"]
    shutil.rmtree(copy)  # pruned by a later `petal index` while a server still searches it
    query = np.zeros((1, reader.dim), dtype=np.float32)
    hits = reader.search(query, 5, where=f"topic = '{topic}'")[0]
    assert hits and all(h.fields["topic"] == topic for h in hits)


@pytest.mark.parametrize("metric", [faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_torch_exact_index_equals_exact_faiss(metric, dtype):
    """The GPU copy's search (torch; here on the CPU) finds FAISS's exact top k, for Flat and for an IVF
    whose vectors it decodes through a direct map."""
    from petal.pipeline.serve.gpu_search import TorchExactIndex

    rng = np.random.default_rng(0)
    data = rng.standard_normal((3000, 32)).astype(np.float32)
    queries = rng.standard_normal((7, 32)).astype(np.float32)
    flat = faiss.IndexFlat(32, metric)
    flat.add(data)
    want_scores, want_ids = flat.search(queries, 10)
    quantizer = faiss.IndexFlat(32, metric)
    ivf = faiss.IndexIVFFlat(quantizer, 32, 16, metric)
    ivf.train(data)
    ivf.add_with_ids(data, np.arange(len(data), dtype=np.int64))
    for index in (flat, ivf):
        exact = TorchExactIndex(index, device="cpu", dtype=dtype)
        scores, ids = exact.search(queries, 10)
        assert ids.dtype == np.int64 and scores.shape == (7, 10)
        assert (ids == want_ids).mean() > (0.97 if dtype == "float16" else 0.999)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-3 if dtype == "float16" else 1e-5, atol=1e-3)
    assert TorchExactIndex(flat, device="cpu").search(queries, 5000)[1].shape == (7, 3000)  # k over ntotal


_TRAINED: dict[tuple, bytes] = {}


def _ivf(factory, metric, data, train):
    """``factory`` trained on ``train`` with ``data`` added: a fresh index each call (the caller may change it),
    trained once per module for the same arguments (FAISS's k-means is seeded: the same index; a PQ8's ~10 s)."""
    from petal.pipeline.index.writer import no_polysemous_training

    key = (factory, metric, data.tobytes(), train.tobytes())
    if key not in _TRAINED:
        index = faiss.index_factory(data.shape[1], factory, metric)
        no_polysemous_training(index)  # as petal's builder does: FAISS's default spent ~15 s a PQ test on it
        index.train(train)
        index.add(data)
        _TRAINED[key] = faiss.serialize_index(index)
    return faiss.deserialize_index(_TRAINED[key])


@pytest.mark.parametrize("metric", [faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2])
@pytest.mark.parametrize("factory", ["IVF32,Flat", "IVF32_HNSW8,Flat", "IVF32,SQ8", "IVF16,PQ8"])
@pytest.mark.parametrize("plan", ["gather", "gather-in-windows", "scan"])
def test_torch_ivf_index_equals_faiss_ivf(metric, factory, plan, monkeypatch):
    """The GPU copy of an IVF index (torch; here on the CPU) probes its own lists: FAISS's IVF answer for
    the same nprobe, for raw and decoded codes, lopsided lists (one holds a third of the vectors), the
    probed lists gathered in one window or many (a small gather budget) or every row scanned with the
    other lists masked, and k beyond what the probed lists hold (padded with -1). An HNSW quantizer, which
    FAISS searches approximately, gets the lists of an exact search of the same centroids (the answer of
    the same index over a flat quantizer)."""
    from petal.pipeline.serve import gpu_ivf

    monkeypatch.setattr(gpu_ivf, "SCAN_RATIO", 0.0 if plan == "scan" else 1e9)
    monkeypatch.setattr(gpu_ivf, "FUSED_SCAN_RATIO", 0.0 if plan == "scan" else 1e9)
    monkeypatch.setattr(gpu_ivf, "GATHER_BYTES", 30000 if plan == "gather-in-windows" else 512 << 20)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((4000, 24)).astype(np.float32)
    data[:1300] = 2 + 0.1 * data[:1300]  # a tight cluster the lists were not trained on: one long list
    queries = np.concatenate([rng.standard_normal((6, 24)), 2 + 0.1 * rng.standard_normal((2, 24))]).astype(np.float32)
    index = _ivf(factory, metric, data, train=data[1300:])
    index.make_direct_map()  # to decode the returned ids below
    sizes = [index.invlists.list_size(i) for i in range(index.nlist)]
    gpu = gpu_ivf.TorchIvfIndex(index, 1, device="cpu", dtype="float32")
    assert max(sizes) > 4 * gpu.segment  # the long list spans several segments
    if "HNSW" in factory:  # the GPU copy chooses, and from here on FAISS too, lists by an exact search of the centroids
        assert gpu_ivf.coarse_problem(index) is None
        flat = faiss.IndexFlat(24, metric)
        flat.add(index.quantizer.reconstruct_n(0, index.nlist))
        index.quantizer = flat  # NOTE: `flat` outlives the searches below (the index does not own it)
    for nprobe, k in [(1, 10), (3, 10), (index.nlist, 10), (1, 2000)]:
        index.nprobe = nprobe
        want_scores, want_ids = index.search(queries, k)
        scores, ids = gpu.with_nprobe(nprobe).search(queries, k)
        assert ids.dtype == np.int64 and scores.shape == (8, k)
        np.testing.assert_array_equal(ids < 0, want_ids < 0)  # the same number of hits per query
        # rank by rank FAISS's scores, each the score of the vector returned (tied scores inside the tight
        # cluster, e.g. one PQ code shared by many vectors, may return another of the tied vectors)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-4)
        found = ids >= 0
        rows = np.repeat(queries, k, axis=0)[found.ravel()]
        decoded = index.reconstruct_batch(ids[found])
        own = (rows * decoded).sum(1) if metric == faiss.METRIC_INNER_PRODUCT else ((rows - decoded) ** 2).sum(1)
        np.testing.assert_allclose(own, scores[found], rtol=1e-4, atol=1e-4)
        if k == 2000:  # more than the probed list holds: all of it, whatever the ties
            assert [set(a) for a in ids] == [set(b) for b in want_ids]
        else:  # the spread queries have no ties
            assert (ids[:6] == want_ids[:6]).mean() > 0.99, (nprobe, k)
    assert gpu.nprobe == 1  # views do not change the copy they share
    half = gpu_ivf.TorchIvfIndex(index, 3, device="cpu", dtype="float16")
    index.nprobe = 3
    want_scores, want_ids = index.search(queries[:6], 10)  # (float16 cannot rank inside the tight cluster)
    scores, ids = half.search(queries[:6], 10)
    assert (ids == want_ids).mean() > 0.95
    np.testing.assert_allclose(scores, want_scores, rtol=2e-3, atol=2e-2)


def test_torch_ivf_index_of_empty_lists_and_an_empty_index():
    from petal.pipeline.serve.gpu_ivf import TorchIvfIndex

    rng = np.random.default_rng(4)
    data = rng.standard_normal((600, 8)).astype(np.float32)
    index = faiss.index_factory(8, "IVF8,Flat")
    index.train(data)
    scores, ids = TorchIvfIndex(index, 4, device="cpu").search(data[:3], 5)  # trained, nothing added
    assert (ids == -1).all() and scores.shape == (3, 5)
    index.add(data[:5])  # most lists empty
    index.nprobe = 8
    want_scores, want_ids = index.search(data[:3], 10)
    scores, ids = TorchIvfIndex(index, 8, device="cpu", dtype="float32").search(data[:3], 10)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def test_gpu_reader_answers_like_the_faiss_reader(sample_index, minilm_spec):
    """A reader over the torch copy maps hits exactly as the FAISS one (ids, shards, rows, kept columns)."""
    from petal.pipeline.jobs.query import QueryModel, SearchIndex, engine_config
    from petal.pipeline.serve.gpu_search import GpuReaders

    index = SearchIndex.open(sample_index, minilm_spec)
    vectors = index.transform.stored(QueryModel(minilm_spec, engine_config(minilm_spec, "cpu")).embed(QUERIES))
    readers = GpuReaders("cpu", "float32")
    readers.prepare(index.reader)
    copy = readers.get(index.reader)
    assert copy is not None and copy.index is not index.reader.index
    got, want = copy.search(vectors, 5), index.reader.search(vectors, 5)
    assert _hits(got) == _hits(want) and [[h.fields for h in hs] for hs in got] == [[h.fields for h in hs]
                                                                                     for hs in want]
    np.testing.assert_allclose([h.score for hs in got for h in hs], [h.score for hs in want for h in hs], atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_torch_exact_index_on_cuda(dtype):
    from petal.pipeline.serve.gpu_search import TorchExactIndex

    rng = np.random.default_rng(1)
    data = rng.standard_normal((20000, 64)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(64)
    flat.add(data)
    queries = data[:50] + 0.01 * rng.standard_normal((50, 64)).astype(np.float32)
    want_scores, want_ids = flat.search(queries, 10)
    scores, ids = TorchExactIndex(flat, device="cuda", dtype=dtype).search(queries, 10)
    assert (ids[:, 0] == np.arange(50)).all() and (ids == want_ids).mean() > 0.97
    np.testing.assert_allclose(scores, want_scores, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("metric", [faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("plan", ["gather", "scan"])
def test_torch_ivf_index_on_cuda(metric, dtype, plan, monkeypatch):
    """On CUDA up to 16 queries replay a graph per (query bucket, k, nprobe): every replay answers its own
    queries (FAISS's IVF answer), padded buckets included, across more graphs than are kept; more queries
    run eagerly; gathering the probed lists (where they are small) and scanning everything give the same."""
    from petal.pipeline.serve import gpu_ivf

    monkeypatch.setattr(gpu_ivf, "MAX_GRAPHS", 3)
    for name in ("SCAN_RATIO", "FUSED_SCAN_RATIO"):
        monkeypatch.setattr(gpu_ivf, name, 0.0 if plan == "scan" else 1e9)
    rng = np.random.default_rng(8)
    data = rng.standard_normal((30000, 64)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    index = _ivf("IVF128,Flat", metric, data, train=data)
    gpu = gpu_ivf.TorchIvfIndex(index, 4, device="cuda", dtype=dtype)
    gpu.warm_up(10)  # the graphs and the eager sizes, as a served version's copy (the answers below unchanged)
    tolerance = 3e-3 if dtype == "float16" else 1e-4
    for round_ in range(2):
        for nprobe, k in [(4, 10), (1, 5), (16, 10), (4, 100), (128, 10)]:
            index.nprobe = nprobe
            view = gpu.with_nprobe(nprobe)
            for nq in (1, 1, 3, 16, 9, 40):
                queries = data[rng.integers(0, len(data), nq)] + 0.05 * rng.standard_normal((nq, 64)).astype(np.float32)
                want_scores, want_ids = index.search(queries, k)
                scores, ids = view.search(queries, k)
                assert (ids[:, 0] == want_ids[:, 0]).all(), (round_, nprobe, k, nq)
                if dtype == "float32":
                    assert (ids == want_ids).mean() > 0.999
                else:  # float16 storage: neighbours a rounding apart may swap ranks or trade the last places
                    assert np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, want_ids)]) > 0.97
                np.testing.assert_allclose(scores, want_scores, atol=tolerance)
    assert len(gpu._graphs) <= 3 and gpu._graphs is gpu.with_nprobe(2)._graphs  # the views share them


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("nprobe", [1, 4, 32, 128])
def test_the_eager_warm_up_reaches_both_eager_paths(fused, nprobe):
    """A version's GPU copy warms its eager sizes too (a search of more queries than the largest graph), so
    the first such request pays no one-time cost: the sizes gather where any eager size would, and scan
    where any would, and stay within one chunk."""
    from petal.pipeline.serve import gpu_ivf
    from petal.pipeline.serve.gpu_search import QUERY_ROWS

    rng = np.random.default_rng(3)
    data = rng.standard_normal((20000, 32)).astype(np.float32)
    index = _ivf("IVF128,Flat", faiss.METRIC_INNER_PRODUCT, data, train=data)
    gpu = gpu_ivf.TorchIvfIndex(index, nprobe, device="cpu", dtype="float32")
    gpu.fused = fused
    sizes = gpu.eager_warm_up_queries()
    eager = range(gpu_ivf.GRAPH_QUERIES[-1] + 1, QUERY_ROWS + 1)
    assert sizes and all(n in eager for n in sizes) and QUERY_ROWS in sizes
    for plan in (True, False):
        assert any(gpu.gathers(n, nprobe) is plan for n in eager) == any(gpu.gathers(n, nprobe) is plan
                                                                         for n in sizes), (plan, sizes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32] if torch.cuda.is_available() else [None])
@pytest.mark.parametrize("dim,num_rows", [(64, 100), (200, 1000), (1024, 131)])
def test_gather_dots_equal_gathered_products(dtype, dim, num_rows):
    """The fused scores of ``serve/gather_dots.py`` equal gathering the rows and multiplying, in float32;
    row -1 (padding) scores 0."""
    from petal.pipeline.serve.gather_dots import gather_dots

    gen = torch.Generator(device="cuda").manual_seed(0)
    vectors = torch.randn((5000, dim), device="cuda", generator=gen).to(dtype)
    rows = torch.randint(-1, 5000, (5, num_rows), device="cuda", generator=gen)
    q = torch.randn((5, dim), device="cuda", generator=gen)
    got = gather_dots(vectors, rows, q)
    want = torch.bmm(vectors[rows.clamp(min=0)].double(), q.double()[:, :, None])[:, :, 0].masked_fill(rows < 0, 0)
    assert got.dtype == torch.float32 and got.shape == (5, num_rows)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def vectors_index(tmp_path_factory):
    """An index of precomputed unit vectors (``--vectors-column``: no model, so it builds on the GPU host
    too) with a kept column to filter on; an IVF so the GPU copy decodes it through a direct map."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("serve-vectors")
    rng = np.random.default_rng(5)
    data = rng.standard_normal((4000, 48)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    table = pa.table({"id": np.arange(len(data)), "topic": [f"t{i % 3}" for i in range(len(data))],
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), 48)})
    pq.write_table(table, root / "vectors.parquet")
    out = root / "out"
    result = CliRunner().invoke(cli, ["index", str(root / "vectors.parquet"), "--out", str(out), "-q",
                                      "--vectors-column", "emb", "--keep-columns", "topic",
                                      "--index-factory", "IVF16,Flat"])
    assert result.exit_code == 0, result.output
    return out, data



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("max_k", [3, 10, 1000])
def test_the_gpu_copy_captures_the_default_k_under_max_k(vectors_index, max_k):
    """A /search that leaves k out asks for 10, or --max-k when lower: the lists copy captures that k's graphs
    before the version serves (it captured k=10 whatever --max-k said, so under --max-k 3 every default request
    met a graph capture on its path)."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.serve.gpu_ivf import GRAPH_QUERIES
    from petal.pipeline.serve.gpu_search import GpuReaders
    from petal.pipeline.serve.requests import default_k

    out, _ = vectors_index
    reader = IndexReader(out, nprobe=3)
    readers = GpuReaders("cuda", "float32", warm_k=default_k(max_k))
    readers.prepare(reader)
    copy = readers._readers[id(reader)]
    assert copy is not None
    captured = {k for _queries, k, _probes in copy.index._graphs}
    assert captured == {min(10, max_k)} and len(copy.index._graphs) == len(GRAPH_QUERIES)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("exact", [False, True])
def test_gpu_copy_through_the_search_batcher_answers_like_faiss(vectors_index, device, dtype, exact):
    """``--search-device`` copies (torch; on the CPU here, on CUDA on the GPU host) searched through the
    search batcher: requests with different k and nprobe queued together get FAISS's IVF answer for their
    nprobe from the copy of the lists (the exhaustive answer, every list probed, from the exact copy);
    a filtered request keeps the FAISS path of the same version."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.gpu_search import GpuReaders
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    out, data = vectors_index
    reader = IndexReader(out, nprobe=16 if exact else 3)  # exact: every list probed, FAISS is exhaustive too
    readers = GpuReaders(device, dtype, exact=exact)
    readers.prepare(reader)
    copy = readers.get(reader)
    assert copy is not None and type(copy.index).__name__ == ("TorchExactIndex" if exact else "TorchIvfIndex")
    assert (readers.get(reader, 2) is None) == exact  # an exact copy leaves a request's nprobe to FAISS
    index = SearchIndex(reader, None)  # type: ignore[arg-type]  # stored vectors: no model transform
    rng = np.random.default_rng(6)
    queries = data[:9] + 0.3 * rng.standard_normal((9, 48)).astype(np.float32)
    requests = [(queries[i : i + 1], 1 + 4 * i, None, None) for i in range(6)] + [
        (queries[6:9], 7, None, None), (queries[:2], 5, "topic = 't1'", None), (queries[2:5], 20, None, 1),
        (queries[5:8], 20, None, 9)]
    batcher = SearchBatcher(SharedExclusiveLock(), readers)

    async def scenario():
        tasks = [batcher.search(index, rows, False, k, where=w, nprobe=p) for rows, k, w, p in requests]
        batcher.start()
        return await asyncio.gather(*tasks)

    try:
        answers = asyncio.run(scenario())
    finally:
        batcher.close()
    tolerance = 2e-3 if dtype == "float16" else 1e-5
    for (rows, k, w, p), got in zip(requests, answers):
        if p is None:
            want = reader.search(rows, k, where=w)
        else:
            with search_params(reader, p, None):
                want = reader.search(rows, k)
        assert [len(hs) for hs in got] == [len(hs) for hs in want]
        assert [hs[0].id for hs in got] == [hs[0].id for hs in want]
        if dtype == "float32":
            assert _hits(got) == _hits(want)
        else:  # float16 storage: near-ties may swap; the ranks' scores agree
            assert np.mean([a.id == b.id for hs, ws in zip(got, want) for a, b in zip(hs, ws)]) > 0.9
        np.testing.assert_allclose([h.score for hs in got for h in hs], [h.score for hs in want for h in hs],
                                   atol=tolerance)
        if w:
            assert all(h.fields["topic"] == "t1" for hs in got for h in hs)


@pytest.mark.parametrize("nprobe", [1, 2, 16])
def test_a_filtered_request_probes_its_own_nprobe(vectors_index, nprobe):
    """`where` with `nprobe` on an IVF: the request's nprobe, as `petal query --where --nprobe` (an IndexReader
    opened with that nprobe) answers; the filtered search once passed FAISS the tuned nprobe instead."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    out, data = vectors_index
    reader = IndexReader(out)
    tuned = reader.search_params["nprobe"]
    index = SearchIndex(reader, None)  # type: ignore[arg-type]  # stored vectors: no model transform
    queries = data[:4]
    where = "topic = 't1'"
    batcher = SearchBatcher(SharedExclusiveLock())

    async def scenario():
        tasks = [batcher.search(index, queries, False, 200, where=where, nprobe=nprobe),
                 batcher.search(index, queries, False, 200, where=where)]  # the tuned nprobe, queued together
        batcher.start()
        return await asyncio.gather(*tasks)

    try:
        got, default = asyncio.run(scenario())
    finally:
        batcher.close()
    want = IndexReader(out, nprobe=nprobe).search(queries, 200, where=where)
    assert _hits(got) == _hits(want)
    assert _hits(default) == _hits(reader.search(queries, 200, where=where))
    assert all(h.fields["topic"] == "t1" for hs in got for h in hs)
    assert reader.search_params["nprobe"] == tuned  # restored
    if nprobe != tuned:  # a meaningful check: another nprobe, other hits (k of them: a short search probes more)
        assert _hits(got) != _hits(default)


def test_lists_of_a_lossy_quantizer_fall_back_to_the_exhaustive_copy(vectors_index, caplog):
    """An IVF whose coarse quantizer is neither flat nor HNSW (LSH: lossy centroids, Hamming search) gets
    the exhaustive GPU copy, said in the log, and still answers like FAISS (every list probed)."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.serve.gpu_search import gpu_reader

    out, data = vectors_index
    reader = IndexReader(out)
    quantizer = faiss.IndexLSH(48, 16)
    index = faiss.IndexIVFFlat(quantizer, 48, 16, faiss.METRIC_L2)
    index.train(data)
    index.add(data)
    index.nprobe = 16
    reader.index = index  # the same vectors, in the same order: the reader's ids still map them
    reader.__dict__["_keep"] = quantizer  # NOTE: the IVF does not own its quantizer
    with caplog.at_level("WARNING", logger="petal.serve"):
        copy = gpu_reader(reader, "cpu", "float32")
    assert copy is not None and type(copy.index).__name__ == "TorchExactIndex"
    assert "are not copied (its coarse quantizer is IndexLSH" in caplog.text
    want_scores, want_ids = index.search(data[:5], 4)
    scores, ids = copy.index.search(data[:5], 4)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-4)


def test_search_device_cuda_needs_the_model_on_cuda(sample_index, monkeypatch):
    """A text index (its GPU copy is searched with the model's query vectors); an index of vectors: see
    tests/test_serve_unused_flags.py."""
    argv = ["serve", str(sample_index), "--search-device", "cuda", "--device", "cpu", "--port", "0"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2 and "needs the model on CUDA" in result.output and "--device cpu" in result.output
    # the flags and the manifest decide it: a usage error before the check for the serve extra (78 on a host without)
    import petal.cli.serve as serve_cli

    monkeypatch.setattr(serve_cli, "missing_serve_extra", lambda: ["uvicorn"])
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2 and "needs the model on CUDA" in result.output


@pytest.mark.parametrize("use_orjson", [True, False])
def test_embedding_bodies_read_back_exactly(use_orjson):
    """float JSON (orjson's or the %.9g fallback) and base64 give back the same float32 values."""
    from petal.pipeline.serve.encoding import dumps, embeddings_body, loads

    rows = np.random.default_rng(2).standard_normal((3, 384)).astype(np.float32) * 1e-3
    for fmt in ("float", "base64"):
        body = json.loads(embeddings_body("m", rows, fmt, 12, use_orjson=use_orjson))
        assert body["usage"] == {"prompt_tokens": 12, "total_tokens": 12} and body["model"] == "m"
        assert [d["index"] for d in body["data"]] == [0, 1, 2]
        got = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") if fmt == "base64"
               else np.array(d["embedding"], dtype=np.float32) for d in body["data"]]
        np.testing.assert_array_equal(np.stack(got), rows)
    odd = {"when": datetime.date(2024, 1, 2), "price": decimal.Decimal("1.5"), 3: "three", "text": "é"}
    assert json.loads(dumps(odd, use_orjson)) == json.loads(json.dumps(odd, default=str))
    assert loads(b'{"k": NaN, "big": 123456789012345678901234567890}')["big"] == 123456789012345678901234567890
    assert loads(b'{"big": 18446744073709551616}')["big"] == 2**64  # orjson alone would read 1.8e19
    assert json.loads(dumps({"text": "a\ud800b"}, use_orjson)) == {"text": "a\ud800b"}  # a lone surrogate: escaped
    with pytest.raises(UnicodeDecodeError):  # UTF-8 only (RFC 8259): the stdlib alone would take UTF-16
        loads('{"k": 1}'.encode("utf-16"))


@pytest.mark.parametrize(("body", "repeated"), [
    (b'{"query": "x", "k": 1}', None), (b'{"query": "query"}', None), (b'{"a": {"a": 1}}', None),
    (b'{"a": [{"b": 1, "c": 2}], "b": 3}', None), (b'{"q\\u00e9": 1, "q\\u00e9x": 2}', None),
    (b'{"query": "x", "k": 1, "query": "y"}', "query"), (b'{"query": "x", "\\u0071uery": "y"}', "query"),
    (b'{"a/b": 1, "a\\/b": 2}', "a/b"), ('{"\u00e9": 1, "\u00e9": 2}'.encode(), "\u00e9"),
    (b'{"q": 1, "qq": 2, "xq": "q:"}', None), (b'{"k": [1, {"k": 2}], "x": "k", "k": 3}', "k"),
    ('{"\u00e9": "\u00e9\u00e9", "e": 1}'.encode(), None),
])
def test_a_repeated_field_is_found(body, repeated):
    from petal.pipeline.serve.encoding import duplicate_key, loads

    assert duplicate_key(body, loads(body)) == repeated
    with pytest.raises(json.JSONDecodeError):
        loads(b"{not json")


def test_a_body_of_many_keys_is_checked_for_repeats_in_linear_time():
    """The repeated-field check counted each key of the body in the whole body: 50,000 unknown fields in a 1 MB
    body (tests/test_serve_audit_search.py sends one) held the server's CPU for a minute or more before the 422.
    Past a few keys the body is parsed once more instead; a repeat among many keys is still found."""
    import time

    from petal.pipeline.serve.encoding import duplicate_key, loads

    body = json.dumps({"input": "x", **{f"field{i}": 1 for i in range(50_000)}}).encode()
    started = time.monotonic()
    assert duplicate_key(body, loads(body)) is None
    assert time.monotonic() - started < 5, "quadratic in the keys"  # ~0.2 s; was ~30 s, 2 min on a busy host
    repeated = body[:-1] + b', "field7": 2}'
    assert duplicate_key(repeated, loads(repeated)) == "field7"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("request_nprobe", [None, 2])
def test_a_gpu_copy_left_short_of_k_probes_more_lists_as_faiss_does(vectors_index, device, request_nprobe):
    """k more than the probed lists hold (a 4000-vector IVF16 at nprobe 1 holds ~250 a list): the copy of the lists
    searches the queries left short again with more lists, as the FAISS reader does, and answers k hits equal to
    FAISS's (the copy's search took FAISS's search parameters there: a TypeError, so a 500 from petal serve)."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.serve.gpu_search import GpuReaders

    out, data = vectors_index
    reader = IndexReader(out, nprobe=1)
    readers = GpuReaders(device, "float32")
    readers.prepare(reader)
    copy = readers.get(reader, request_nprobe)
    assert copy is not None and type(copy.index).__name__ == "TorchIvfIndex"
    queries = data[:3] + 0.1 * np.random.default_rng(7).standard_normal((3, 48)).astype(np.float32)
    for k in (5, 900, 4000):
        got = copy.search(queries, k)
        with search_params(reader, request_nprobe, None):
            want = reader.search(queries, k)
        assert [len(hs) for hs in got] == [k] * 3 == [len(hs) for hs in want], k
        assert all(len({h.id for h in hs}) == k for hs in got)
        assert np.mean([a.id == b.id for hs, ws in zip(got, want) for a, b in zip(hs, ws)]) > 0.99
        np.testing.assert_allclose([h.score for hs in got for h in hs], [h.score for hs in want for h in hs],
                                   atol=1e-5)
