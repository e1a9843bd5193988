"""Pruning (``--keep-versions N``: the live version and N-1 rollback versions before it) does not count an older
version whose manifest cannot be read (cut, garbage, gone) as one of the N-1: no rollback can go to it, and it took
the place of a good version, which was deleted in its stead. Such a version inside the window is kept (said on
stderr); one older than the oldest kept rollback version goes with the rest.

Real ``petal`` processes, real Parquet and FAISS, a ``--vectors-column`` index."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

DIM = 8


def _petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def _versions(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "versions").iterdir() if not p.name.startswith("."))


def _publish(root: Path, n: int, keep: int) -> subprocess.CompletedProcess:
    flat = np.random.default_rng(n).standard_normal((40, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(40), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "a.parquet")
    return _petal("index", root / "a.parquet", "--out", root / "out", "-q", "--vectors-column", "emb",
                  "--keep-versions", keep, "--index-factory", "Flat")


@pytest.mark.parametrize("damage", ["cut", "garbage", "removed"])
def test_an_unreadable_rollback_version_is_not_counted(tmp_path, damage):
    for n in range(4):
        assert _publish(tmp_path, n, 4).returncode == 0
    out = tmp_path / "out"
    v1, v2, v3, v4 = _versions(out)
    manifest = out / "versions" / v3 / "manifest.json"
    if damage == "cut":
        manifest.write_bytes(manifest.read_bytes()[:50])
    elif damage == "garbage":
        manifest.write_text("not json")
    else:
        manifest.unlink()
    proc = _publish(tmp_path, 4, 3)  # live v5 and 2 rollback versions: v4 and v2 (v3 cannot be one)
    assert proc.returncode == 0, proc.stderr[-3000:]
    v5 = (out / "CURRENT").read_text().strip()
    assert _versions(out) == [v2, v3, v4, v5], proc.stderr
    assert f"version {v3}'s manifest cannot be read" in proc.stderr
    proc = _publish(tmp_path, 5, 3)  # live v6: v5 and v4 are the rollback versions; v3 and v2 are older
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _versions(out) == [v4, v5, (out / "CURRENT").read_text().strip()]
    assert v1 not in _versions(out)
