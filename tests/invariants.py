"""What must hold of an output directory after any run (RELIABILITY.md), as reusable checks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import VERSION_RE, OutputDir
from petal.pipeline.store.embeddings import shard_key
from petal.pipeline.store.side_files import PUBLISHED_TREE, SIDE_TREES

VERSION_FILES = {"manifest.json", "index.faiss", "ids.parquet", "rejects.parquet"}
# index files a version has as its index needs them (an on-disk IVF's lists, a binary index's rescore vectors),
# each listed with its sha256 in the manifest
OPTIONAL_VERSION_FILES = {"index.ivfdata", "rescore.npy"}
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


def entries_of_versions(out: Path) -> set[tuple[str, str]]:
    """``(shard key, fingerprint)`` of the store entry of every shard of every version in ``OUT/versions/``."""
    used = set()
    for version_dir in (out / "versions").iterdir():
        manifest = json.loads((version_dir / "manifest.json").read_text())
        used |= {(shard_key(s["abs_path"]), s["entry"]) for s in manifest["shards"]}
    return used


def assert_clean(out: Path, keep_versions: int = 2) -> None:
    """No temp, partial or orphaned file anywhere; the store holds exactly the entries some version on disk uses
    (each a rollback target that stays rebuildable and updatable from the store), with their side files only."""
    layout = OutputDir(out)
    version = layout.current_version()
    assert version is not None
    allowed_top = {"CURRENT", ".lock", ".last-version", ".pruning", "versions", "store"}
    assert {p.name for p in out.iterdir()} <= allowed_top, sorted(p.name for p in out.iterdir())
    if (out / ".pruning").exists():  # the pruning the live version's publish owes still (a reader's lease kept one)
        assert json.loads((out / ".pruning").read_text())["version"] == version
    versions = sorted(p.name for p in layout.versions_dir.iterdir())
    assert all(VERSION_RE.match(v) for v in versions), versions
    assert version in versions and len(versions) <= keep_versions and max(versions) == version, versions
    for v in versions:
        names = {p.name for p in (layout.versions_dir / v).iterdir()}
        listed = set(json.loads((layout.versions_dir / v / "manifest.json").read_text())["index"]["files"])
        extra = names - VERSION_FILES
        assert names >= VERSION_FILES and extra <= OPTIONAL_VERSION_FILES and extra <= listed, (v, sorted(names))
    store = layout.store_dir
    assert {p.name for p in store.iterdir()} <= {"shards", "tmp", "parts", *SIDE_TREES}, list(store.iterdir())
    assert not any(store.joinpath("tmp").iterdir()), list(store.joinpath("tmp").iterdir())
    assert not store.joinpath("parts").exists() or not any(store.joinpath("parts").iterdir())
    used = entries_of_versions(out)
    manifest = json.loads((layout.versions_dir / version / "manifest.json").read_text())
    assert {(shard_key(s["abs_path"]), s["entry"]) for s in manifest["shards"]} <= used
    key_dirs = list((store / "shards").iterdir())
    assert all(any(key.iterdir()) for key in key_dirs), "an empty shard key directory"
    entries = {(key.name, e.name): e for key in key_dirs for e in key.iterdir()}
    assert set(entries) == used, ("not used by any version:", sorted(set(entries) - used),
                                  "used but missing:", sorted(used - set(entries)))
    for entry in entries.values():
        assert {p.name for p in entry.iterdir()} == ENTRY_FILES, entry
    for tree in SIDE_TREES:  # tombstones, stored columns, published records: of entries in use, no staged or temp files
        keys = list(store.joinpath(tree).iterdir()) if store.joinpath(tree).is_dir() else []
        assert all(key.is_dir() and any(key.iterdir()) for key in keys), keys
        files = [f for key in keys for f in key.iterdir()]
        suffix = "" if tree == PUBLISHED_TREE else ".parquet"  # published: an empty file named as its entry
        stray = [f for f in files if f.suffix != suffix or (f.parent.name, f.stem) not in used]
        assert stray == [], stray


def rejects_rows(version_dir: Path) -> list[tuple[str, int, str]]:
    table = pq.read_table(version_dir / "rejects.parquet")
    return list(zip(table.column("shard").to_pylist(), table.column("row").to_pylist(),
                    table.column("reason").to_pylist()))
