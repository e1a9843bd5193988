"""A ``--sync`` run that drops a shard whose store entry is damaged (its vectors changed since the commit).

The removal guard reads the dropped shards' ids from their store entries. A damaged one was 'repaired' as if the run
would embed it again: a warning 'embedding the shard again' in a run that embedded nothing, the entry moved out, and
the guard counted none of its documents as removed, so ``--sync`` dropped half the index past the default 10% guard
with exit 0. Now the entry is read for its ids by its stat only (its vectors are never used), a damaged one is said as
what it is and left in place, and the guard counts the shard's documents from the manifest. Real Parquet and FAISS.
"""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.layout import OutputDir
from tests.index_data import vector_shard


def index(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["index", *argv, "-q", "--vectors-column", "emb"])
    return result.exit_code, result.output


def test_a_damaged_entry_of_a_dropped_shard_is_counted_by_the_guard_and_not_embedded_again(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for n in range(2):
        vector_shard(data, n)
    out = tmp_path / "out"
    assert index(str(data), "--out", str(out))[0] == 0
    live = OutputDir(out).current_version()
    (entry,) = [p.parent for p in (out / "store" / "shards").glob("*/*/entry.json") if "v1.parquet" in p.read_text()]
    vectors = np.load(entry / "embeddings.npy", mmap_mode="r+")
    vectors[0, 0] += 1.0
    vectors.flush()
    del vectors
    code, output = index(str(data / "v0.parquet"), "--out", str(out), "--sync")  # drops v1: 20 of 40, guard 10%
    assert code == 65, output
    assert "embedding the shard again" not in output
    assert f"{entry} is damaged" in output and "v1.parquet, which this run drops" in output
    assert (entry / "entry.json").is_file() and OutputDir(out).current_version() == live
    code, output = index(str(data / "v0.parquet"), "--out", str(out), "--sync", "--max-removed", "100%")
    assert code == 0 and "20 documents removed" in output, output
    assert "embedding the shard again" not in output
    assert OutputDir(out).current_version() != live
