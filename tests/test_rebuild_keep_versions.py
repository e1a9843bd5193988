"""``petal rebuild OUT --keep-versions N`` (``petal.rebuild(keep_versions=N)``): the versions left after its publish,
as ``petal index --keep-versions``. Before: a rebuild always kept 2, so one rebuild of an index whose cron runs keep
a week of rollback versions (``--keep-versions 7``) removed all but the last of them, with no flag to say otherwise
(``--keep-versions`` was 'No such option', exit 2). The default stays 2, as ``petal index``'s.

Real ``petal`` processes, real Parquet and FAISS, a ``--vectors-column`` index.
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

import petal
from petal.pipeline.layout import OutputDir
from tests.conftest import REPO

DIM = 8


def petal_cli(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An index whose runs keep 4 versions, with 4 on disk."""
    root = tmp_path_factory.mktemp("keep-versions")
    flat = np.random.default_rng(0).standard_normal((300, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(300), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "a.parquet")
    for factory in ("Flat", "IVF2,Flat", "IVF4,Flat", "HNSW8"):
        proc = petal_cli("index", root / "a.parquet", "--out", root / "out", "-q", "--vectors-column", "emb",
                         "--keep-versions", 4, "--index-factory", factory)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_versions(root / "out")) == 4
    return root / "out"


def _versions(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "versions").iterdir() if not p.name.startswith("."))


def _copy(four: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(four, out)
    return out


def test_rebuild_keeps_the_versions_it_is_told_to(four, tmp_path):
    out = _copy(four, tmp_path)
    before = _versions(out)
    proc = petal_cli("rebuild", out, "--index-factory", "Flat", "--keep-versions", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]  # was: 2, no such option
    after = _versions(out)
    assert after == [*before[1:], str(OutputDir(out).current_version())]
    proc = petal_cli("rebuild", out, "--keep-versions", 3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _versions(out) == [*after[2:], str(OutputDir(out).current_version())]


def test_the_default_is_still_the_live_version_and_the_one_before_it(four, tmp_path):
    out = _copy(four, tmp_path)
    live = str(OutputDir(out).current_version())
    assert petal_cli("rebuild", out).returncode == 0
    assert _versions(out) == [live, str(OutputDir(out).current_version())]


def test_the_api_takes_keep_versions(four, tmp_path):
    out = _copy(four, tmp_path)
    before = _versions(out)
    report = petal.rebuild(out, keep_versions=5)
    assert _versions(out) == [*before, report.version]
    for bad, error in ((0, petal.UsageError), (True, TypeError), ("3", TypeError)):
        with pytest.raises(error, match="keep_versions"):
            petal.rebuild(out, keep_versions=bad)
    assert _versions(out) == [*before, report.version]


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_keep_versions_is_a_usage_error(four, tmp_path, value):
    out = _copy(four, tmp_path)
    before = _versions(out)
    proc = petal_cli("rebuild", out, "--keep-versions", value)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--keep-versions" in proc.stderr
    assert _versions(out) == before
