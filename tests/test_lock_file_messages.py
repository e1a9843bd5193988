"""A lock file petal cannot open says why: permission denied is a permission problem (73, fix the permissions), and
only something that is not a regular file in its place (a directory, a symlink) is 'remove it'. The same for
``petal bench``'s ``--workdir`` lock.

Before: every error opening ``OUT/.lock`` got '...: Permission denied; it must be a regular file: remove it', which
sent an operator to delete the lock of an index whose only fault was its mode.

Real ``petal`` processes (forked from a preloaded interpreter, without the capabilities that bypass file modes when
run as root: tests/_perms_shared.py), real Parquet and FAISS, a ``--vectors-column`` index.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import _perms_shared as perms
from tests import forkrun

DIM = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lock-denied")
    flat = np.random.default_rng(0).standard_normal((30, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(30), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "a.parquet")
    run = perms.petal(["index", str(root / "a.parquet"), "--out", str(root / "out"), "-q", "--vectors-column", "emb"],
                      unprivileged=False)
    assert run.rc == 0, run.stderr[-3000:]
    return root / "a.parquet", root / "out"


def runs(source: Path, out: Path) -> list[forkrun.Result]:
    return [perms.petal(["index", str(source), "--out", str(out), "-q", "--vectors-column", "emb"]),
            perms.petal(["rebuild", str(out)])]


def test_a_lock_file_petal_may_not_write_is_a_permission_error(built, tmp_path):
    source, template = built
    out = tmp_path / "out"
    shutil.copytree(template, out)
    (out / ".lock").write_bytes(b"")
    (out / ".lock").chmod(0o444)
    for run in runs(source, out):
        assert run.rc == 73, run.stderr
        assert f"cannot open the lock file {out / '.lock'}: Permission denied; petal may not write it" in run.last_line
        assert "regular file" not in run.stderr and "remove it" not in run.stderr, run.stderr
    assert (out / ".lock").is_file()


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_something_else_in_its_place_is_to_be_removed(built, tmp_path, kind):
    source, template = built
    out = tmp_path / "out"
    shutil.copytree(template, out)
    (out / ".lock").unlink(missing_ok=True)
    if kind == "directory":
        (out / ".lock").mkdir()
    else:
        (tmp_path / "elsewhere").write_text("keep me")
        (out / ".lock").symlink_to(tmp_path / "elsewhere")
    for run in runs(source, out):
        assert run.rc == 73, run.stderr
        assert f"the lock file {out / '.lock'}: it is a {kind}, not a regular file; remove it" in run.last_line
        assert "Permission denied" not in run.stderr and "Too many levels" not in run.stderr, run.stderr
    assert kind == "directory" or (tmp_path / "elsewhere").read_text() == "keep me"


def bench(workdir: Path) -> forkrun.Result:
    return perms.petal(["bench", "index", "--workdir", str(workdir), "--vectors", "1000", "--dim", "8", "--queries",
                        "10", "--no-baseline"])


def test_petal_bench_says_the_same_of_its_workdir_lock(tmp_path):
    lock = tmp_path / ".petal-bench.lock"
    lock.write_bytes(b"")
    lock.chmod(0o444)
    run = bench(tmp_path)
    assert run.rc == 73 and "Permission denied; petal may not write it" in run.stderr, run.stderr
    assert "remove it" not in run.stderr
    lock.unlink()
    lock.mkdir()
    run = bench(tmp_path)
    assert run.rc == 73 and "it is a directory, not a regular file; remove it" in run.stderr, run.stderr
