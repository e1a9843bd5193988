"""Kept columns of nanosecond types shown with their nanoseconds, as ``--where`` matches them.

Before: a ``time64[ns]`` kept column went through pyarrow's ``to_pylist`` (``datetime.time``: microseconds only):
``petal query --json`` showed 12:34:56.123456789 as "12:34:56.123456" and 1 ns as "00:00:00", while ``--where
"t = '00:00:00.000000001'"`` matched that row; nested in a list or struct alike. Without pandas, a ``timestamp[ns]``
or ``duration[ns]`` finer than a microsecond (and any ``time64[ns]`` one) was a ValueError traceback. Real Parquet,
a real index of precomputed vectors, the CLI; the no-pandas reading in a process that cannot import pandas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.fake_cli import invoke

NS = [12 * 3600 * 10**9 + 34 * 60 * 10**9 + 56 * 10**9 + 123456789, 1, 45296 * 10**9]
SHOWN = ["12:34:56.123456789", "00:00:00.000000001", "12:34:56"]


def build(tmp_path: Path) -> Path:
    vectors = np.eye(3, 8, dtype=np.float32)
    pq.write_table(pa.table({
        "id": ["d0", "d1", "d2"],
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8),
        "t": pa.array(NS, pa.time64("ns")),
        "tl": pa.array([[v] for v in NS], pa.list_(pa.time64("ns"))),
        "ts": pa.array([{"t": v} for v in NS], pa.struct([("t", pa.time64("ns"))])),
        "d": pa.array(NS, pa.duration("ns")),
        "at": pa.array(NS, pa.timestamp("ns")),
    }), tmp_path / "a.parquet")
    np.save(tmp_path / "q.npy", vectors)
    built = invoke(["index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "--vectors-column", "emb",
                    "--keep-columns", "t,tl,ts,d,at", "-q"])
    assert built.exit_code == 0, built.output
    return tmp_path / "out"


def test_kept_time64_ns_shows_its_nanoseconds_as_where_matches_them(tmp_path):
    out = build(tmp_path)
    answer = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "1", "--json"])
    assert answer.exit_code == 0, answer.output
    fields = [json.loads(line)["hits"][0]["fields"] for line in answer.stdout.splitlines()]
    assert [f["t"] for f in fields] == SHOWN
    assert [f["tl"] for f in fields] == [[s] for s in SHOWN] and [f["ts"] for f in fields] == [{"t": s} for s in SHOWN]
    assert [f["d"] for f in fields] == ["PT12H34M56.123456789S",
                                        "PT0.000000001S", "PT12H34M56S"]
    assert [f["at"] for f in fields] == ["1970-01-01 12:34:56.123456789", "1970-01-01 00:00:00.000000001",
                                         "1970-01-01 12:34:56"]
    where = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "3", "--json",
                    "--where", "t = '00:00:00.000000001'"])
    assert where.exit_code == 0, where.output
    hits = [h for line in where.stdout.splitlines() for h in json.loads(line)["hits"]]
    assert {h["id"] for h in hits} == {"d1"} and {h["fields"]["t"] for h in hits} == {"00:00:00.000000001"}
    text = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "1"])
    assert text.exit_code == 0 and "t=00:00:00.000000001 " in text.stdout, text.stdout


NO_PANDAS = """
import json, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("no pandas here")
sys.meta_path.insert(0, Block())
import petal
from petal.pipeline.serve.encoding import dumps
hits = petal.open_index(sys.argv[1]).search_stored([[1.0] + [0.0] * 7, [0.0, 1.0] + [0.0] * 6], k=1)
assert "pandas" not in sys.modules
print(dumps([hits[0][0].fields, hits[1][0].fields], use_orjson=False).decode())
"""


def test_nanosecond_values_without_pandas_keep_their_nanoseconds(tmp_path):
    out = build(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                      os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", NO_PANDAS, str(out)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = json.loads(done.stdout)
    assert first == {"t": SHOWN[0], "tl": [SHOWN[0]], "ts": {"t": SHOWN[0]}, "d": "PT12H34M56.123456789S",
                     "at": "1970-01-01 12:34:56.123456789"}
    assert second["t"] == SHOWN[1] and second["d"] == "PT0.000000001S"
    assert second["at"] == "1970-01-01 00:00:00.000000001"


def test_a_list_view_of_time64_ns_keeps_its_nanoseconds(tmp_path):
    """Before: a list_view or large_list_view of time64[ns] showed 1 ns as "00:00:00" (its cells were not shadowed)."""
    vectors = np.eye(2, 8, dtype=np.float32)
    pq.write_table(pa.table({
        "id": ["d0", "d1"],
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8),
        "lv": pa.array([[1], [NS[0], None]], pa.list_view(pa.time64("ns"))),
        "llv": pa.array([[1], None], pa.large_list_view(pa.time64("ns"))),
        "slv": pa.array([{"l": [1]}, {"l": []}], pa.struct([("l", pa.list_view(pa.time64("ns")))])),
    }), tmp_path / "a.parquet")
    np.save(tmp_path / "q.npy", vectors)
    built = invoke(["index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "--vectors-column", "emb",
                    "--keep-columns", "lv,llv,slv", "-q"])
    assert built.exit_code == 0, built.output
    answer = invoke(["query", str(tmp_path / "out"), "--vector-file", str(tmp_path / "q.npy"), "-k", "1", "--json"])
    assert answer.exit_code == 0, answer.output
    fields = [json.loads(line)["hits"][0]["fields"] for line in answer.stdout.splitlines()]
    one = ["00:00:00.000000001"]
    assert fields == [{"lv": one, "llv": one, "slv": {"l": one}},
                      {"lv": [SHOWN[0], None], "llv": None, "slv": {"l": []}}]
