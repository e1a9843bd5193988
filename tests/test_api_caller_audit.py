"""The Python API as a caller's process uses it (an audit, 2026-12-05): each case here went wrong before.

- An index opened by a relative path followed the caller's working directory: after a ``chdir``, ``reopened()``
  read another directory's CURRENT (it returned another index, or missed a new version) and ``path`` named it.
- ``ray_address`` without ``ray=True`` was dropped (the run went to worker processes); with Ray connected already in
  the process, a ``ray_address`` naming another cluster was ignored (the run used the cluster connected).
- A one-element numpy array for an integer argument (``k``, ``nprobe``) was a bare ``TypeError``.
- A closed ``Index`` still answered ``num_truncated``/``num_over_chars`` and entered a ``with`` block.

Real FAISS and Parquet (indexes of precomputed vectors, no model); a real local Ray in a child process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.reliability.errors import UsageError


def _shard(path: Path, rows: int, seed: int = 0) -> np.ndarray:
    flat = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(rows), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()),
                                                                                             8)}), path)
    return flat


def test_an_index_opened_by_a_relative_path_stays_where_it_was_opened(tmp_path, monkeypatch):
    for name, rows in (("a", 30), ("b", 49)):
        (tmp_path / name).mkdir()
        _shard(tmp_path / name / "v.parquet", rows)
        petal.index(tmp_path / name / "v.parquet", tmp_path / name / "idx", vectors_column="emb",
                    index_factory="Flat", quiet=True)
    monkeypatch.chdir(tmp_path / "a")
    index = petal.open_index("idx")
    first = index.path
    monkeypatch.chdir(tmp_path / "b")
    assert index.path == first and index.path.is_relative_to(tmp_path / "a"), index.path
    assert index.reopened() is None  # b's CURRENT is no concern of it
    petal.rebuild(tmp_path / "a" / "idx", index_factory="IVF2,Flat", quiet=True)  # a new version of a
    fresh = index.reopened()
    assert fresh is not None and fresh.num_vectors == 30 and fresh.path.is_relative_to(tmp_path / "a"), fresh
    fresh.close()
    index.close()


def test_ray_address_without_ray_is_a_usage_error(tmp_path):
    _shard(tmp_path / "v.parquet", 20)
    with pytest.raises(UsageError, match=re.escape("ray_address '127.0.0.1:1' goes with ray=True")):
        petal.index(tmp_path / "v.parquet", tmp_path / "out", vectors_column="emb", ray_address="127.0.0.1:1",
                    quiet=True)
    assert not (tmp_path / "out" / "CURRENT").exists()


RAY_SCRIPT = r"""
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import ray
import petal
from petal.pipeline.reliability.errors import UsageError
root = sys.argv[1]
pq.write_table(pa.table({"id": np.arange(3), "text": ["glaciers move", "bread rises", "lava flows"]}),
               f"{root}/t.parquet")
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    petal.index(f"{root}/t.parquet", f"{root}/out", ray=True, ray_address="127.0.0.1:1", quiet=True)
except UsageError as exc:
    print("refused:", exc)
else:
    print("ran")
ray.shutdown()
"""


def test_ray_address_of_another_cluster_than_the_one_connected_is_a_usage_error(tmp_path, minilm_dir):
    pytest.importorskip("ray")
    done = subprocess.run([sys.executable, "-c", RAY_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: ray_address '127.0.0.1:1': this process is connected to the Ray cluster at" in done.stdout, \
        done.stdout + done.stderr[-2000:]
    assert not (tmp_path / "out" / "CURRENT").exists()


def test_integer_arguments_as_arrays_and_a_closed_index(tmp_path):
    flat = _shard(tmp_path / "v.parquet", 40)
    petal.index(tmp_path / "v.parquet", tmp_path / "out", vectors_column="emb", index_factory="IVF2,Flat",
                quiet=True)
    with pytest.raises(UsageError, match="nprobe array"):
        petal.open_index(tmp_path / "out", nprobe=np.array([2]))
    index = petal.open_index(tmp_path / "out", nprobe=np.int64(2))
    with pytest.raises(UsageError, match="k array"):
        index.search(flat[:1], k=np.array([3]))
    assert len(index.search(flat[:1], k=np.array(3))[0]) == 3  # a 0-d integer array is an integer
    index.close()
    for use in (lambda: index.num_truncated, lambda: index.num_over_chars, lambda: index.__enter__()):
        with pytest.raises(UsageError, match="was closed"):
            use()
