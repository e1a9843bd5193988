"""``petal.verify``: ``petal verify OUT [--version V]`` from Python. The API had no way to check a version's bytes
(an Airflow task or a service's health check had to run the CLI in a subprocess and parse its text); the CLI is now
written on it, so both give the same verdict, exit code and message. Real Parquet and FAISS (a ``vectors_column``
index), the CLI in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests.conftest import REPO


def _index(tmp_path: Path, seed: int) -> petal.RunReport:
    vectors = np.random.default_rng(seed).standard_normal((30, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(30)], "text": [f"t{i}" for i in range(30)],
                             "vec": list(vectors)}), tmp_path / "s.parquet")
    return petal.index(tmp_path / "s.parquet", tmp_path / "out", vectors_column="vec", quiet=True)


def _cli(*argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", "verify", *map(str, argv)], capture_output=True,
                          text=True, cwd=REPO, timeout=300, stdin=subprocess.DEVNULL)


def test_verify_returns_the_report_of_the_live_or_named_version(tmp_path):
    first = _index(tmp_path, 0).version
    live = _index(tmp_path, 1).version
    assert first != live
    for out in (tmp_path / "out", str(tmp_path / "out")):
        report = petal.verify(out)
        assert isinstance(report, petal.VerifyReport) and report.ok and report.exit_code == 0
        assert report.version_dir.name == live
        assert {f.name for f in report.files} >= {"index.faiss", "ids.parquet"} and all(f.ok for f in report.files)
    assert petal.verify(tmp_path / "out", version=first).version_dir.name == first


@pytest.mark.parametrize("damage", ["flip", "remove"])
def test_a_damaged_version_raises_as_the_cli_exits(tmp_path, damage):
    version = _index(tmp_path, 0).version
    index_file = tmp_path / "out" / "versions" / version / "index.faiss"
    if damage == "flip":
        data = bytearray(index_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        index_file.write_bytes(bytes(data))
    else:
        os.remove(index_file)
    expected = petal.BadInputError if damage == "flip" else petal.ConfigError
    with pytest.raises(expected) as raised:
        petal.verify(tmp_path / "out")
    report = raised.value.verify_report
    assert report is not None and not report.ok and report.exit_code == raised.value.exit_code
    assert [f.name for f in report.files if not f.ok] == ["index.faiss"] and "index.faiss" in str(raised.value)
    cli = _cli(tmp_path / "out")
    assert cli.returncode == raised.value.exit_code
    assert cli.stderr.strip() == f"petal: error: {raised.value}"
    assert "index.faiss" in cli.stdout


def test_what_is_no_version_to_check(tmp_path):
    _index(tmp_path, 0)
    with pytest.raises(petal.UsageError, match=r'version "nope" is not a version id'):
        petal.verify(tmp_path / "out", version="nope")
    with pytest.raises(petal.UsageError, match=r"give its id: version v000001-"):  # a path to one: its id
        petal.verify(tmp_path / "out", version=str(next((tmp_path / "out" / "versions").iterdir())))
    with pytest.raises(petal.UsageError, match="version=5 is an int"):
        petal.verify(tmp_path / "out", version=5)  # type: ignore[arg-type]
    with pytest.raises(petal.ConfigError, match="v000009-20200101T000000Z"):
        petal.verify(tmp_path / "out", version="v000009-20200101T000000Z")
    with pytest.raises(petal.ConfigError, match="not a petal index"):
        petal.verify(tmp_path / "missing")
    with pytest.raises(petal.UsageError, match="out: an empty path"):
        petal.verify("")
