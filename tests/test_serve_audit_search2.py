"""``--search-device cuda``'s GPU copy (run here on the CPU through torch, and on CUDA when there is one) with
query rows beyond float16's range: a ``/search`` by ``vectors`` whose values pass 65504 (or whose products with
the stored vectors do) but whose float32 scores are finite, and rows so small that float16 holds them only as
subnormals or zeros. Each must rank as FAISS on the CPU ranks it; the float16 copy once cast the raw row to
float16 (inf, NaN or zeros), ranked arbitrary candidates and answered wrong hits or non-finite scores."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli

torch = pytest.importorskip("torch")
faiss = pytest.importorskip("faiss")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]
K = 10
# beyond float16: values past 65504 (1e5, 2**17), products past 65504 (6e4); below it: subnormal (1e-6), zero (1e-8)
SCALES = [1.0, 1e5, 2.0 ** 17, 6e4, 1e-6, 1e-8]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """The same unit vectors (``--vectors-column``: no model) in an IVF index, inner product and L2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("serve-half-range")
    rng = np.random.default_rng(5)
    data = rng.standard_normal((4000, 48)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    table = pa.table({"id": np.arange(len(data)),
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), 48)})
    pq.write_table(table, root / "vectors.parquet")
    out = {}
    for metric in ("ip", "l2"):
        out[metric] = root / metric
        result = CliRunner().invoke(cli, ["index", str(root / "vectors.parquet"), "--out", str(out[metric]), "-q",
                                          "--vectors-column", "emb", "--index-factory", "IVF16,Flat",
                                          "--metric", metric])
        assert result.exit_code == 0, result.output
    return out, data


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_query_rows_beyond_float16_rank_as_faiss_ranks_them(indexes, metric, exact, dtype, device):
    """Rows of every scale searched together through the search batcher (one batch: normal and extreme rows
    share each product): every answer is the true top k (float64) as FAISS finds it, with finite scores
    within float16 storage precision of the true ones; a row scaled by 2**17 answers exactly what the
    unscaled row answers, its scores times 2**17 (the float16 path scales rows by powers of two)."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.gpu_search import GpuReaders
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    paths, data = indexes
    reader = IndexReader(paths[metric], nprobe=16)  # every list probed: FAISS's IVF answer is the exhaustive one
    readers = GpuReaders(device, dtype, exact=exact)
    readers.prepare(reader)
    assert readers.get(reader) is not None
    index = SearchIndex(reader, None)  # type: ignore[arg-type]  # stored vectors: no model transform
    rng = np.random.default_rng(6)
    base = data[:4] + 0.3 * rng.standard_normal((4, 48)).astype(np.float32)
    requests = [(base * np.float32(scale)).astype(np.float32) for scale in SCALES]
    assert np.abs(requests[1]).max() > 65504 and np.abs(requests[-1]).max() < 6e-8  # float16: inf, zeros
    assert np.abs(requests[3]).max() < 65504 < (requests[3] @ data.T).max()  # float16 holds it, not its products
    batcher = SearchBatcher(SharedExclusiveLock(), readers)

    async def scenario():
        tasks = [batcher.search(index, rows, False, K) for rows in requests]
        batcher.start()  # everything queued first: one batch
        return await asyncio.gather(*tasks)

    try:
        answers = asyncio.run(scenario())
    finally:
        batcher.close()

    stored = data.astype(np.float64)  # IVF16,Flat stores the rows as they are
    for scale, rows, got in zip(SCALES, requests, answers):
        q = rows.astype(np.float64)
        true = q @ stored.T if metric == "ip" else ((q[:, None, :] - stored[None]) ** 2).sum(-1)
        want = reader.search(rows, K)  # FAISS on the CPU
        for r, (hits, faiss_hits) in enumerate(zip(got, want)):
            label = f"{metric} exact={exact} {dtype} scale={scale:g} row {r}"
            scores = np.array([h.score for h in hits])
            ids = np.array([h.id for h in hits])
            assert len(hits) == K and np.isfinite(scores).all(), label
            order = np.sort(true[r])[::-1] if metric == "ip" else np.sort(true[r])
            magnitude = np.abs(order[:K]).max()
            # the true top k: the true scores of the hits are those of the best k (FAISS's own float32
            # rounding is the slack: at 1e5 an L2 distance is ~1e10, rounded to ~1e3)
            hit_true = np.sort(true[r][ids])[::-1] if metric == "ip" else np.sort(true[r][ids])
            np.testing.assert_allclose(hit_true, order[:K], rtol=0, atol=1e-6 * magnitude, err_msg=label)
            faiss_scores = np.array([h.score for h in faiss_hits])
            np.testing.assert_allclose(scores, faiss_scores, rtol=0,
                                       atol=(2e-3 if dtype == "float16" else 1e-5) * magnitude, err_msg=label)
            if metric == "ip":  # FAISS's ids too (L2 at 1e5: FAISS's own rounding may swap near-ties)
                assert ids[0] == faiss_hits[0].id, label
                assert np.mean(ids == [h.id for h in faiss_hits]) >= 0.9, label
    normal, twice17 = answers[0], answers[SCALES.index(2.0 ** 17)]
    if metric == "l2":
        # NOTE: at 2**17 an L2 distance is ~1e10, rounded to ~1e3 in float32: hits whose distances differ by less
        # tie there, and ties come in ascending id; the same hits, and the unscaled row's order is one the scaled
        # distances agree with (equal where they swapped)
        for scaled_hits, hits in zip(twice17, normal):
            scaled = {h.id: h.score for h in scaled_hits}
            assert sorted(scaled) == sorted(h.id for h in hits)
            in_unscaled_order = [scaled[h.id] for h in hits]
            assert in_unscaled_order == sorted(in_unscaled_order), (in_unscaled_order, [h.score for h in scaled_hits])
    else:
        assert [[h.id for h in hs] for hs in twice17] == [[h.id for h in hs] for hs in normal]
    if metric == "ip":  # exact: a power of two through float16 and float32 alike
        assert [[h.score for h in hs] for hs in twice17] == [[h.score * 2.0 ** 17 for h in hs] for hs in normal]
