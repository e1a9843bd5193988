"""A ``--vectors-column`` float64 value beyond float32 is a rejected row, counted, with no numpy warning on stderr.
Before, the cast printed "RuntimeWarning: overflow encountered in cast" with petal's own source line. A real
``petal index`` process, real Parquet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PETAL = str(Path(sys.executable).parent / "petal")


def test_a_value_beyond_float32_is_a_counted_reject_without_a_warning(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [[1e300, 0.0], [0.0, 1.0], [-1e39, 1.0], [1.0, 1.0]]
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "emb": pa.array(rows, pa.list_(pa.float64()))}),
                   data / "a.parquet")
    done = subprocess.run([PETAL, "index", str(data), "--out", str(tmp_path / "out"), "--vectors-column", "emb",
                           "--max-bad-rows", "2", "-q", "--json-report", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "overflow" not in done.stderr, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rows"]["embedded"] == 2 and report["rows"]["skipped"] == {"non_finite_vector": 2}, report["rows"]
