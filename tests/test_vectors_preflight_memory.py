"""Preflight of a --vectors-column run reads a few rows of each list shard to find its dimension
(pipeline/ingest/vectors.py ``_shard_dim``), not a whole record batch: before, it decoded each shard's first batch
(4096 rows: 16 MB of 1024-d float32 vectors per shard) before any work. Measured by the Arrow pool's own peak
(``max_memory``) in a fresh interpreter; real Parquet files written with small pages, as most writers write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
RUN = """
import json, sys
from pathlib import Path
import pyarrow as pa
from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.vectors import preflight_vectors
infos, dim = preflight_vectors([Path(sys.argv[1])], ReadConfig(), "emb")
print(json.dumps({"dim": dim, "peak": pa.default_memory_pool().max_memory()}))
"""


def test_the_dimension_is_found_from_a_few_rows(tmp_path):
    dim, rows = 1024, 4096
    values = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), dim).cast(pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": np.arange(rows), "emb": emb}), tmp_path / "a.parquet", write_batch_size=64,
                   data_page_size=256 << 10)
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "a.parquet")], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["dim"] == dim
    assert said["peak"] < 8 * MB, said["peak"] / MB  # the rows it found the dimension in: 37 MB before
