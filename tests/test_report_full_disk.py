"""A run whose --json-report could not be written at its end (the disk full) left the report of an earlier run in
place: a task reading the path after the run read that run's status and exit code (a success, exit 0) as this run's
(74), with only a warning on stderr to tell. The earlier report is now removed when this run's cannot take its place.
Real Parquet, the CLI in a subprocess, a real full file system (a small tmpfs; root only).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.index_data import vector_shard


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                      timeout=60).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False, timeout=60)


def test_a_report_that_cannot_be_written_leaves_no_earlier_report_behind(tmp_path, small_disk):
    data = tmp_path / "data"
    data.mkdir()
    report = small_disk / "report.json"
    base = [sys.executable, "-m", "petal.cli.main", "index", "--out", str(tmp_path / "out"), "-q",
            "--vectors-column", "emb", "--json-report", str(report)]
    first = subprocess.run([*base, str(vector_shard(data, 0))], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and json.loads(report.read_text())["exit_code"] == 0, first.stderr
    try:
        with open(small_disk / "filler", "wb") as fh:  # every block left
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
    except OSError:
        pass
    failed = subprocess.run([*base, str(data / "missing.parquet")], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 66, failed.stderr
    assert "cannot write the report" in failed.stderr
    assert not report.exists()  # the earlier run's report (exit 0) is not left to be read as this run's
