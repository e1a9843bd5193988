"""A ``--vectors-column`` run with shards kept from the live version (additive) that failed while storing a named
shard (disk full, a bad row under ``--strict``, a stop signal) said '2 shards (0 embedded, -1 reused, 1 kept)' on its
last line and ``reused: 0`` in ``--json-report``: the kept shards were counted as reused only after every named shard
was stored, while the line subtracts them from the reused as soon as they are listed. They are now counted where they
are listed, as the text runs count them. Real Parquet, real FAISS, the CLI in a subprocess, a disk-full fault point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.index_data import vector_shard


def test_a_failed_additive_run_counts_its_kept_shards(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    out, report = tmp_path / "out", tmp_path / "report.json"
    base = [sys.executable, "-m", "petal.cli.main", "index", "--out", str(out), "-q", "--vectors-column", "emb"]
    first = subprocess.run([*base, str(vector_shard(data, 0))], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    run = subprocess.run([*base, str(vector_shard(data, 1)), "--json-report", str(report)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PETAL_FAULT": "store_entry_open:1:enospc"})
    assert run.returncode == 74, run.stderr
    summary = [line for line in run.stderr.splitlines() if line.startswith("petal index: failed")]
    assert summary and "2 shards (0 embedded, 0 reused, 1 kept)" in summary[0], run.stderr
    got = json.loads(report.read_text())
    assert got["shards"] == {"total": 2, "embedded": 0, "reused": 1} and got["exit_code"] == 74
