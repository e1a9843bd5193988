"""``--delete IDS.parquet`` read as the index's ids are, ``--sync``/replaced shards with ``--delete``, and the
counts that say where rows went: the summary line after deletes (``--full``, kept shards), ``petal rebuild``'s
report.

Through the CLI (and ``petal.index``) with the tests' fake engine (tests/fake_engine.py); Parquet, store and
FAISS are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.index.search import IndexReader
from petal.pipeline.reliability.errors import BadInputError
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import fake_engine_factory, make_fake_model_dir, read_log


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def index(tmp_path, fake_model):
    """``index(*args)`` -> (exit code, stderr, report, engine log records) for --out tmp/out."""
    def run(*args: str | Path, out: Path | None = None):
        out = out or tmp_path / "out"
        report, log = tmp_path / "report.json", tmp_path / "fake.jsonl"
        report.unlink(missing_ok=True)
        log.unlink(missing_ok=True)
        result = fake_invoke(["index", *map(str, args), "--out", str(out), "--model", str(fake_model),
                              "-q", "--json-report", str(report)], env={"PETAL_TEST_FAKE_ENGINE": str(log)})
        assert result.exit_code != 1, result.output  # never a bug
        return result.exit_code, result.stderr, json.loads(report.read_text()), read_log(log)

    return run


def int_shard(path: Path, ids: list[int]) -> Path:
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": [f"document {i}" for i in ids]}), path)
    return path


def text_shard(path: Path, ids: list[str]) -> Path:
    pq.write_table(pa.table({"id": ids, "text": [f"document {i!r}" for i in ids]}), path)
    return path


def deletes(path: Path, values: list, type_: pa.DataType | None = None) -> Path:
    pq.write_table(pa.table({"id": pa.array(values, type_)}), path)
    return path


def live_ids(out: Path) -> set:
    return set(IndexReader(out).ids.column("id").to_pylist())


def test_integer_ids_are_deleted_by_value_whatever_the_file_writes(tmp_path, index):
    a = int_shard(tmp_path / "a.parquet", list(range(20)))
    assert index(a)[0] == 0
    # text that is an integer is that integer: leading zeros, a sign, surrounding blanks; an integer column too
    rc, stderr, report, _ = index(a, "--delete", deletes(tmp_path / "d.parquet", ["007", " 8 ", "+9", "10", "7", None]))
    assert rc == 0, stderr
    assert live_ids(tmp_path / "out") == set(range(20)) - {7, 8, 9, 10}
    assert report["deletes"]["requested"] == 4 and report["deletes"]["deleted"] == 4  # "007" and "7" are one id
    assert report["deletes"]["not_found"] == 0 and "warning" not in stderr and "4 deleted" in stderr
    rc, stderr, report, _ = index(a, "--delete", deletes(tmp_path / "n.parquet", [11, 999], pa.int64()))
    assert rc == 0 and 11 not in live_ids(tmp_path / "out")
    assert report["deletes"]["not_found"] == 1 and report["deletes"]["sample_not_found"] == ["999"]
    assert "1 of 2 ids are not in the index (e.g. 999)" in stderr


@pytest.mark.parametrize("value, why", [
    ("7.0", "is not an integer"), ("1e1", "is not an integer"), ("seven", "is not an integer"),
    ("", "is not an integer"), ("1_000", "is not an integer"), ("0x7", "is not an integer"),
    ("99999999999999999999", "out of the int64 range"),
])
def test_a_value_that_is_not_an_integer_id_is_65_naming_file_and_row(tmp_path, index, value, why):
    a = int_shard(tmp_path / "a.parquet", list(range(10)))
    assert index(a)[0] == 0
    before = (tmp_path / "out" / "CURRENT").read_text()
    bad = deletes(tmp_path / "bad ids.parquet", ["3", value])
    rc, stderr, _, log = index(a, "--delete", bad)
    last = stderr.strip().splitlines()[-1]
    assert rc == 65 and str(bad) in last and "row 1" in last and why in last, stderr
    assert not log and (tmp_path / "out" / "CURRENT").read_text() == before  # before the model; nothing published
    assert live_ids(tmp_path / "out") == set(range(10)) and not list((tmp_path / "out").rglob("deleted/*/*.parquet"))


def test_uint64_ids_past_int64_are_65(tmp_path, index):
    a = int_shard(tmp_path / "a.parquet", list(range(10)))
    assert index(a)[0] == 0
    rc, stderr, _, _ = index(a, "--delete", deletes(tmp_path / "d.parquet", [1, 2**63], pa.uint64()))
    assert rc == 65 and "row 1" in stderr and "above the largest id" in stderr
    assert live_ids(tmp_path / "out") == set(range(10))


def test_string_ids_are_deleted_by_exact_text(tmp_path, index):
    a = text_shard(tmp_path / "a.parquet", ["1", "01", "1.0", "a-1", "A-2", " b"])
    assert index(a)[0] == 0
    rc, stderr, report, _ = index(a, "--delete", deletes(tmp_path / "d.parquet", ["01", " a-1", "a-2", " b"]))
    assert rc == 0, stderr
    assert live_ids(tmp_path / "out") == {"1", "1.0", "a-1", "A-2"}
    assert report["deletes"]["deleted"] == 2 and report["deletes"]["not_found"] == 2
    # an integer matches no string id exactly (1 could be "1" or "01"): refused, nothing deleted
    rc, stderr, _, _ = index(a, "--delete", deletes(tmp_path / "i.parquet", [1], pa.int64()))
    assert rc == 65 and "holds integers" in stderr and "ids are strings" in stderr
    assert live_ids(tmp_path / "out") == {"1", "1.0", "a-1", "A-2"}


def test_the_python_api_reads_delete_ids_the_same_way(tmp_path, fake_model):
    a = int_shard(tmp_path / "a.parquet", list(range(10)))
    out, engine = tmp_path / "out", fake_engine_factory(None)
    petal.index(a, out, model=str(fake_model), quiet=True, engine_factory=engine)
    report = petal.index(a, out, model=str(fake_model), quiet=True, engine_factory=engine,
                         delete=deletes(tmp_path / "d.parquet", ["003", " 4"]))
    assert report.deletes["deleted"] == 2 and live_ids(out) == set(range(10)) - {3, 4}
    with pytest.raises(BadInputError, match="row 0"):
        petal.index(a, out, model=str(fake_model), quiet=True, engine_factory=engine,
                    delete=deletes(tmp_path / "bad.parquet", ["5.0"]))


def test_precomputed_vectors_read_delete_ids_the_same_way(tmp_path):
    vectors = [[float(i == j) for j in range(8)] for i in range(8)]
    pq.write_table(pa.table({"id": pa.array(range(8), pa.int64()), "emb": pa.array(vectors, pa.list_(pa.float32()))}),
                   tmp_path / "a.parquet")
    base = ["index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "--vectors-column", "emb", "-q"]
    assert fake_invoke(base).exit_code == 0
    result = fake_invoke([*base, "--delete", str(deletes(tmp_path / "d.parquet", ["002"]))])
    assert result.exit_code == 0, result.output
    assert live_ids(tmp_path / "out") == set(range(8)) - {2}
    result = fake_invoke([*base, "--delete", str(deletes(tmp_path / "bad.parquet", ["2.5"]))])
    assert result.exit_code == 65 and "row 0" in result.stderr, result.output
    assert live_ids(tmp_path / "out") == set(range(8)) - {2}


def test_sync_with_delete_counts_ids_of_dropped_shards_as_deleted(tmp_path, index):
    a, b = int_shard(tmp_path / "a.parquet", list(range(20))), int_shard(tmp_path / "b.parquet", list(range(20, 40)))
    assert index(a, b)[0] == 0
    # 25 is in the live index, in b, which --sync drops: deleted as asked, not "not in the index"; 999 is nowhere
    rc, stderr, report, _ = index(a, "--sync", "--max-removed", "50%",
                                  "--delete", deletes(tmp_path / "d.parquet", [3, 25, 999], pa.int64()))
    assert rc == 0, stderr
    assert "1 of 3 ids are not in the index (e.g. 999)" in stderr and "25" not in stderr.splitlines()[0]
    assert report["deletes"]["deleted"] == 2 and report["deletes"]["not_found"] == 1
    assert report["deletes"]["sample_not_found"] == ["999"] and "2 deleted" in stderr
    assert report["removed"]["documents"] == 19  # b's other ids (the one asked for is not the guard's)
    # every document of the live version is accounted for: kept, deleted or removed with its shard
    assert report["removed"]["of"] == report["index"]["num_vectors"] + report["rows"]["deleted"] + 19 == 40
    assert live_ids(tmp_path / "out") == set(range(20)) - {3}


def test_delete_of_an_id_gone_from_a_replaced_shard_is_not_called_missing(tmp_path, index):
    a = int_shard(tmp_path / "a.parquet", list(range(10)))
    assert index(a)[0] == 0
    int_shard(a, list(range(8)))  # 8 and 9 are gone from the new content; 9 is also asked for
    rc, stderr, report, _ = index(a, "--delete", deletes(tmp_path / "d.parquet", [9], pa.int64()))
    assert rc == 0, stderr
    assert "warning" not in stderr and report["deletes"]["not_found"] == 0 and report["deletes"]["deleted"] == 1
    assert report["removed"]["replaced"] == 1 and live_ids(tmp_path / "out") == set(range(8))


def test_summary_accounts_for_rows_deleted_earlier_and_kept_rows(tmp_path, index):
    a, b = int_shard(tmp_path / "a.parquet", list(range(20))), int_shard(tmp_path / "b.parquet", list(range(20, 40)))
    c = int_shard(tmp_path / "c.parquet", list(range(40, 45)))
    assert index(a, b)[0] == 0
    rc, stderr, report, _ = index(a, b, "--delete", deletes(tmp_path / "d.parquet", [1, 22], pa.int64()))
    assert rc == 0 and "2 deleted" in stderr and "deleted earlier" not in stderr  # said once, by this run
    # an additive run: the kept shards' rows and the rows deleted earlier are said, so the counts add up
    rc, stderr, report, _ = index(c)
    last = stderr.strip().splitlines()[-1]
    assert rc == 0 and "5 rows embedded, 40 kept," in last and "2 deleted earlier" in last, last
    assert "43 vectors" in last and report["index"]["deleted"] == 2
    # --full re-embeds every shard; the deletions hold, and the summary says where the 2 rows went
    rc, stderr, report, _ = index(c, "--full")
    last = stderr.strip().splitlines()[-1]
    assert rc == 0 and "45 rows embedded" in last and "43 vectors" in last and "2 deleted earlier" in last, last
    assert report["rows"]["embedded"] - report["index"]["deleted"] == report["index"]["num_vectors"] == 43


def test_rebuild_report_counts_the_rows_of_the_version(tmp_path, index):
    a = pa.table({"id": pa.array(range(12), pa.int64()), "text": [f"document {i}" for i in range(10)] + [None, ""]})
    pq.write_table(a, tmp_path / "a.parquet")
    b = int_shard(tmp_path / "b.parquet", list(range(20, 30)))
    assert index(tmp_path / "a.parquet", b)[0] == 0
    rc, _, indexed, _ = index(tmp_path / "a.parquet", b, "--delete", deletes(tmp_path / "d.parquet", [3], pa.int64()))
    assert rc == 0
    report = tmp_path / "rebuild.json"
    result = fake_invoke(["rebuild", str(tmp_path / "out"), "--index-factory", "Flat", "--json-report", str(report)])
    assert result.exit_code == 0, result.output
    rebuilt = json.loads(report.read_text())
    assert rebuilt["rows"]["total"] == indexed["rows"]["total"] == 22  # the rows of the version's shards
    assert rebuilt["rows"]["reused"] == 20 and rebuilt["rows"]["embedded"] == 0
    assert rebuilt["rows"]["skipped"] == indexed["rows"]["skipped"] and sum(rebuilt["rows"]["skipped"].values()) == 2
    assert rebuilt["index"]["num_vectors"] == 19 and rebuilt["index"]["deleted"] == indexed["index"]["deleted"] == 1
    assert rebuilt["rejects_file"] and Path(rebuilt["rejects_file"]).is_file()
    assert rebuilt["rejects_file"].startswith(str(tmp_path / "out" / "versions" / rebuilt["version"]))


def test_a_delete_refused_by_the_guard_deletes_nothing_later(tmp_path, index):
    a, b = int_shard(tmp_path / "a.parquet", list(range(20))), int_shard(tmp_path / "b.parquet", list(range(20, 40)))
    assert index(a, b)[0] == 0
    rc, stderr, report, _ = index(a, "--sync", "--delete", deletes(tmp_path / "d.parquet", [1, 2, 3], pa.int64()))
    last = stderr.strip().splitlines()[-2]  # the summary line (the error follows it)
    assert rc == 65 and "Nothing was published" in stderr and report["removed"]["documents"] == 20
    assert "deleted" not in last and "documents removed" not in last, last  # neither happened
    assert not list((tmp_path / "out" / "store").rglob("deleted/*/*.parquet"))  # no tombstone left behind
    # the user answers the refusal another way: the deletion they gave up on does not happen behind their back
    rc, stderr, report, _ = index(a, b)
    assert rc == 0 and report["status"] == "nothing-to-do" and live_ids(tmp_path / "out") == set(range(40)), stderr
    rc, stderr, report, _ = index(a, b, "--delete", tmp_path / "d.parquet")  # asked again, it holds
    assert rc == 0 and live_ids(tmp_path / "out") == set(range(40)) - {1, 2, 3} and "3 deleted" in stderr


def test_a_delete_run_again_counts_what_it_removes_now_not_what_an_earlier_run_did(tmp_path, index):
    # the same --delete in every cron run: once the ids are gone, a rerun removes nothing and must not say "1 deleted"
    a = int_shard(tmp_path / "a.parquet", list(range(10)))
    rc, stderr, report, _ = index(a, "--delete", deletes(tmp_path / "d.parquet", [3]))
    assert rc == 0 and report["deletes"]["deleted"] == 1 and "1 deleted" in stderr, stderr
    rc, stderr, report, _ = index(a, "--delete", tmp_path / "d.parquet")
    assert rc == 0 and report["status"] == "nothing-to-do", stderr
    assert report["rows"]["deleted"] == report["deletes"]["deleted"] == report["deletes"]["rows"] == 0
    assert report["deletes"]["already_deleted"] == 1 and report["deletes"]["not_found"] == 0
    assert "0 deleted (1 already deleted)" in stderr.splitlines()[-1], stderr
    # one id deleted before, one new, one nowhere: each counted once, where it went
    rc, stderr, report, _ = index(a, "--delete", deletes(tmp_path / "d2.parquet", [3, 4, 999]))
    assert rc == 0 and report["status"] == "success", stderr
    assert (report["deletes"]["deleted"], report["deletes"]["already_deleted"], report["deletes"]["not_found"]) \
        == (1, 1, 1) and report["deletes"]["requested"] == 3 and report["deletes"]["rows"] == 1
    assert "1 deleted (1 already deleted)" in stderr.splitlines()[-1], stderr
    assert live_ids(tmp_path / "out") == set(range(10)) - {3, 4}


def test_the_summary_counts_each_shard_once(tmp_path, index):
    # an additive run: one shard embedded, one reused, one kept from the live version: '3 shards (1 embedded,
    # 1 reused, 1 kept)', not '(1 embedded, 2 reused, 1 kept)' (the kept one counted as reused too)
    a, b = int_shard(tmp_path / "a.parquet", [1, 2]), int_shard(tmp_path / "b.parquet", [3, 4])
    assert index(a, b)[0] == 0
    rc, stderr, report, _ = index(a, int_shard(tmp_path / "c.parquet", [5]))
    assert rc == 0, stderr
    assert "3 shards (1 embedded, 1 reused, 1 kept)" in stderr.splitlines()[-1], stderr
    assert report["shards"] == {"total": 3, "embedded": 1, "reused": 2}  # the report's shape stays: kept are reused


def test_an_int8_index_with_every_document_deleted_answers_its_codes_with_no_hits(tmp_path, index):
    """An empty int8 version records no calibration ranges (nothing to calibrate on): int8 query codes were refused
    (65, "codes cannot be decoded") where float vectors, and every other empty index, answer no hits."""
    import numpy as np

    a = int_shard(tmp_path / "a.parquet", list(range(6)))
    assert index(a, "--quantize", "int8")[0] == 0
    live = petal.open_index(tmp_path / "out")
    codes = np.full((2, live.dim), 3, dtype=np.int8)
    assert len(live.search_stored(codes, k=3)[0]) == 3  # the codes are good ones: the live version answers them
    rc, stderr, report, _ = index(a, "--quantize", "int8", "--delete", deletes(tmp_path / "d.parquet", list(range(6)),
                                                                                pa.int64()))
    assert rc == 0 and report["index"]["num_vectors"] == 0, stderr
    empty = petal.open_index(tmp_path / "out")
    assert empty.search_stored(codes, k=3) == [[], []]
    np.save(tmp_path / "codes.npy", codes)
    result = fake_invoke(["query", str(tmp_path / "out"), "--vector-file", str(tmp_path / "codes.npy"), "--json"])
    assert result.exit_code == 0 and [json.loads(line)["hits"] for line in result.stdout.splitlines()] == [[], []], \
        result.output
