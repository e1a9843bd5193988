"""``--nprobe`` past an IVF's lists probes every list, at no more memory: FAISS's fast-scan IVF search sizes its coarse
results by nprobe, so ``petal query --nprobe 2147483647`` (the flag's documented bound) on an IVF4,PQ8x4fs index
asked for tens of GB and was killed out of memory (std::bad_alloc, SIGABRT, under a 4 GiB limit); --nprobe 10^8
took 3.9 GB for 342 vectors. Real Parquet, real FAISS, the CLI in a process of its own under a memory limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests.conftest import REPO

LIMIT = 4 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


@pytest.mark.parametrize("factory", ["IVF4,PQ8x4fs", "IVF4,Flat"])
def test_an_nprobe_past_the_lists_probes_every_list_in_bounded_memory(tmp_path, factory):
    vectors = np.random.default_rng(0).standard_normal((400, 16)).astype(np.float32)
    pq.write_table(pa.table({"id": list(range(400)),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 16)}),
                   tmp_path / "a.parquet")
    petal.index(tmp_path / "a.parquet", tmp_path / "out", vectors_column="emb", index_factory=factory,
                target_recall=0.5, quiet=True)
    np.save(tmp_path / "q.npy", vectors[:2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}
    env.update(OMP_NUM_THREADS="2", MALLOC_ARENA_MAX="2")  # NOTE: the limit is on address space: keep it small
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "query", str(tmp_path / "out"), "--vector-file",
                           str(tmp_path / "q.npy"), "--nprobe", str(2**31 - 1), "-k", "400", "--json"],
                          capture_output=True, text=True, cwd=REPO, env=env, preexec_fn=_limited, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-1000:])
    answers = done.stdout.splitlines()
    assert len(answers) == 2 and all(answer.count('"rank"') == 400 for answer in answers)
    with petal.open_index(tmp_path / "out", nprobe=2**31 - 1) as index:
        assert index.reader.search_params["nprobe"] == 4  # every list, said as what it is
