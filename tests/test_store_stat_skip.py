"""How much of the store a run reads: its work counted (every sha256 taken of a store file), not timed.

A store copied with ``cp -r`` (new inodes, times) was hashed in full by every later run with nothing to do: the stat
the store records for each file was never brought up to date after a full check found the files intact. And an
additive run (one new shard, the others kept) hashed every kept shard's entry in full: adding a small shard to a large
store cost a read of the whole store on top of the build. Real Parquet, real FAISS, ``petal index --vectors-column``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.store import embeddings
from petal.pipeline.store.embeddings import RACY_NS
from tests.index_data import vector_shard


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """Every store file a run hashes (``sha256_file`` as the store calls it)."""
    seen: list[Path] = []
    real = embeddings.sha256_file

    def counting(path):
        seen.append(Path(path))
        return real(path)

    monkeypatch.setattr(embeddings, "sha256_file", counting)
    return seen


def index(*argv: str) -> str:
    result = CliRunner().invoke(cli, ["index", *argv, "-q", "--vectors-column", "emb"])
    assert result.exit_code == 0, result.output
    return result.output


def in_store(paths: list[Path], out: Path) -> list[Path]:
    return [p for p in paths if (out / "store" / "shards") in p.parents]


def settle() -> None:
    """Wait out the racy window: a file changed this close to its hashing is never recorded as checked."""
    time.sleep(RACY_NS / 1e9 + 0.2)


def test_a_copied_store_is_hashed_once_then_skipped_and_a_change_is_still_caught(tmp_path, hashed):
    data = tmp_path / "data"
    data.mkdir()
    for n in range(3):
        vector_shard(data, n)
    index(str(data), "--out", str(tmp_path / "first"))
    out = tmp_path / "out"
    shutil.copytree(tmp_path / "first", out)  # cp -r: new inodes, times
    settle()
    hashed.clear()
    assert "nothing-to-do" in index(str(data), "--out", str(out))
    assert len(in_store(hashed, out)) == 9  # the copy: every file of the 3 entries checked once
    for _ in range(2):
        hashed.clear()
        assert "nothing-to-do" in index(str(data), "--out", str(out))
        assert in_store(hashed, out) == []  # checked, recorded: skipped again
    (vectors,) = [p for p in (out / "store" / "shards").glob("*/*/embeddings.npy")
                  if "v1" in (p.parent / "entry.json").read_text()]
    array = np.load(vectors, mmap_mode="r+")
    array[0, 0] += 1.0  # an edit through the file system (new mtime/ctime)
    array.flush()
    del array
    hashed.clear()
    result = CliRunner().invoke(cli, ["index", str(data), "--out", str(out), "-q", "--vectors-column", "emb"])
    assert result.exit_code == 0, result.output
    assert "damaged" in result.output and str(vectors.parent) in result.output
    assert vectors.parent / "embeddings.npy" in hashed


def test_an_additive_run_does_not_read_the_kept_vectors_twice(tmp_path, hashed):
    """The kept entries' vectors are hashed as the build reads them (``VectorReader``: test_store_kept_rot.py), never
    in a pass of their own; their small files (rows, rejects) are hashed whole."""
    data = tmp_path / "data"
    data.mkdir()
    kept = [vector_shard(data, n) for n in range(4)]
    out = tmp_path / "out"
    index(*map(str, kept), "--out", str(out))
    settle()
    new = tmp_path / "new"
    new.mkdir()
    added = vector_shard(new, 9)
    hashed.clear()
    output = index(str(added), "--out", str(out))
    assert "success" in output
    # the new shard's entry is hashed as it is written (in store/tmp); of the kept ones, only the small files
    assert sorted({p.name for p in in_store(hashed, out)}) == ["rejects.parquet", "rows.parquet"]
    assert any(p.name == "embeddings.npy" for p in hashed)  # (the counter sees the store's hashing)
    assert len(list((out / "store" / "shards").glob("*/*/entry.json"))) == 5


def test_a_vectors_run_with_nothing_to_do_reports_the_live_rejects_file(tmp_path):
    """``--json-report`` of a ``--vectors-column`` run with nothing to do said ``rejects_file: null`` where a text
    run's names the live version's (an Airflow task reading it got nothing)."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    vector_shard(data, 0)
    out, report = tmp_path / "out", tmp_path / "r.json"
    index(str(data), "--out", str(out), "--json-report", str(report))
    first = json.loads(report.read_text())
    assert "nothing-to-do" in index(str(data), "--out", str(out), "--json-report", str(report))
    again = json.loads(report.read_text())
    assert again["status"] == "nothing-to-do" and again["version"] == first["version"]
    assert again["rejects_file"] == first["rejects_file"] and Path(again["rejects_file"]).is_file()
