"""A store entry's ``entry.json`` nested past Python's recursion limit ('[[[[...', damaged or planted) is a damaged
entry as any other JSON it cannot read: ``petal index`` says so and embeds the shard again (exit 0), ``petal rebuild``
refuses it naming it (65). Before: ``json.loads`` raised ``RecursionError``, a traceback (exit 1) in both.

Real ``petal`` processes, real Parquet and FAISS (an index of precomputed vectors: no model).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import REPO


def petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_entry_json_nested_too_deeply_is_a_damaged_entry(tmp_path):
    flat = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32).ravel()
    shard = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": np.arange(6), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), 4)}), shard)
    out = tmp_path / "out"
    flags = ["--out", out, "-q", "--vectors-column", "emb"]
    assert petal("index", shard, *flags).returncode == 0
    (entry,) = (out / "store" / "shards").glob("*/*/entry.json")
    deep = "[" * 100_000 + "]" * 100_000

    entry.write_text(deep)
    rebuilt = petal("rebuild", out)
    assert rebuilt.returncode == 65, rebuilt.stderr[-3000:]
    assert f"the store entry {entry.parent} is damaged (JSON nested too deeply)" in rebuilt.stderr.splitlines()[-1]

    again = petal("index", shard, *flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"the store entry {entry.parent} is damaged (JSON nested too deeply); embedding the shard again" \
        in again.stderr
    assert entry.read_text() != deep  # the shard's entry was written again
