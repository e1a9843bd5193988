"""A ``--vectors-column`` vector whose values are finite but whose squared norm float32 cannot hold (beyond 3.4e38:
a norm beyond 1.8e19) is a counted ``vector_too_large`` row, under ``--metric l2`` and ``ip`` alike, float or integer
values. Before, it was stored: every query that met it was refused as 'too large for the index's vectors; scale it
down' (65), a unit-length one too, while ``petal verify`` said ok; an IVF index under l2 aborted the process in FAISS's
training ('invalid cluster assignment').

An index built before (the row stored) is answered with a message that names the stored vector, not the query: the
same exit code (65), ``ScoresOverflowError`` from the Python API and 422 from ``petal serve``, saying to run
``petal index --full`` again, which skips the row.

Real Parquet, real FAISS, ``petal query`` and ``petal serve`` in their own processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from petal.pipeline.ingest import vectors as vector_ingest
from tests import forkrun

DIM = 8
ROWS = 40
LARGE = 3  # the row of the vector too large
FLOAT_LIST = pa.list_(pa.float32())


def _shard(path: Path, large: list, arrow_type: pa.DataType = FLOAT_LIST) -> np.ndarray:
    """``ROWS`` unit vectors (``large`` at row ``LARGE``; integers: rounded, times 10) as ``arrow_type``."""
    unit = np.random.default_rng(0).standard_normal((ROWS, DIM))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    rows = [list(map(int, np.rint(v * 10))) if pa.types.is_integer(arrow_type.value_type) else list(map(float, v))
            for v in unit]
    rows[LARGE] = large
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(ROWS)], "emb": pa.array(rows, arrow_type)}), path)
    return unit.astype(np.float32)


def _index(source: Path, out: Path, *flags: str) -> tuple[int, str, dict]:
    result = CliRunner().invoke(cli, ["index", str(source), "--out", str(out), "--vectors-column", "emb", "-q",
                                      "--json", *flags])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stderr, json.loads(result.stdout) if result.stdout.strip() else {}


def _query(out: Path, query: np.ndarray, tmp: Path, *flags: str) -> forkrun.Result:
    np.save(tmp / "q.npy", query.astype(np.float32))
    return forkrun.petal(["query", str(out), "--vector-file", str(tmp / "q.npy"), "--json", *flags])


@pytest.mark.parametrize(("metric", "large", "arrow_type"), [
    ("l2", [1e20] * DIM, pa.list_(pa.float32())),
    ("ip", [3e38, 3e38] + [0.0] * (DIM - 2), pa.list_(pa.float32())),  # a norm beyond float32 itself
    ("ip", [1.9e19] + [0.0] * (DIM - 1), pa.list_(pa.float32(), DIM)),  # squared 3.6e38: just past the bound
    ("l2", [1e30] + [0.0] * (DIM - 1), pa.large_list(pa.float64())),
    ("ip", [9_000_000_000_000_000_000] * DIM, pa.list_(pa.int64())),  # int64 values: 6.5e38 squared
], ids=["l2-1e20", "ip-3e38", "ip-fixed-1.9e19", "l2-float64", "ip-int64"])
def test_a_vector_too_large_to_score_is_a_counted_row(tmp_path: Path, metric: str, large: list,
                                                      arrow_type: pa.DataType) -> None:
    unit = _shard(tmp_path / "a.parquet", large, arrow_type)
    rc, stderr, report = _index(tmp_path / "a.parquet", tmp_path / "out", "--metric", metric)
    assert rc == 0, stderr
    assert report["rows"]["skipped"] == {"vector_too_large": 1} and report["index"]["num_vectors"] == ROWS - 1
    version = tmp_path / "out" / "versions" / (tmp_path / "out" / "CURRENT").read_text().strip()
    assert pq.read_table(version / "rejects.parquet").to_pylist() == [
        {"shard": str(tmp_path / "a.parquet"), "row": LARGE, "reason": "vector_too_large"}]
    if pa.types.is_floating(arrow_type.value_type):  # every query of unit length is answered
        done = _query(tmp_path / "out", unit[:3], tmp_path, "-k", str(ROWS))
        assert done.rc == 0, done.stderr
        assert [json.loads(line)["hits"][0]["id"] for line in done.stdout.splitlines()] == ["r0", "r1", "r2"]

    rc, stderr, _ = _index(tmp_path / "a.parquet", tmp_path / "strict", "--metric", metric, "--strict")
    assert rc == 65 and "1 bad rows with --strict: vector_too_large 1;" in stderr, stderr
    rc, stderr, _ = _index(tmp_path / "a.parquet", tmp_path / "budget", "--metric", metric, "--max-bad-rows", "0")
    assert rc == 65 and "vector_too_large 1" in stderr, stderr


def test_the_bound_is_the_squared_norm_float32_holds(tmp_path: Path) -> None:
    """1.8e19 (squared 3.24e38) is kept, and a unit query scores it finitely under both metrics."""
    _shard(tmp_path / "a.parquet", [1.8e19] + [0.0] * (DIM - 1))
    query = np.eye(DIM, dtype=np.float32)[:1]
    for metric in ("ip", "l2"):
        rc, stderr, report = _index(tmp_path / "a.parquet", tmp_path / metric, "--metric", metric)
        assert rc == 0 and report["rows"]["skipped"] == {}, (stderr, report.get("rows"))
        done = _query(tmp_path / metric, query, tmp_path, "-k", str(ROWS))
        assert done.rc == 0, done.stderr
        scores = [hit["score"] for hit in json.loads(done.stdout)["hits"]]
        assert len(scores) == ROWS and np.isfinite(scores).all(), scores


def test_ivf_under_l2_skips_it_instead_of_aborting(tmp_path: Path) -> None:
    """IVF training under l2 on such a vector aborted the process (SIGABRT, FAISS's 'invalid cluster assignment')."""
    data = np.random.default_rng(1).standard_normal((300, DIM)).astype(np.float32)
    data[7] = 1e20
    emb = pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), DIM)
    pq.write_table(pa.table({"id": np.arange(300), "emb": emb}), tmp_path / "a.parquet")
    done = forkrun.petal(["index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "-q",
                          "--vectors-column", "emb", "--metric", "l2", "--index-factory", "IVF4,Flat",
                          "--json-report", str(tmp_path / "r.json")])
    assert done.rc == 0, (done.rc, done.stderr[-2000:])
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rows"]["skipped"] == {"vector_too_large": 1} and report["index"]["num_vectors"] == 299


@pytest.fixture
def built_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, np.ndarray]:
    """An index holding a vector too large to score, as ``petal index`` built one before it skipped such rows: the
    bound turned off for the build (NOTE: raising=False: before the fix there is no bound to turn off)."""
    unit = _shard(tmp_path / "a.parquet", [1e20] * DIM)
    with monkeypatch.context() as patch:
        patch.setattr(vector_ingest, "squared_norm_overflows", lambda rows: np.zeros(len(rows), bool), raising=False)
        rc, stderr, report = _index(tmp_path / "a.parquet", tmp_path / "out", "--metric", "l2")
    assert rc == 0 and report["index"]["num_vectors"] == ROWS, stderr
    return tmp_path / "out", unit


def _names_the_stored_vector(message: str) -> None:
    assert 'hit "r3" is beyond float32 because that stored vector is too large, not the query' in message, message
    assert f"vector {LARGE} of " in message and "index.faiss has a squared norm of 8e+40" in message, message
    assert "run petal index --full again" in message and "scale it down" not in message, message


def test_an_index_built_before_names_the_stored_vector_not_the_query(built_before: tuple[Path, np.ndarray],
                                                                     tmp_path: Path) -> None:
    out, unit = built_before
    done = _query(out, unit[:2], tmp_path, "-k", str(ROWS))  # every vector: the one too large among them
    assert done.rc == 65 and not done.stdout, (done.rc, done.stdout, done.stderr)
    assert done.last_line.startswith(f"petal: error: --vector-file {tmp_path / 'q.npy'}: row 0: "), done.last_line
    _names_the_stored_vector(done.last_line)
    assert _query(out, unit[:2], tmp_path).rc == 0  # the vector out of the top k: answered

    with petal.open_index(out) as index, pytest.raises(petal.UsageError) as caught:
        index.search_stored(unit[1:3], k=ROWS)
    assert type(caught.value).__name__ == "ScoresOverflowError" and caught.value.row == 0
    _names_the_stored_vector(str(caught.value))

    # a query too large itself is still the query's: 'scale it down'
    with petal.open_index(out) as index, pytest.raises(petal.UsageError, match="scale it down"):
        index.search_stored(np.full((1, DIM), 1e19, np.float32))

    rc, stderr, report = _index(tmp_path / "a.parquet", out, "--metric", "l2", "--full")  # what the message says
    assert rc == 0 and report["rows"]["skipped"] == {"vector_too_large": 1}, (stderr, report.get("rows"))
    assert _query(out, unit[:2], tmp_path, "-k", str(ROWS)).rc == 0


def test_serve_names_the_stored_vector_in_its_422(built_before: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.test_serve import Server

    out, unit = built_before
    server = Server(tmp_path / "serve.log", str(out))
    try:
        raw = server.client.post("/search", json={"vectors": unit[:2].tolist(), "k": ROWS})
        assert raw.status_code == 422, raw.text
        message = raw.json()["error"]["message"]
        assert message.startswith("'vectors' row 0: "), message
        _names_the_stored_vector(message)
        assert "scale the row down" not in message, message
        fine = server.client.post("/search", json={"vectors": unit[:2].tolist(), "k": 2})
        assert fine.status_code == 200, fine.text
    finally:
        server.stop()
