"""What must hold of an output directory after any run (RELIABILITY.md), as reusable checks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import VERSION_RE, OutputDir

VERSION_FILES = {"manifest.json", "index.faiss", "ids.parquet", "rejects.parquet"}
ENTRY_FILES = {"embeddings.npy", "rows.parquet", "rejects.parquet", "entry.json"}


def live(out: Path) -> tuple[list, np.ndarray]:
    """The live version's document ids (in FAISS id order) and vectors, after checking it is complete:
    checksums match the manifest, one id per vector, ids unique, FAISS ids 0..N-1."""
    reader = IndexReader(out)
    ids = reader.ids.column("id").to_pylist()
    assert reader.ntotal == len(ids) == reader.manifest.index.num_vectors
    assert len(set(ids)) == len(ids), "duplicate ids in the index"
    assert reader.ids.column("faiss_id").to_pylist() == list(range(len(ids)))
    vectors = reader.index.reconstruct_n(0, reader.ntotal) if reader.ntotal else np.zeros((0, reader.dim))
    if ids:  # a query finds a document of the index (the nearest to its own vector is itself)
        hit = reader.search(vectors[:1], k=3)[0][0]
        assert hit.id == ids[0] and hit.faiss_id == 0
    return ids, vectors


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (to prove a version was not touched)."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def assert_clean(out: Path, keep_versions: int = 2) -> None:
    """No temp, partial or orphaned file anywhere; the store holds exactly the live version's entries."""
    layout = OutputDir(out)
    version = layout.current_version()
    assert version is not None
    allowed_top = {"CURRENT", ".lock", "versions", "store"}
    assert {p.name for p in out.iterdir()} <= allowed_top, sorted(p.name for p in out.iterdir())
    versions = sorted(p.name for p in layout.versions_dir.iterdir())
    assert all(VERSION_RE.match(v) for v in versions), versions
    assert version in versions and len(versions) <= keep_versions and max(versions) == version, versions
    for v in versions:
        assert {p.name for p in (layout.versions_dir / v).iterdir()} == VERSION_FILES, v
    assert not any(layout.store_dir.joinpath("tmp").iterdir()), list(layout.store_dir.joinpath("tmp").iterdir())
    manifest = json.loads((layout.versions_dir / version / "manifest.json").read_text())
    live_entries = {s["entry"] for s in manifest["shards"]}
    entries = [e for key in (layout.store_dir / "shards").iterdir() for e in key.iterdir()]
    assert {e.name for e in entries} == live_entries and len(entries) == len(live_entries)
    for entry in entries:
        assert {p.name for p in entry.iterdir()} == ENTRY_FILES, entry


def rejects_rows(version_dir: Path) -> list[tuple[str, int, str]]:
    table = pq.read_table(version_dir / "rejects.parquet")
    return list(zip(table.column("shard").to_pylist(), table.column("row").to_pylist(),
                    table.column("reason").to_pylist()))
