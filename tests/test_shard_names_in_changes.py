"""A shard is its absolute path with symlinks resolved, but the report, the summary and the --max-removed message
named shards by the path the user gave. A name given as a symbolic link that was switched to another file
(``data/a.parquet -> ext/v1.parquet``, then ``-> ext/v2.parquet``: the way a job publishes a new edition) names two
shards, and before, both were called ``data/a.parquet``: ``--sync`` refused 'shards not named with --sync
(data/a.parquet)' while the user named it, the report said it was added and removed, and an additive run said it
was added and kept. Now a name that stands for more than one shard of the comparison is said as the resolved path.
And ``petal info``'s rows add up to its vectors with the superseded rows said."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests import forkrun
from tests.fake_engine import make_fake_model_dir


@pytest.fixture
def switched(tmp_path) -> Path:
    """``data/a.parquet`` a link to ``ext/v1.parquet`` (ids v1-0..3), indexed, then switched to ``ext/v2.parquet``
    (ids v2-0..1); ``data/b.parquet`` a plain shard."""
    make_fake_model_dir(tmp_path / "model")
    (tmp_path / "data").mkdir()
    (tmp_path / "ext").mkdir()
    for name, rows in (("v1", 4), ("v2", 2)):
        table = pa.table({"id": [f"{name}-{i}" for i in range(rows)],
                          "text": [f"{name} text {i}" for i in range(rows)]})
        pq.write_table(table, tmp_path / "ext" / f"{name}.parquet")
    pq.write_table(pa.table({"id": ["b-0"], "text": ["b text"]}), tmp_path / "data" / "b.parquet")
    os.symlink(tmp_path / "ext" / "v1.parquet", tmp_path / "data" / "a.parquet")
    assert index(tmp_path).rc == 0
    os.unlink(tmp_path / "data" / "a.parquet")
    os.symlink(tmp_path / "ext" / "v2.parquet", tmp_path / "data" / "a.parquet")
    return tmp_path


def index(root: Path, *extra: str) -> forkrun.Result:
    return forkrun.petal(["index", root / "data" / "a.parquet", root / "data" / "b.parquet", "--out", root / "out",
                          "--model", root / "model", "-q", "--json-report", root / "report.json", *extra],
                         {"PETAL_TEST_FAKE_ENGINE": str(root / "fake.jsonl")})


def live_ids(out: Path) -> list[str]:
    return sorted(IndexReader(out).ids.column("id").to_pylist())


def test_sync_names_the_old_target_it_would_remove(switched):
    result = index(switched, "--sync")
    assert result.rc == 65, result.stderr
    old = str(switched / "ext" / "v1.parquet")
    assert f"1 shards not named with --sync ({old})" in result.last_line, result.last_line
    assert live_ids(switched / "out") == ["b-0", "v1-0", "v1-1", "v1-2", "v1-3"]

    result = index(switched, "--sync", "--max-removed", "100%")
    assert result.rc == 0, result.stderr
    changes = result.report["shard_changes"]
    assert changes["removed"] == [old]
    assert changes["added"] == [str(switched / "ext" / "v2.parquet")]
    assert changes["unchanged"] == [str(switched / "data" / "b.parquet")]
    assert live_ids(switched / "out") == ["b-0", "v2-0", "v2-1"]


def test_an_additive_run_names_the_kept_and_the_added_shard_apart(switched):
    result = index(switched)
    assert result.rc == 0, result.stderr
    changes = result.report["shard_changes"]
    assert changes["kept"] == [str(switched / "ext" / "v1.parquet")]
    assert changes["added"] == [str(switched / "ext" / "v2.parquet")]
    assert changes["unchanged"] == [str(switched / "data" / "b.parquet")]
    assert changes["removed"] == [] and changes["changed"] == []
    assert live_ids(switched / "out") == ["b-0", "v1-0", "v1-1", "v1-2", "v1-3", "v2-0", "v2-1"]


def test_info_text_counts_add_up_to_the_vectors(switched):
    """``petal info`` (text) said '5 read, 5 embedded, 0 deleted' over 4 vectors after an additive run whose two
    shards held the same ids: the superseded rows (the JSON's ``index.superseded``) were not said."""
    pq.write_table(pa.table({"id": ["b-0"], "text": ["b text again"]}), switched / "data" / "c.parquet")
    result = forkrun.petal(["index", switched / "data" / "b.parquet", switched / "data" / "c.parquet", "--out",
                            switched / "out", "--model", switched / "model", "-q"],
                           {"PETAL_TEST_FAKE_ENGINE": str(switched / "fake.jsonl")})
    assert result.rc == 0, result.stderr
    info = forkrun.petal(["info", switched / "out"])
    assert info.rc == 0, info.stderr
    assert "vectors      5 x" in info.stdout, info.stdout
    assert "6 read, 6 embedded, 0 truncated, 0 deleted, 1 superseded (" in info.stdout, info.stdout


def test_info_lists_two_shards_of_one_given_path_apart(switched):
    assert index(switched).rc == 0  # ext/v1.parquet kept, ext/v2.parquet added: both given as data/a.parquet
    info = forkrun.petal(["info", switched / "out"])
    assert info.rc == 0, info.stderr
    listed = [line.split()[0] for line in info.stdout.splitlines() if line.startswith("  /")]
    assert listed == [str(switched / "data" / "b.parquet"), str(switched / "ext" / "v1.parquet"),
                      str(switched / "ext" / "v2.parquet")], info.stdout
