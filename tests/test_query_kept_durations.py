"""A ``--keep-columns`` duration column in ``petal query``'s answers (text and ``--json``). Real Parquet, a real
index of precomputed vectors, real processes."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DURATIONS = {"us": [dt.timedelta(days=1), dt.timedelta(seconds=-5), dt.timedelta(microseconds=1500),
                    dt.timedelta(minutes=1, seconds=30)],
             "s": [dt.timedelta(days=11, hours=13, minutes=46, seconds=40), dt.timedelta(0), dt.timedelta(hours=-25),
                   dt.timedelta(seconds=3)]}
ISO = {"us": ["P1D", "-PT5S", "PT0.0015S", "PT1M30S"], "s": ["P11DT13H46M40S", "PT0S", "-P1DT1H", "PT3S"]}


def petal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], capture_output=True, text=True, timeout=120)


def test_kept_durations_read_as_iso_8601_not_pythons_timedelta_text(tmp_path: Path) -> None:
    """A duration was shown as Python's str(timedelta): '1 day, 0:00:00', and -5 s as '-1 day, 23:59:55', in the
    text answer and in --json alike; now ISO 8601 (P1D, -PT5S, PT0.0015S), which reads well and parses."""
    vectors = np.eye(4, 8, dtype=np.float32)
    pq.write_table(pa.table({"id": ["d0", "d1", "d2", "d3"],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8),
                             "du": pa.array(DURATIONS["us"], pa.duration("us")),
                             "ds": pa.array(DURATIONS["s"], pa.duration("s"))}), tmp_path / "a.parquet")
    np.save(tmp_path / "q.npy", vectors)
    built = petal("index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "--vectors-column", "emb",
                  "--keep-columns", "du,ds", "-q")
    assert built.returncode == 0, built.stderr
    answer = petal("query", str(tmp_path / "out"), "--vector-file", str(tmp_path / "q.npy"), "-k", "1", "--json")
    assert answer.returncode == 0, answer.stderr
    fields = [json.loads(line)["hits"][0]["fields"] for line in answer.stdout.splitlines()]
    assert fields == [{"du": du, "ds": ds} for du, ds in zip(ISO["us"], ISO["s"])], fields
    text = petal("query", str(tmp_path / "out"), "--vector-file", str(tmp_path / "q.npy"), "-k", "1")
    assert text.returncode == 0 and "day" not in text.stdout, text.stdout
    for du, ds in zip(ISO["us"], ISO["s"]):
        assert f"du={du} ds={ds}" in text.stdout, text.stdout


def test_petal_serve_writes_durations_as_petal_query_does(tmp_path: Path) -> None:
    """``petal serve``'s /search wrote a kept (``fields``) or stored (``include: ["metadata"]``) duration as Python's
    str(timedelta), '-1 day, 23:59:55' for -5 s, where ``petal query --json`` writes ISO 8601; now the same. Both of
    the server's JSON writers (orjson, and the standard library's, which it falls back to) are checked."""
    import pytest

    pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from petal.pipeline.serve.encoding import dumps
    from tests.test_serve import Server  # a real `petal serve` child process

    vectors = np.eye(4, 8, dtype=np.float32)
    pq.write_table(pa.table({"id": ["d0", "d1", "d2", "d3"],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8),
                             "du": pa.array(DURATIONS["us"], pa.duration("us")),
                             "ds": pa.array(DURATIONS["s"], pa.duration("s"))}), tmp_path / "a.parquet")
    built = petal("index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "--vectors-column", "emb",
                  "--keep-columns", "du", "-q")
    assert built.returncode == 0, built.stderr
    server = Server(tmp_path / "server.log", tmp_path / "out")
    try:
        answer = server.client.post("/search", json={"vectors": vectors.tolist(), "k": 1, "include": ["metadata"]})
        assert answer.status_code == 200, answer.text
        hits = [result["hits"][0] for result in answer.json()["results"]]
    finally:
        server.stop()
    assert [hit["fields"] for hit in hits] == [{"du": du} for du in ISO["us"]], hits
    assert [(hit["metadata"]["du"], hit["metadata"]["ds"]) for hit in hits] == list(zip(ISO["us"], ISO["s"])), hits
    for use_orjson in (True, False):
        assert json.loads(dumps({"d": DURATIONS["s"]}, use_orjson=use_orjson)) == {"d": ISO["s"]}
