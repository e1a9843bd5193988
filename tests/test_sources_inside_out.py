"""``--out`` is never read as input, in text runs and ``--vectors-column`` runs alike: a file named explicitly inside
``--out`` is refused (65) and a directory SOURCE that is (or lies inside) ``--out`` yields none of its files, before
anything is written. Before: ``--vectors-column`` runs resolved their sources without ``--out``, so they indexed a
shard inside the output directory (and wrote ``CURRENT`` and ``versions/`` beside it) where a text run refused it.
Real ``petal index`` processes, real Parquet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

PETAL = str(Path(sys.executable).parent / "petal")
MODES = {"text": [], "vectors": ["--vectors-column", "emb"]}


def petal_index(tmp_path: Path, *args: str | Path) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    done = subprocess.run([PETAL, "index", *map(str, args), "-q", "--json-report", str(report)], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(report.read_text())


@pytest.fixture
def data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["glaciers", "rivers"],
                             "emb": pa.array([[1.0, 0.0], [0.0, 1.0]], pa.list_(pa.float32()))}), data / "a.parquet")
    return data


@pytest.mark.parametrize("mode", MODES)
def test_a_file_named_inside_out_is_refused(mode, data, tmp_path):
    done, report = petal_index(tmp_path, data / "a.parquet", "--out", data, *MODES[mode])
    assert done.returncode == 65, (mode, done.stderr)
    assert f"{data / 'a.parquet'} is inside the output directory {data}" in done.stderr, done.stderr
    assert report["exit_code"] == 65
    assert sorted(p.name for p in data.iterdir()) == ["a.parquet"]  # nothing written


@pytest.mark.parametrize("mode", MODES)
def test_a_directory_source_that_is_out_yields_nothing(mode, data, tmp_path):
    done, report = petal_index(tmp_path, data, "--out", data, *MODES[mode])
    assert report["exit_code"] == 66
    assert done.returncode == 66 and f"no *.parquet files under directory {data}" in done.stderr, (mode, done.stderr)
    assert sorted(p.name for p in data.iterdir()) == ["a.parquet"]


@pytest.mark.parametrize("mode", MODES)
def test_out_inside_a_directory_source_is_skipped(mode, data, tmp_path):
    """The supported layout: ``--out`` inside the SOURCE directory; its files (a stray Parquet there) are never read."""
    out = data / "index"
    out.mkdir()
    stray = {"id": ["stray"], "text": ["stray"], "emb": pa.array([[0.5, 0.5]], pa.list_(pa.float32()))}
    pq.write_table(pa.table(stray), out / "stray.parquet")
    done, report = petal_index(tmp_path, data, "--out", out, *MODES[mode])
    assert done.returncode == 0, (mode, done.stderr)
    assert report["shards"]["total"] == 1 and report["rows"]["embedded"] == 2
