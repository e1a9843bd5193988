"""A kept store entry (a shard an additive run does not name, its vectors reused) whose bytes rot on disk with its
stat unchanged (bit rot, a bad sector: no write through the file system) was published: the additive run hashed
only the entry files whose stat changed, and the build read the rotten vectors into the new version. The build now
hashes every entry it reads that was not checked whole by this run, as it reads it (one read: the bytes the index
is built from are the bytes hashed), and a mismatch is exit 65 naming the entry and its shard, nothing published.
Real Parquet, real FAISS, ``petal index --vectors-column`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from petal.pipeline.store.embeddings import RACY_NS, STAT_KEY, file_stat
from tests.index_data import vector_shard


def petal(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", "index", *argv, "-q", "--vectors-column", "emb"],
                          capture_output=True, text=True, timeout=300)


def rot(vectors: Path, row: int) -> None:
    """Flip one byte of a stored vector, then record the file's new stat in ``entry.json`` as if no write had
    happened (a disk's rot changes no size, mtime, ctime or inode)."""
    with open(vectors, "r+b") as fh:
        data = os.fstat(fh.fileno()).st_size - 40 * 8 * 4  # the shards' 40 rows of 8 float32 end the file
        fh.seek(data + row * 8 * 4 + 3)
        byte = fh.read(1)[0]
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte ^ 0x40]))
    meta_file = vectors.parent / "entry.json"
    meta = json.loads(meta_file.read_text())
    meta[STAT_KEY]["embeddings.npy"] = file_stat(vectors)
    meta_file.write_text(json.dumps(meta))


def entry_of(out: Path, shard: Path) -> Path:
    (found,) = [p.parent for p in (out / "store" / "shards").glob("*/*/entry.json")
                if json.loads(p.read_text())["source"]["abs_path"] == str(shard.resolve())]
    return found


@pytest.mark.parametrize("factory", ["Flat", "HNSW8", "IVF2,Flat"])
def test_a_kept_entry_rotten_on_disk_is_never_published(tmp_path, factory):
    data = tmp_path / "data"
    data.mkdir()
    kept = [vector_shard(data, n, rows=40) for n in range(3)]
    out, report = tmp_path / "out", tmp_path / "report.json"
    first = petal(*map(str, kept), "--out", str(out), "--index-factory", factory)
    assert first.returncode == 0, first.stderr
    live = (out / "CURRENT").read_text().strip()
    time.sleep(RACY_NS / 1e9 + 0.2)  # the stat the store records is trusted once older than the racy window
    entry = entry_of(out, kept[1])
    rot(entry / "embeddings.npy", 7)
    added = vector_shard(tmp_path, 9, rows=40)
    run = petal(str(added), "--out", str(out), "--index-factory", factory, "--json-report", str(report))
    assert run.returncode == 65, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert str(entry) in last and "embeddings.npy" in last and str(kept[1]) in last
    got = json.loads(report.read_text())
    assert got["status"] == "failed" and got["exit_code"] == 65 and str(entry) in got["message"]
    assert (out / "CURRENT").read_text().strip() == live  # nothing published
    assert sorted(p.name for p in (out / "versions").iterdir()) == [live]  # no staging left behind
    again = petal(str(kept[1]), str(added), "--out", str(out), "--index-factory", factory)  # named: embedded again
    assert again.returncode == 0, again.stderr
    assert "damaged" in again.stderr
    stored = np.load(entry_of(out, kept[1]) / "embeddings.npy")
    assert np.array_equal(stored, np.random.default_rng(1).standard_normal((40, 8)).astype(np.float32))


@pytest.mark.parametrize("max_rows", [1, 7, 4096])
def test_vectors_hashed_while_read_are_the_vectors_read_from_the_map(tmp_path, monkeypatch, max_rows):
    """The rows a build takes through ``VectorReader`` (an unchecked entry: hashed as read, a step at a time) are
    the rows it takes from the memory map (a checked one), gaps included (ids a later shard supersedes)."""
    from petal.pipeline.index.source import StoreVectors
    from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, VectorReader
    from tests.index_data import commit_shard

    monkeypatch.setattr(VectorReader, "STEP_BYTES", 100)  # steps of 3 rows of 8 floats: many inside a chunk
    store = EmbeddingStore(tmp_path / "store")
    store.open()
    rng = np.random.default_rng(0)
    entries = [commit_shard(store, tmp_path / "data", "a.parquet", list(range(100)),
                            rng.standard_normal((100, 8)).astype(np.float32)),
               commit_shard(store, tmp_path / "data", "b.parquet", [*range(10, 20), *range(40, 47), 99, 500],
                            rng.standard_normal((19, 8)).astype(np.float32))]
    assert all(e.checked for e in entries)
    read = [(ids, vectors) for ids, vectors in StoreVectors(entries, 8).chunks(max_rows)]
    unchecked = StoreVectors([StoreEntry(e.path, e.meta) for e in entries], 8)
    hashed = list(unchecked.chunks(max_rows))
    assert len(hashed) == len(read) and sum(len(ids) for ids, _ in read) == 101
    for (ids, vectors), (ids2, vectors2) in zip(read, hashed):
        assert np.array_equal(ids, ids2) and np.array_equal(vectors, vectors2)
    assert list(unchecked.chunks(max_rows))[-1][1].tobytes() == read[-1][1].tobytes()  # a second pass: the map



@pytest.mark.parametrize("flags", [(), ("--strict",)])
def test_a_kept_entry_whose_rows_rotted_is_65_naming_it(tmp_path, flags):
    """A kept entry's ``rows.parquet`` rotted under an unchanged stat was read unchecked (the build's ids, --strict's
    duplicate check): pyarrow's 'Invalid page header' or 'Corrupt snappy compressed data', reported as 74 'cannot
    write' the version being staged (or a traceback)."""
    data = tmp_path / "data"
    data.mkdir()
    kept = [vector_shard(data, n, rows=40) for n in range(2)]
    out = tmp_path / "out"
    assert petal(*map(str, kept), "--out", str(out)).returncode == 0
    time.sleep(RACY_NS / 1e9 + 0.2)
    rows = entry_of(out, kept[0]) / "rows.parquet"
    with open(rows, "r+b") as fh:
        fh.seek(10)  # a data page's header
        byte = fh.read(1)[0]
        fh.seek(10)
        fh.write(bytes([byte ^ 0xFF]))
    meta = json.loads((rows.parent / "entry.json").read_text())
    meta[STAT_KEY]["rows.parquet"] = file_stat(rows)
    (rows.parent / "entry.json").write_text(json.dumps(meta))
    run = petal(str(vector_shard(tmp_path, 9, rows=40)), "--out", str(out), *flags)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 65 and str(rows.parent) in last and "rows.parquet" in last, run.stderr
