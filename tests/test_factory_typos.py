"""``--index-factory`` strings FAISS parses but cannot use, or cannot parse, are a usage error (2) before any work,
in FAISS's words without its C++ source location:

- a typo that starts with ``B`` (``Bogus``) was tried as a binary factory, so the error quoted
  ``index_binary_factory`` for a float index;
- a zero count (``IVF0``, ``HNSW0``, ``NSG0``, ``PQ8x0``) was accepted, then failed after the whole run (78, FAISS's
  assertion text), or hung (``NSG0``).

Real ``petal index --vectors-column`` processes (no model), real FAISS; the binary factories themselves still build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

PETAL = str(Path(sys.executable).parent / "petal")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("factory-typos") / "data"
    data.mkdir()
    vectors = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(300)],
                             "emb": pa.array(list(vectors), pa.list_(pa.float32()))}), data / "a.parquet")
    return data


def index(data: Path, out: Path, factory: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([PETAL, "index", str(data), "--out", str(out), "--vectors-column", "emb", "-q",
                           "--index-factory", factory], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.mark.parametrize("factory", ["Bogus", "Bflat", "BIVFx"])
def test_a_typo_starting_with_b_is_judged_as_a_float_factory(data, tmp_path, factory):
    done = index(data, tmp_path / "out", factory)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and f"--index-factory {factory!r} is not a valid FAISS factory string" in last, last
    assert "index_binary_factory" not in last and "Error in" not in last and ".cpp" not in last, last
    assert not (tmp_path / "out" / "CURRENT").exists()


@pytest.mark.parametrize("factory, zero", [("IVF0,Flat", "IVF0"), ("HNSW0", "HNSW0"), ("NSG0", "NSG0"),
                                           ("IVF4,PQ8x0", "x0"), ("IVF4_HNSW0,Flat", "HNSW0"), ("BIVF0", "BIVF0")])
def test_a_zero_count_is_refused_before_any_work(data, tmp_path, factory, zero):
    done = index(data, tmp_path / "out", factory)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and f"--index-factory {factory!r}: {zero} asks for zero" in last, last
    assert not (tmp_path / "out" / "store").exists()  # nothing read or written


@pytest.mark.parametrize("factory", ["BFlat", "BIVF4", "BHNSW8", "IVF10,Flat", "HNSW32"])
def test_valid_factories_still_build(data, tmp_path, factory):
    done = index(data, tmp_path / "out", factory)
    assert done.returncode == 0 and f"in {factory};" in done.stdout + done.stderr, done.stderr
