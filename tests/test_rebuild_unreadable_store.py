"""``petal rebuild OUT``: a store entry (or a file of the live version) that petal may not read is no input, 66 naming
it, as an index petal may not read is: not a damaged entry (65), an output petal may not write (73) or an I/O error
(74). Before: an entry's file of mode 000 was 65 "the store entry ... is damaged (Permission denied)", an unreadable
store directory 74, a stored-columns file or the live version's rejects.parquet 73 "petal may not write
OUT/versions/.staging-..." (read inside the staging directory's ``writing()``). A damaged entry stays 65, and the
live version is left as it was every time.

Real ``petal`` processes without the capabilities that bypass file modes (``setpriv`` for root), real Parquet and
FAISS, an index with a ``--delete`` tombstone and stored columns.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests.conftest import REPO
from tests.test_input_files import run_unprivileged

DIM = 8


def petal(*argv: object) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Two shards, one row of the first deleted (a tombstone), the lang column kept (side files of the store)."""
    root = tmp_path_factory.mktemp("rebuild-denied")
    for n, name in enumerate("ab"):
        flat = np.random.default_rng(n).standard_normal((30, DIM)).astype(np.float32).ravel()
        pq.write_table(pa.table({"id": np.arange(30) + 100 * n, "lang": ["en", "de"] * 15,
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                       root / f"{name}.parquet")
    pq.write_table(pa.table({"id": [3]}), root / "delete.parquet")
    flags = ["-q", "--vectors-column", "emb", "--keep-columns", "lang"]
    petal("index", root / "a.parquet", root / "b.parquet", "--out", root / "out", *flags)
    petal("index", root / "a.parquet", root / "b.parquet", "--out", root / "out", *flags, "--delete",
          root / "delete.parquet")
    return root / "out"


def store_paths(out: Path) -> dict[str, Path]:
    """One of each kind of file and directory a rebuild reads."""
    entry = sorted((out / "store" / "shards").glob("*/*"))[0]
    version = out / "versions" / str(OutputDir(out).current_version())
    tombstone = next((out / "store" / "deleted").glob("*/*.parquet"))
    return {
        "shards dir": out / "store" / "shards", "shard key dir": entry.parent, "entry dir": entry,
        "entry.json": entry / "entry.json", "embeddings.npy": entry / "embeddings.npy",
        "rows.parquet": entry / "rows.parquet", "rejects.parquet": entry / "rejects.parquet",
        "columns file": next((out / "store" / "columns").glob(f"{entry.parent.name}/*.parquet")),
        "tombstone": tombstone, "deleted dir": out / "store" / "deleted",
        "live rejects": version / "rejects.parquet",
    }


KINDS = ["shards dir", "shard key dir", "entry dir", "entry.json", "embeddings.npy", "rows.parquet", "rejects.parquet",
         "columns file", "tombstone", "deleted dir", "live rejects"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_file_petal_may_not_read_is_66_naming_it(built, tmp_path, kind):
    out = tmp_path / "out"
    shutil.copytree(built, out)
    live = OutputDir(out).current_version()
    target = store_paths(out)[kind]
    assert target.exists(), target
    target.chmod(0)
    try:
        proc = run_unprivileged(["rebuild", str(out), "--index-factory", "Flat"], tmp_path)
    finally:
        target.chmod(0o755 if target.is_dir() else 0o644)
    assert proc.returncode == 66, (kind, proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert target.name in last and "petal may not read it (permission denied)" in last, last
    assert "damaged" not in last and "cannot create output" not in last, last
    assert OutputDir(out).current_version() == live
    assert not any(p.name.startswith(".staging") for p in (out / "versions").iterdir())


def test_a_damaged_store_entry_is_still_65(built, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(built, out)
    npy = store_paths(out)["embeddings.npy"]
    npy.write_bytes(npy.read_bytes()[:-16])
    proc = run_unprivileged(["rebuild", str(out), "--index-factory", "Flat"], tmp_path)
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert "is damaged" in proc.stderr.strip().splitlines()[-1]
