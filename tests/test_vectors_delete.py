"""``petal index --vectors-column COL --delete IDS.parquet``: the same deletion rules as text runs
(tests/test_delete_ids.py), through the same code: ids not found are warned about, ids held only by shards that
``--sync`` drops (or a replaced shard no longer holds) count as deleted, a run the ``--max-removed`` guard refuses
leaves no tombstone behind, and the report says ``index.deleted``.

Through the real CLI; Parquet, store and FAISS are real; no model (precomputed vectors).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader

DIM = 8


def shard(path: Path, ids: list[int]) -> Path:
    vecs = np.random.default_rng(len(ids) + ids[0] if ids else 0).standard_normal((len(ids), DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                             "emb": pa.array([list(map(float, v)) for v in vecs], pa.list_(pa.float32()))}), path)
    return path


def deletes(path: Path, values: list) -> Path:
    pq.write_table(pa.table({"id": pa.array(values, pa.int64())}), path)
    return path


def index(out: Path, *args: str | Path) -> tuple[int, str, dict]:
    """``petal index ARGS --out OUT --vectors-column emb`` -> (exit code, stderr, report)."""
    report = out.parent / "report.json"
    report.unlink(missing_ok=True)
    result = CliRunner().invoke(cli, ["index", *map(str, args), "--out", str(out), "--vectors-column", "emb", "-q",
                                      "--json-report", str(report)])
    assert result.exit_code != 1, result.output  # never a bug
    return result.exit_code, result.stderr, json.loads(report.read_text())


def live_ids(out: Path) -> set:
    return set(IndexReader(out).ids.column("id").to_pylist())


def test_ids_not_in_the_index_are_warned_and_the_report_says_index_deleted(tmp_path):
    out = tmp_path / "out"
    a = shard(tmp_path / "a.parquet", list(range(20)))
    assert index(out, a)[0] == 0
    rc, stderr, report = index(out, a, "--delete", deletes(tmp_path / "d.parquet", [11, 999]))
    assert rc == 0, stderr
    assert live_ids(out) == set(range(20)) - {11}
    assert "1 of 2 ids are not in the index (e.g. 999)" in stderr, stderr
    assert report["index"]["deleted"] == 1 and "1 deleted" in stderr.strip().splitlines()[-1]
    assert report["deletes"]["deleted"] == 1 and report["deletes"]["not_found"] == 1
    assert report["deletes"]["sample_not_found"] == ["999"] and report["deletes"]["rows"] == 1
    # a later run that adds a shard keeps the deletion and says where the row went
    b = shard(tmp_path / "b.parquet", list(range(20, 25)))
    rc, stderr, report = index(out, b)
    last = stderr.strip().splitlines()[-1]
    assert rc == 0 and report["index"]["deleted"] == 1 and "1 deleted earlier" in last, last
    assert live_ids(out) == set(range(25)) - {11}


def test_sync_with_delete_counts_ids_of_dropped_shards_as_deleted(tmp_path):
    out = tmp_path / "out"
    a, b = shard(tmp_path / "a.parquet", list(range(20))), shard(tmp_path / "b.parquet", list(range(20, 40)))
    assert index(out, a, b)[0] == 0
    # 25 is in the live index, in b, which --sync drops: deleted as asked, not "not in the index"; 999 is nowhere
    rc, stderr, report = index(out, a, "--sync", "--max-removed", "50%",
                               "--delete", deletes(tmp_path / "d.parquet", [3, 25, 999]))
    assert rc == 0, stderr
    assert "1 of 3 ids are not in the index (e.g. 999)" in stderr and "25" not in stderr.splitlines()[0]
    assert report["deletes"]["deleted"] == 2 and report["deletes"]["not_found"] == 1
    assert report["deletes"]["sample_not_found"] == ["999"] and "2 deleted" in stderr
    assert report["removed"]["documents"] == 19  # b's other ids (the one asked for is not the guard's)
    assert report["removed"]["of"] == report["index"]["num_vectors"] + report["rows"]["deleted"] + 19 == 40
    assert live_ids(out) == set(range(20)) - {3}


def test_delete_of_an_id_gone_from_a_replaced_shard_is_not_called_missing(tmp_path):
    out = tmp_path / "out"
    a = shard(tmp_path / "a.parquet", list(range(10)))
    assert index(out, a)[0] == 0
    shard(a, list(range(8)))  # 8 and 9 are gone from the new content; 9 is also asked for
    rc, stderr, report = index(out, a, "--delete", deletes(tmp_path / "d.parquet", [9]))
    assert rc == 0, stderr
    assert "warning" not in stderr and report["deletes"]["not_found"] == 0 and report["deletes"]["deleted"] == 1
    assert report["removed"]["replaced"] == 1 and live_ids(out) == set(range(8))


def test_a_delete_refused_by_the_guard_deletes_nothing_later(tmp_path):
    out = tmp_path / "out"
    a, b = shard(tmp_path / "a.parquet", list(range(20))), shard(tmp_path / "b.parquet", list(range(20, 40)))
    assert index(out, a, b)[0] == 0
    rc, stderr, report = index(out, a, "--sync", "--delete", deletes(tmp_path / "d.parquet", [1, 2, 3]))
    last = stderr.strip().splitlines()[-2]  # the summary line (the error follows it)
    assert rc == 65 and "Nothing was published" in stderr and report["removed"]["documents"] == 20, stderr
    assert "deleted" not in last and "documents removed" not in last, last  # neither happened
    assert not list((out / "store").rglob("deleted/*/*.parquet"))  # no tombstone left behind
    # the user answers the refusal another way: the deletion they gave up on does not happen behind their back
    rc, stderr, report = index(out, a, b)
    assert rc == 0 and report["status"] == "nothing-to-do" and live_ids(out) == set(range(40)), stderr
    rc, stderr, report = index(out, a, b, "--delete", tmp_path / "d.parquet")  # asked again, it holds
    assert rc == 0 and live_ids(out) == set(range(40)) - {1, 2, 3} and "3 deleted" in stderr, stderr
    assert report["index"]["deleted"] == 3
