"""An index built with one of FAISS's binary factories over float output (``--index-factory BFlat``/``BIVF4``, here
with ``--vectors-column``) opens and answers like a ``--quantize binary`` one: the writer builds what the factory
makes (a binary index and ``rescore.npy``), so opening judges the kind by the factory too. It was judged by
``output.quantize`` alone: every ``petal query``, ``petal verify`` and ``petal.open_index`` of such an index was 65
('its FAISS header says a binary (Hamming) index, the manifest a float one') right after ``petal index`` succeeded.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests import forkrun
from tests._open_audit_shared import api, index_vectors, vectors_shard

ROWS, DIM = 600, 32


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("binary_factory")
    path = root / "v.parquet"
    flat = vectors_shard(path, rows=ROWS, dim=DIM, seed=5)
    np.save(root / "q.npy", flat[[3, 300]])
    return path


@pytest.mark.parametrize("factory", ["BFlat", "BIVF4"])
def test_a_binary_factory_over_float_output_opens_in_every_command(data: Path, tmp_path: Path, factory: str) -> None:
    out = tmp_path / "out"
    index_vectors(data, out, "--index-factory", factory)
    query = forkrun.petal(["query", str(out), "--vector-file", str(data.parent / "q.npy"), "-k", "1", "--json"])
    assert query.rc == 0, query.stderr[-2000:]
    # each stored vector finds itself first (Hamming candidates rescored with rescore.npy's float16 rows)
    assert [json.loads(line)["hits"][0]["id"] for line in query.stdout.splitlines()] == [3, 300]
    verify = forkrun.petal(["verify", str(out)])
    assert verify.rc == 0, verify.stdout + verify.stderr
    info = forkrun.petal(["info", str(out)])
    assert info.rc == 0 and factory in info.stdout, info.stderr
    opened = api(out)
    assert opened.returncode == 0, opened.stderr[-2000:]
