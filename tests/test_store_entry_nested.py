"""A store entry's ``entry.json`` nested past Python's recursion limit ('[[[[...', damaged or planted) is a damaged
entry as any other JSON it cannot read: ``petal index`` says so and embeds the shard again (exit 0), ``petal rebuild``
refuses it naming it (65). Before: ``json.loads`` raised ``RecursionError``, a traceback (exit 1) in both. So is JSON
whose fields a run reads later are not what petal wrote (``counts.skipped`` not an object of counts, ``truncated`` or
``source.abs_path`` gone): an ``AttributeError`` or ``KeyError`` traceback (exit 1) where the run used them.

Real ``petal`` processes, real Parquet and FAISS (an index of precomputed vectors: no model).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
    said = f"the store entry {entry.parent} is damaged (entry.json: JSON nested too deeply)"
    assert said in rebuilt.stderr.splitlines()[-1]

    again = petal("index", shard, *flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{said}; embedding the shard again" in again.stderr
    assert entry.read_text() != deep  # the shard's entry was written again


def _skipped_text(meta: dict) -> None:
    meta["counts"]["skipped"] = "oops"


def _skipped_values(meta: dict) -> None:
    meta["counts"]["skipped"] = {"null_id": "many"}


def _no_truncated(meta: dict) -> None:
    del meta["counts"]["truncated"]


def _no_abs_path(meta: dict) -> None:
    del meta["source"]["abs_path"]


@pytest.mark.parametrize("damage", [_skipped_text, _skipped_values, _no_truncated, _no_abs_path])
def test_entry_json_fields_a_run_reads_are_checked(tmp_path, damage):
    flat = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32).ravel()
    shard = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": np.arange(6), "text": [f"t{i}" for i in range(6)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), 4)}), shard)
    out = tmp_path / "out"
    flags = ["--out", out, "-q", "--vectors-column", "emb"]
    assert petal("index", shard, *flags).returncode == 0
    (entry,) = (out / "store" / "shards").glob("*/*/entry.json")
    meta = json.loads(entry.read_text())
    damage(meta)
    entry.write_text(json.dumps(meta))

    rebuilt = petal("rebuild", out)
    assert rebuilt.returncode == 65, rebuilt.stderr[-3000:]
    assert f"the store entry {entry.parent} is damaged" in rebuilt.stderr.splitlines()[-1]
    again = petal("index", shard, *flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"the store entry {entry.parent} is damaged" in again.stderr
