"""Permission denied on an output is 'cannot create output' (73), never an I/O error (74).

``writing`` (every write of a run's output: the store, a version's staging directory, CURRENT) turned EACCES/EPERM
into 74, which tells a scheduler to fix the disk and retry: the retry fails the same way. Real ``petal index`` and
``petal rebuild`` processes without the capabilities that bypass file modes (``setpriv``), real Parquet and FAISS.
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

from tests.conftest import REPO
from tests.test_input_files import run_unprivileged

DIM = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("out-perm")
    for n, name in enumerate("ab"):
        flat = np.random.default_rng(n).standard_normal((30, DIM)).astype(np.float32).ravel()
        table = pa.table({"id": np.arange(30) + 100 * n,
                          "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)})
        pq.write_table(table, root / f"{name}.parquet")
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(root / "a.parquet"), "--out",
                           str(root / "out"), "-q", "--vectors-column", "emb"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.parametrize("target", ["store/shards", "versions"])
def test_an_output_directory_petal_may_not_write_is_73(built, tmp_path, target):
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    (out / target).chmod(0o555)
    try:
        runs = [["index", str(built / "a.parquet"), str(built / "b.parquet"), "--out", str(out), "-q",
                 "--vectors-column", "emb"]]
        if target == "versions":
            runs.append(["rebuild", str(out), "--index-factory", "Flat"])
        for argv in runs:
            proc = run_unprivileged(argv, tmp_path)
            assert proc.returncode == 73, (argv, proc.returncode, proc.stderr[-2000:])
            last = proc.stderr.strip().splitlines()[-1]
            assert "Traceback" not in proc.stderr and str(out / target) in last and "permission denied" in last.lower()
    finally:
        (out / target).chmod(0o755)
