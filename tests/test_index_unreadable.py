"""An index petal may not read (permission denied on OUT, versions/, a version directory, CURRENT, the manifest or a
listed file) is no input (66) naming the path, in petal query, petal info and petal verify alike.

Before: 74 'I/O error ... Permission denied' for a listed file or versions/ (which tells a scheduler to fix the disk
and retry), 78 'CURRENT names ..., a damaged version ... point it at a complete version' for the manifest or the
version directory (wrong advice: nothing is damaged), 78 for CURRENT and 2 (click's 'Path ... is not readable') for
OUT itself. Real FAISS and Parquet; each command in a process without the capabilities that bypass file modes.
"""

from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unreadable")
    flat = np.random.default_rng(2).standard_normal((50, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(50), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "v.parquet")
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(root / "v.parquet"), "--out",
                           str(root / "out"), "-q", "--vectors-column", "emb"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.save(root / "q.npy", np.ones((1, DIM), np.float32))
    return root


@pytest.mark.parametrize("target", ["OUT", "versions", "version", "CURRENT", "manifest.json", "index.faiss",
                                    "ids.parquet", "rejects.parquet"])
def test_a_path_of_the_index_petal_may_not_read_is_66_naming_it(built, tmp_path, target):
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    version = out / "versions" / str(OutputDir(out).current_version())
    path = {"OUT": out, "versions": out / "versions", "version": version, "CURRENT": out / "CURRENT"}.get(
        target, version / target)
    path.chmod(0)
    try:
        for argv in (["query", str(out), "--vector-file", str(built / "q.npy")], ["info", str(out)],
                     ["verify", str(out)], ["verify", str(out), "--json"]):
            proc = run_unprivileged(argv, tmp_path)
            assert proc.returncode == 66, (argv, proc.returncode, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr
            last = proc.stderr.strip().splitlines()[-1]
            assert str(path) in last, last
            assert "permission denied" in last and "damaged" not in last, last
            if "--json" in argv:
                assert json.loads(proc.stdout)["exit_code"] == 66
    finally:
        path.chmod(0o755)
