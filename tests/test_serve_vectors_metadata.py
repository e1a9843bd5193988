"""``/search`` with ``include: ["metadata"]`` on an index of precomputed vectors (``petal index --vectors-column``):
the metadata is the row's other columns, never the vectors column the index was built from (it was returned, every
float of it, as if it described the document).

Real components: ``petal index --vectors-column`` over real Parquet, ``petal serve`` in a child process on a loopback
port, and the shard rows read back with pyarrow as the reference."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_serve import Server, cli_run

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 8


def _shard(path, start: int, rows: int, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    ids = np.arange(start, start + rows)
    pq.write_table(pa.table({"doc": ids, "lang": ["en" if i % 2 else "fr" for i in ids],
                             "body": [f"document {i}" for i in ids], "year": [2000 + i % 7 for i in ids],
                             "vec": pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), DIM)}), path)
    return data


def test_metadata_of_an_index_of_vectors_holds_no_vectors_column(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    vectors = np.concatenate([_shard(data / "a.parquet", 0, 40, 1), _shard(data / "b.parquet", 40, 40, 2)])
    out = tmp_path / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "vec", "--id-column", "doc", "--text-column",
            "body", "--keep-columns", "lang", "--index-factory", "Flat")
    rows = {r["doc"]: r for shard in ("a", "b") for r in pq.read_table(data / f"{shard}.parquet").to_pylist()}
    server = Server(tmp_path / "server.log", out)
    try:
        for include in (["metadata"], ["text", "metadata"]):
            answer = server.client.post("/search", json={"vectors": vectors[[3, 50]].tolist(), "k": 3,
                                                         "include": include})
            assert answer.status_code == 200, answer.text
            for result in answer.json()["results"]:
                for hit in result["hits"]:
                    row = rows[hit["id"]]
                    assert "vec" not in hit["metadata"], hit["metadata"]
                    # every other column of the row, the text excepted (its own field)
                    assert hit["metadata"] == {k: v for k, v in row.items() if k not in ("vec", "body")}
                    assert hit["fields"] == {"lang": row["lang"]}
                    if "text" in include:
                        assert hit["text"] == row["body"]
                    else:
                        assert "text" not in hit
    finally:
        server.stop()
