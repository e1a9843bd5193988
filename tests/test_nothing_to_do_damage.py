"""A rerun with nothing to do never leaves a live version that cannot be opened behind an exit 0.

``petal index --vectors-column`` reported ``nothing-to-do`` (exit 0) over a live version whose ``index.faiss`` was
truncated, swapped or unreadable: every query failed (65) while every rerun said all was well. Text runs checked
the live version in full and rebuilt it from the store; now runs of precomputed vectors do the same (one check,
``index_run.nothing_to_publish``). And for text runs, the variants a user meets: a file this user may not read
(``chmod 000``, in a process without the capabilities that bypass file modes), a garbage id map, a missing file.
Real ``petal index`` and ``petal query`` processes, real Parquet and FAISS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests.conftest import REPO
from tests.fake_engine import embedded_ids, make_fake_model_dir

DIM = 8


def petal(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
          unprivileged: bool = False) -> subprocess.CompletedProcess:
    """``petal ARGV`` in a real process: forked from the preloaded interpreter (tests/forkrun.py), or (``unprivileged``)
    a fresh one that cannot read a file its mode denies (as root: without the capabilities that bypass it)."""
    if not unprivileged:
        done = forkrun.petal(argv, dict(env or {}))
        return subprocess.CompletedProcess(argv, done.rc, done.stdout, done.stderr)
    command = [sys.executable, "-m", "tests.fake_cli", *argv]
    if os.geteuid() == 0:  # root reads a chmod 000 file: drop the capabilities that allow it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: a file's mode cannot deny root a read")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def live_file(out: Path, name: str) -> Path:
    version = OutputDir(out).current_version()
    assert version is not None
    return out / "versions" / version / name


@pytest.fixture
def vectors(tmp_path) -> tuple[list[str], Path]:
    data = tmp_path / "data"
    data.mkdir()
    for n in range(2):
        flat = np.random.default_rng(n).standard_normal((30, DIM)).astype(np.float32).ravel()
        pq.write_table(pa.table({"id": np.arange(30) + 100 * n,
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                       data / f"v{n}.parquet")
    query = tmp_path / "q.npy"
    np.save(query, np.ones((1, DIM), np.float32))
    argv = ["index", str(data), "--out", str(tmp_path / "out"), "-q", "--vectors-column", "emb"]
    first = petal(argv, tmp_path)
    assert first.returncode == 0, first.stderr
    return argv, query


@pytest.mark.parametrize("damage", ["truncated", "garbage ids", "missing"])
def test_a_vectors_rerun_rebuilds_a_damaged_live_version_from_the_store(vectors, tmp_path, damage):
    argv, query = vectors
    out = tmp_path / "out"
    before = OutputDir(out).current_version()
    if damage == "truncated":
        index = live_file(out, "index.faiss")
        index.write_bytes(index.read_bytes()[:100])
    elif damage == "garbage ids":
        live_file(out, "ids.parquet").write_bytes(b"garbage")
    else:
        live_file(out, "index.faiss").unlink()
    broken = petal(["query", str(out), "--vector-file", str(query)], tmp_path)
    assert broken.returncode in (65, 78), broken.stderr  # what queries met before the rerun
    rerun = petal(argv, tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    last = rerun.stderr.strip().splitlines()[-1]
    assert "success" in last and "the damaged live version was rebuilt from the store" in last, rerun.stderr
    assert "warning: the live version is damaged" in rerun.stderr
    assert OutputDir(out).current_version() != before
    answered = petal(["query", str(out), "--vector-file", str(query), "-k", "3"], tmp_path)
    assert answered.returncode == 0 and len(answered.stdout.strip().splitlines()) >= 3, answered.stderr
    again = petal(argv, tmp_path)  # and then there is nothing to do
    assert again.returncode == 0 and "nothing-to-do" in again.stderr.strip().splitlines()[-1], again.stderr


@pytest.mark.parametrize("name", ["index.faiss", "ids.parquet"])
def test_a_text_rerun_rebuilds_a_live_file_this_user_may_not_read(tmp_path, name):
    model = make_fake_model_dir(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(10)], "text": [f"doc {i} words" for i in range(10)]}),
                   data / "a.parquet")
    log = tmp_path / "fake.jsonl"
    argv = ["index", str(data), "--out", str(tmp_path / "out"), "--model", str(model), "-q"]
    assert petal(argv, tmp_path, {"PETAL_TEST_FAKE_ENGINE": str(log)}).returncode == 0
    log.unlink()
    unreadable = live_file(tmp_path / "out", name)
    unreadable.chmod(0)
    try:
        rerun = petal(argv, tmp_path, {"PETAL_TEST_FAKE_ENGINE": str(log)}, unprivileged=True)
    finally:
        unreadable.chmod(0o644)
    assert rerun.returncode == 0, rerun.stderr
    assert "permission denied" in rerun.stderr and str(unreadable) in rerun.stderr
    assert "the damaged live version was rebuilt from the store" in rerun.stderr.strip().splitlines()[-1]
    assert embedded_ids(log) == []  # rebuilt from the store: nothing embedded again
    assert live_file(tmp_path / "out", name) != unreadable
