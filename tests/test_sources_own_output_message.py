"""A source whose Parquet files all lie in petal's output (``--out`` itself, or another index's directory) is no
input (66), and the error says why: before, it read "no *.parquet files under directory DATA" (or "glob ...
matches no files") while DATA plainly held Parquet files. Real ``petal index`` processes (``--vectors-column``: no
model), real Parquet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PETAL = str(Path(sys.executable).parent / "petal")


def index(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([PETAL, "index", *map(str, args), "-q", "--vectors-column", "emb"], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def shard(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["glaciers", "rivers"],
                             "emb": pa.array([[1.0, 0.0], [0.0, 1.0]], pa.list_(pa.float32()))}), path)


def test_the_reason_is_named_when_the_source_is_out(tmp_path):
    data = tmp_path / "data"
    shard(data / "a.parquet")
    for source in (data, f"{data}/*.parquet", data / "."):
        done = index(tmp_path, source, "--out", data)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 66 and f"outside the output directory {data}" in last, (source, done.stderr)
        assert "petal does not read its own output as input" in last
    assert sorted(p.name for p in data.iterdir()) == ["a.parquet"]  # nothing written


def test_the_reason_is_named_when_the_source_lies_in_another_index(tmp_path):
    data, other = tmp_path / "data", tmp_path / "other"
    shard(data / "a.parquet")
    assert index(tmp_path, data, "--out", other).returncode == 0
    shards = other / "store" / "shards"  # a petal output directory: its Parquet files are never sources
    assert any(shards.rglob("*.parquet"))
    for source in (shards, f"{shards}/**/*.parquet", other, other / "versions"):
        done = index(tmp_path, source, "--out", tmp_path / "third")
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 66 and "outside petal output directories" in last, (source, done.stderr)


def test_an_empty_directory_keeps_the_plain_message(tmp_path):
    (tmp_path / "empty").mkdir()
    done = index(tmp_path, tmp_path / "empty", "--out", tmp_path / "out")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 66 and last.endswith(f"no *.parquet files under directory {tmp_path / 'empty'}"), last
