"""Bounded memory (RELIABILITY.md promise 9) in the read and tokenize window of ``petal index``: the texts read and
not yet tokenized stay within ``ReadConfig.max_batch_bytes`` (64 MiB) as a whole, whatever the documents' size.
Before, each record batch was 64 MB of text and the window held several (the tokenize window of four, the batch
being read, Arrow's buffers of it): 100 KB documents took ~750 MB over the process's baseline.

Measured as the peak RSS of a real ``petal index`` process (the tests' fake engine) stopped after its shard is
committed (``PETAL_FAULT=after_shard_commit``: before the stored text is written, which is not this window), less
the peak of the same run over a tiny shard; no timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.config import ReadConfig
from tests.fake_engine import fake_engine_factory, make_fake_model_dir

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
BUDGET = ReadConfig().max_batch_bytes


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def long_documents(rows: int, size: int) -> pa.Table:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    base = " ".join(words[(i * 7) % len(words)] for i in range(size // 4))
    return pa.table({"id": [f"d{i}" for i in range(rows)], "text": [(f"doc{i} " + base[i % 997:])[:size]
                                                                   for i in range(rows)]})


# the child says its own high-water mark (VmHWM: this program's, never the forking parent's as ru_maxrss can be)
CLI = ("import atexit, sys\n"
       "def hwm():\n"
       "    status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
       "    print('VmHWM', status, file=sys.stderr)\n"
       "atexit.register(hwm)\n"
       "from tests.fake_cli import main\n"
       "main(sys.argv[1:])\n")


def peak_rss(data: Path, out: Path, model: Path, stop: bool = True) -> int:
    """Peak RSS (bytes) of ``petal index data`` stopped after its first shard commit (``stop``), else run whole."""
    env = {**os.environ, "PETAL_TEST_FAKE_ENGINE": str(out.parent / f"{out.name}.log"), "PETAL_TOKENIZE_WORKERS": "2"}
    env.pop("PETAL_FAULT", None)
    if stop:
        env["PETAL_FAULT"] = "after_shard_commit:1:raise"
    done = subprocess.run([sys.executable, "-c", CLI, "index", str(data), "--out", str(out), "--model", str(model),
                           "-q"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if stop:
        assert "after_shard_commit" in done.stderr, done.stderr  # stopped where the test stops it, after embedding
        assert (out / "store").exists(), done.stderr
    else:
        assert done.returncode == 0 and (out / "CURRENT").exists(), done.stderr  # published
    return int(done.stderr.rsplit("VmHWM", 1)[1].split()[0]) * 1024


def test_long_documents_are_read_and_tokenized_within_the_budget(tmp_path, model):
    write = pq.write_table
    (tmp_path / "tiny").mkdir()
    write(long_documents(10, 1000), tmp_path / "tiny" / "a.parquet")
    (tmp_path / "big").mkdir()
    write(long_documents(1200, 100_000), tmp_path / "big" / "a.parquet", write_batch_size=16)  # 120 MB of text
    baseline = peak_rss(tmp_path / "tiny", tmp_path / "out-tiny", model)
    peak = peak_rss(tmp_path / "big", tmp_path / "out-big", model)
    grown = peak - baseline
    assert grown < 3 * BUDGET, (f"the read and tokenize window took {grown / MB:.0f} MB over the baseline "
                                f"({baseline / MB:.0f} MB), more than 3 x the {BUDGET / MB:.0f} MB budget")


def test_the_window_changes_no_vector(tmp_path, model):
    sizes = [50, 100_000, 10, 30_000, 200_000, 7, 5_000] * 6
    table = long_documents(len(sizes), 200_000)
    table = table.set_column(1, "text", pa.array([t[:n] for t, n in zip(table.column("text").to_pylist(), sizes)]))
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "a.parquet", row_group_size=20)
    vectors = []
    for name, budget in (("whole", 1 << 40), ("rows", 1)):  # one record batch a row group; one row a batch
        out = tmp_path / name
        petal.index([tmp_path / "data"], out=out, model=model, quiet=True, max_batch_bytes=budget,
                    engine_factory=fake_engine_factory(None))
        version = out / "versions" / (out / "CURRENT").read_text().strip()
        index = faiss.read_index(str(version / "index.faiss"))
        ids = pq.read_table(version / "ids.parquet", columns=["id"]).column("id").to_pylist()
        vectors.append((ids, index.reconstruct_n(0, index.ntotal)))
    assert vectors[0][0] == vectors[1][0] == [f"d{i}" for i in range(len(sizes))]
    np.testing.assert_array_equal(vectors[0][1], vectors[1][1])
