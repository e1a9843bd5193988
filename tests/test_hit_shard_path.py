"""A hit's ``shard`` (``ids.parquet``, ``petal query --json``, ``/search``) is the path the live version's manifest
records for that shard (what ``petal info`` lists). It was the path its store entry was first committed with: a
shard first indexed as ``src/a.parquet`` (a relative path) kept that in every later version built from absolute
paths. Real CLI processes (the fake engine), real Parquet and FAISS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.fake_engine import make_fake_model_dir


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def _petal(cwd: Path, *argv: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PETAL_TEST_FAKE_ENGINE": str(cwd / "fake.jsonl")}
    env.pop("PETAL_FAULT", None)
    done = subprocess.run([sys.executable, "-m", "tests.fake_cli", *map(str, argv)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def _write(path: Path, name: str, rows: int = 4) -> None:
    """``rows`` documents, the last with a null text (a bad row: in rejects.parquet)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"{name}{i}" for i in range(rows)],
                             "text": [f"{name} text number {i}" for i in range(rows - 1)] + [None]}), path)


def _hit_shards(out: Path, name: str = "ids.parquet") -> set[str]:
    return set(pq.read_table(out / "versions" / (out / "CURRENT").read_text().strip() / name,
                             columns=["shard"]).column("shard").to_pylist())


def _manifest_paths(out: Path) -> set[str]:
    version = (out / "CURRENT").read_text().strip()
    return {s["path"] for s in json.loads((out / "versions" / version / "manifest.json").read_text())["shards"]}


def test_a_shard_named_by_another_spelling_later_shows_that_spelling(tmp_path, fake_model):
    _write(tmp_path / "src" / "a.parquet", "a")
    _petal(tmp_path, "index", "src", "--out", "out", "--model", fake_model, "-q")
    assert _hit_shards(tmp_path / "out") == {"src/a.parquet"} == _manifest_paths(tmp_path / "out")
    assert _hit_shards(tmp_path / "out", "rejects.parquet") == {"src/a.parquet"}
    _write(tmp_path / "src" / "b.parquet", "b")
    _petal(tmp_path, "index", tmp_path / "src", "--out", tmp_path / "out", "--model", fake_model, "-q")
    expected = {str(tmp_path / "src" / "a.parquet"), str(tmp_path / "src" / "b.parquet")}
    assert _manifest_paths(tmp_path / "out") == expected
    assert _hit_shards(tmp_path / "out") == expected  # a.parquet's entry (reused) was committed as src/a.parquet
    assert _hit_shards(tmp_path / "out", "rejects.parquet") == expected  # its bad row too
    version = (tmp_path / "out" / "CURRENT").read_text().strip()
    dim = json.loads((tmp_path / "out" / "versions" / version / "manifest.json").read_text())["dim"]
    np.save(tmp_path / "q.npy", np.ones((1, dim), np.float32))
    hits = [json.loads(line) for line in _petal(tmp_path, "query", "out", "--vector-file", "q.npy", "--json", "-k",
                                                "8").stdout.splitlines()]
    assert {hit["shard"] for answer in hits for hit in answer["hits"]} == expected
    _petal(tmp_path, "rebuild", "out", "--index-factory", "HNSW8")  # a rebuild writes the manifest's paths too
    assert _hit_shards(tmp_path / "out") == expected == _manifest_paths(tmp_path / "out")
    assert _hit_shards(tmp_path / "out", "rejects.parquet") == expected


def test_a_refused_run_names_kept_bad_rows_by_the_path_of_this_run(tmp_path, fake_model):
    """--strict refused: OUT/rejects.parquet named a reused shard's bad row by its first run's spelling."""
    _write(tmp_path / "src" / "a.parquet", "a")
    _petal(tmp_path, "index", "src", "--out", "out", "--model", fake_model, "-q")
    _write(tmp_path / "src" / "b.parquet", "b")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl")}
    env.pop("PETAL_FAULT", None)
    refused = subprocess.run([sys.executable, "-m", "tests.fake_cli", "index", str(tmp_path / "src"), "--out", "out",
                              "--model", str(fake_model), "-q", "--strict"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 65, refused.stderr
    shards = set(pq.read_table(tmp_path / "out" / "rejects.parquet").column("shard").to_pylist())
    assert shards <= {str(tmp_path / "src" / "a.parquet"), str(tmp_path / "src" / "b.parquet")}, shards

