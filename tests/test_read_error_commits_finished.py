"""A shard whose rows turn out unreadable mid-run (footer and schema fine: bytes zeroed inside a column chunk, 65
'Corrupt snappy compressed data'; or an I/O error that outlasts the retries, 74) ends the run with its code naming
the file and nothing published, as before; but the shards read whole before it are embedded and committed, as a
stop signal leaves them (RELIABILITY.md 3, 10), and the report counts them. Before: shard a (every row read) was
dropped with the run ('0 embedded'), so a rerun without the bad shard embedded it again.

Real ``petal`` processes, real Parquet, the packaged model; in this process and in a worker (``--workers 1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests.conftest import REPO


def petal(*argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env={**os.environ, **(env or {})})


def zero_column_chunk(path: Path) -> None:
    """80 rows in four row groups; 16 bytes zeroed in the middle of the second's text column chunk (its dictionary
    page): the footer and schema read, rows 20-39 do not ('Corrupt snappy compressed data')."""
    pq.write_table(pa.table({"id": list(range(100, 180)), "text": [f"text {i} " * 8 for i in range(80)]}), path,
                   row_group_size=20)  # pyarrow's defaults: dictionary pages, snappy
    chunk = pq.read_metadata(path).row_group(1).column(1)
    middle = (chunk.dictionary_page_offset + chunk.data_page_offset) // 2
    data = bytearray(path.read_bytes())
    data[middle:middle + 16] = bytes(16)
    path.write_bytes(bytes(data))


CASES = [  # (name, how b is spoiled, environment, exit code, message)
    ("corrupt column chunk", zero_column_chunk, {}, 65, "Corrupt snappy compressed data"),
    ("I/O error", lambda p: pq.write_table(pa.table({"id": [7, 8], "text": ["x", "y"]}), p),
     {"PETAL_FAULT": "read_batch:2+:eio"}, 74, "b.parquet"),
]


@pytest.mark.parametrize("scale", [[], ["--workers", "1"]], ids=["in-process", "worker"])
@pytest.mark.parametrize("spoil, env, code, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_shards_read_before_a_read_error_are_committed(tmp_path, minilm_dir, scale, spoil, env, code, message):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": list(range(50)), "text": [f"good text number {i}" for i in range(50)]}),
                   data / "a.parquet")
    spoil(data / "b.parquet")
    out, report_file = tmp_path / "out", tmp_path / "r.json"
    flags = ["--out", out, "--model", minilm_dir, "-q", "--json-report", report_file, *scale]

    failed = petal("index", data, *flags, env=env)
    assert failed.returncode == code, failed.stderr
    assert message in failed.stderr and "b.parquet" in failed.stderr and "Traceback" not in failed.stderr
    report = json.loads(report_file.read_text())
    assert report["exit_code"] == code and "b.parquet" in report["message"]
    assert report["shards"]["embedded"] == 1 and report["rows"]["embedded"] == 50, report  # a, committed
    assert OutputDir(out).current_version() is None  # nothing published

    (data / "b.parquet").unlink()
    rerun = petal("index", data, *flags)
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(report_file.read_text())
    assert report["shards"] == {"total": 1, "embedded": 0, "reused": 1}, report
    assert report["rows"]["embedded"] == 0 and report["rows"]["reused"] == 50
