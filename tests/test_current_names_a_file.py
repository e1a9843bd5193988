"""``CURRENT`` naming a version whose entry under ``versions/`` is a file (not a directory) is refused (78) saying
so, by ``petal query``, ``petal info`` and ``petal.open_index``: the message said the version 'is not in versions/',
which ``ls versions`` contradicts. A version that is gone is still 'not in versions/'.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests._open_audit_shared import api


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("current_file")
    flat = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    data = root / "v.parquet"
    pq.write_table(pa.table({"id": np.arange(50), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), 8)}),
                   data)
    np.save(root / "q.npy", flat[:1])
    out = root / "out"
    done = forkrun.petal(["index", str(data), "--out", str(out), "-q", "--vectors-column", "emb"], timeout=300)
    assert done.rc == 0, done.stderr[-2000:]
    return out


@pytest.mark.parametrize("entry", ["a file", "gone"])
def test_current_naming_a_file_says_so(built: Path, tmp_path: Path, entry: str) -> None:
    out = tmp_path / "out"
    shutil.copytree(built, out)
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    shutil.rmtree(version)
    if entry == "a file":
        version.write_text("x")
    said = "is a file, not a directory" if entry == "a file" else "which is not in"
    for done in (forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy")]),
                 forkrun.petal(["info", str(out)])):
        assert done.rc == 78 and said in done.last_line and "Traceback" not in done.stderr, done.stderr
    opened = api(out)
    assert opened.returncode == 78 and said in opened.stderr, opened.stderr


@pytest.mark.parametrize("link", ["to another directory in versions/", "to itself"])
def test_a_version_that_is_a_link_inside_versions_says_so(built: Path, tmp_path: Path, link: str) -> None:
    """A version entry that is a symbolic link within versions/ is refused (78) as a link; it said it 'leads out of
    versions/', which it does not (a link out still says so)."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    if link == "to itself":
        shutil.rmtree(version)
        version.symlink_to(version.name)
    else:
        version.rename(version.parent / "real")
        version.symlink_to("real")
    for done in (forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy")]),
                 forkrun.petal(["info", str(out)]), forkrun.petal(["verify", str(out)])):
        assert done.rc == 78 and "is a symbolic link, not a version directory" in done.last_line, done.stderr
