"""Values of a shard's other columns as ``/search`` answers them with ``include: ["metadata"]``, and of
``--keep-columns`` on every hit (``fields``, in ``/search`` and ``petal query``): a string column holding bytes that
are not UTF-8 (pyarrow validates none: ``petal index`` stored a kept one as it was, and never reads the others) is
text with U+FFFD, not a 500 with a traceback in the log (metadata), nor a 422 or ``petal query`` exit 2 quoting
'utf-8' codec can't decode (every search hitting such a kept value); a timestamp beyond Python's datetime (year
10000 on: an OverflowError traceback) is Arrow's text of it; a NaN or infinite float is ``null`` in valid
JSON, with or without orjson (the standard library wrote ``NaN``, which no strict JSON reader takes).

Real components: ``petal index --vectors-column`` over real Parquet (no model: the server is ready in a second),
``petal serve`` in a child process on a loopback port."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_serve import Server, cli_run

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 8


def _strict_json(body: bytes) -> object:
    """``body`` read as RFC 8259 JSON (Python's reader takes NaN and Infinity; this one does not)."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(body, parse_constant=refuse)


def test_metadata_not_utf8_or_not_finite_is_answered_as_json(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    vectors = np.random.default_rng(0).standard_normal((6, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    notes = pa.array([b"fine", b"caf\xe9", b"ok", b"\xff\xfe", b"ok", b"ok"], pa.binary())
    pq.write_table(pa.table({
        "doc": np.arange(6), "body": [f"document {i}" for i in range(6)],
        "note": notes.view(pa.string()),  # NOTE: pyarrow writes what it is given: Latin-1 bytes in a string column
        "tag": notes.view(pa.string()).dictionary_encode(),
        "ratio": [0.5, float("nan"), float("inf"), 1.0, float("-inf"), 2.0],
        "until": pa.array([0, 0, 2**63 - 1, 0, 0, 0], pa.timestamp("us")),  # row 2: beyond Python's datetime
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}), data / "a.parquet")
    out = tmp_path / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "vec", "--id-column", "doc", "--text-column",
            "body", "--index-factory", "Flat", "--keep-columns", "note,until")
    server = Server(tmp_path / "server.log", out)
    try:
        answer = server.client.post("/search", json={"vectors": vectors.tolist(), "k": 1, "include": ["metadata"]})
        assert answer.status_code == 200, answer.text
        hits = {result["hits"][0]["id"]: result["hits"][0] for result in _strict_json(answer.content)["results"]}
        metadata = {i: hit["metadata"] for i, hit in hits.items()}
        assert [hits[i]["fields"]["note"] for i in range(6)] == ["fine", "caf\ufffd", "ok", "\ufffd\ufffd", "ok", "ok"]
        epoch = "1970-01-01 00:00:00"
        assert metadata[0] == {"doc": 0, "note": "fine", "tag": "fine", "ratio": 0.5, "until": epoch}
        assert metadata[1] == {"doc": 1, "note": "caf\ufffd", "tag": "caf\ufffd", "ratio": None, "until": epoch}
        assert str(2**63 - 1) in metadata[2]["until"] and str(2**63 - 1) in hits[2]["fields"]["until"]
        assert metadata[2]["ratio"] is None and metadata[4]["ratio"] is None
        assert metadata[3]["note"] == "\ufffd\ufffd"
        assert "Traceback" not in server.log.read_text(errors="replace")
    finally:
        server.stop()
    np.save(tmp_path / "q.npy", vectors[1:2])
    found = cli_run("query", out, "--vector-file", tmp_path / "q.npy", "-k", "1", "--json")
    assert json.loads(found.stdout)["hits"][0]["fields"] == {"note": "caf\ufffd", "until": "1970-01-01 00:00:00"}
    np.save(tmp_path / "q.npy", vectors[2:3])  # a date beyond Python's: Arrow's text of it, not a traceback
    found = cli_run("query", out, "--vector-file", tmp_path / "q.npy", "-k", "1", "--json")
    assert str(2**63 - 1) in json.loads(found.stdout)["hits"][0]["fields"]["until"]


@pytest.mark.parametrize("body", [
    {"ratio": float("nan"), "rows": [float("inf"), -float("inf"), 1.5], "n": np.float32("nan")},
    {"ratio": float("nan"), "big": 2**70},  # orjson refuses the integer: the standard library writes it all
], ids=["floats", "with-an-integer-orjson-refuses"])
@pytest.mark.parametrize("use_orjson", [True, False])
def test_non_finite_floats_are_null_whichever_encoder_writes_them(body, use_orjson):
    from petal.pipeline.serve.encoding import dumps

    written = _strict_json(dumps(body, use_orjson=use_orjson))
    assert isinstance(written, dict)
    assert written["ratio"] is None
    if "rows" in body:
        assert written["rows"] == [None, None, 1.5] and written["n"] is None
    else:
        assert written["big"] == 2**70
