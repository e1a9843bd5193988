"""``/search`` with ``include: ["metadata"]`` reads from a hit's shard only the columns the metadata returns (and the
id column, to check the row still holds the hit's id), in the row group holding the hit. Before, it read the row
group with every column, the ``--vectors-column`` list column and the text column that the metadata leaves out
included: one k=5 request on a vectors-only index of 300k x 384 in one row group raised the server's memory by about
1.5 GB.

Measured with Arrow's own accounting, not the process's memory: a fresh proxy memory pool is made the default for
the request, and its peak (``max_memory``) is what the server's Arrow reads allocated at once.

Real components: ``petal index --vectors-column`` over real Parquet, real FAISS, ``petal serve``'s app on uvicorn in
a thread of this process (so that its Arrow allocations are this process's), on a loopback port."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests._serve_shared import served_in_process
from tests.test_serve import cli_run

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROWS = 4000
DIM = 384  # 4000 x 384 float32: a vectors column of 6 MB, in one row group
TEXT_BYTES = 400  # a text column of 1.6 MB, which metadata leaves out too


def _vectors(rows: int) -> np.ndarray:
    data = np.random.default_rng(7).standard_normal((rows, DIM)).astype(np.float32)
    return data / np.linalg.norm(data, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A vectors-only index of one shard (one row group: vectors, a text column, two small metadata columns), served
    in this process; yields (base url, the shard's vectors, its rows without the vectors)."""
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.service import ServeState
    from petal.pipeline.serve.settings import ServeSettings

    root = tmp_path_factory.mktemp("metadata_read")
    data = root / "data"
    data.mkdir()
    vectors = _vectors(ROWS)
    ids = np.arange(ROWS)
    table = pa.table({"doc": ids, "lang": ["en" if i % 2 else "fr" for i in ids],
                      "body": [f"{i:08d}" + "x" * (TEXT_BYTES - 8) for i in ids],
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)})
    pq.write_table(table, data / "a.parquet", row_group_size=ROWS, compression="none")
    assert pq.ParquetFile(data / "a.parquet").num_row_groups == 1
    out = root / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--id-column", "doc", "--text-column",
            "body", "--index-factory", "Flat")
    index = SearchIndex.open(out, None)
    settings = ServeSettings(reload_interval_s=60.0)
    state = ServeState(None, settings, index_root=out, index=index)
    with served_in_process(state) as url:
        rows = {r["doc"]: r for r in table.drop_columns(["emb"]).to_pylist()}
        yield url, vectors, rows


@pytest.fixture
def arrow_pool():
    """A fresh proxy of Arrow's default memory pool, made the default while the test runs: its ``max_memory`` is the
    peak of what Arrow allocated in the meantime (this process's Parquet reads, the server's included)."""
    previous = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(previous)
    pa.set_memory_pool(pool)
    try:
        yield pool
    finally:
        pa.set_memory_pool(previous)


@pytest.mark.parametrize("include", [["metadata"], ["text", "metadata"]])
def test_metadata_reads_only_the_columns_it_returns(server, arrow_pool, include):
    url, vectors, rows = server
    warm = httpx.post(f"{url}/search", json={"vectors": vectors[[1]].tolist(), "k": 5}, timeout=60)
    assert warm.status_code == 200, warm.text  # the index's own lazy reads (ids) before the measured request
    answer = httpx.post(f"{url}/search", json={"vectors": vectors[[3, 2500]].tolist(), "k": 5, "include": include},
                        timeout=60)
    assert answer.status_code == 200, answer.text
    hits = [hit for result in answer.json()["results"] for hit in result["hits"]]
    assert len(hits) == 10
    assert {hits[0]["id"], hits[5]["id"]} == {3, 2500}
    for hit in hits:  # the documented metadata, unchanged: the row's other columns, not the text nor the vectors
        row = rows[hit["id"]]
        assert hit["metadata"] == {"doc": row["doc"], "lang": row["lang"]}
        if "text" in include:
            assert hit["text"] == row["body"]
        else:
            assert "text" not in hit
    peak = arrow_pool.max_memory()
    vectors_bytes = ROWS * DIM * 4
    # the columns returned (and the id) of the one row group: 4000 int64 + 4000 short strings, under 100 kB;
    # the text column, read for "text" from an index that stores it, is not read from the shard at all.
    # Before: the row group with every column decoded at once, 6 MB of vectors and 1.6 MB of text at least.
    assert peak < vectors_bytes // 8, f"Arrow allocated up to {peak} bytes for {include}: the whole row group"


def test_a_dotted_name_beside_a_struct_reads_the_fields_asked(tmp_path):
    """pyarrow selects columns by name, ``a.b`` matching a struct ``a``'s child as well as a top-level ``a.b``: the
    fields read are still the ones asked, by position (the row group read whole where the names mislead)."""
    from petal.pipeline.index.search import _read_fields

    pq.write_table(pa.table({"a": pa.array([{"b": 1, "c": 2}]), "a.b": ["x"], "emb": pa.array([[1.0, 2.0]]),
                             "d": [5]}), tmp_path / "s.parquet")
    pf = pq.ParquetFile(tmp_path / "s.parquet")
    assert _read_fields(pf, 0, [1, 3]).to_pylist() == [{"a.b": "x", "d": 5}]
    assert _read_fields(pf, 0, [0, 1, 3]).to_pylist() == [{"a": {"b": 1, "c": 2}, "a.b": "x", "d": 5}]
    assert _read_fields(pf, 0, [0, 3]).to_pylist() == [{"a": {"b": 1, "c": 2}, "d": 5}]
    assert _read_fields(pf, 0, []).num_rows == 1
