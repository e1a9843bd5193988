"""Row-group ranges of large shards (``--range-rows``): handed out to workers one range at a time, each
committed on its own, assembled into the shard's ordinary store entry.

Real spawned workers and SIGKILL, real Parquet (one shard of many row groups), real store and FAISS; the
tiny BERT for equality with the single-process run, the logging fake engine (tests/fake_engine.py) where a
test must prove which rows each run embedded. Coordinators run as their own processes fork from the tests'
preloaded forkserver (tests/_scale_shared.py); the killed run both kill-9 reruns resume is made once (each
rerun on its own copy of OUT).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader
from tests._scale_shared import Petal, commit_part
from tests.fake_engine import embedded_ids, make_fake_model_dir, read_log
from tests.test_incremental import contents
from tests.test_scale_workers import embedding_worker, wait_for, worker_pids, write_shards

pytestmark = pytest.mark.slow


def write_big_shard(path: Path, rows: int, group_rows: int, salt: str = "") -> list[str]:
    """One shard of ``rows`` rows in row groups of ``group_rows``; row 41 repeats row 3's id (a duplicate that
    falls in another range), row 20's text is null."""
    ids = [f"big-{i}" for i in range(rows)]
    texts: list[str | None] = [f"big document {i} {salt} on subject {i % 7} with a few more words" for i in range(rows)]
    if rows > 41:
        ids[41] = ids[3]
        texts[20] = None
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=group_rows)
    return ids


def index_cli(*args: str) -> dict:
    report = Path(args[args.index("--out") + 1]).with_suffix(".report.json")
    result = CliRunner().invoke(cli, ["index", *args, "-q", "--json-report", str(report)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text())


def parts(out: Path) -> list[str]:
    return sorted(p.parent.name for p in (out / "store" / "parts").glob("*/*/*/entry.json"))


def test_a_shard_split_across_two_workers_equals_the_single_process_index(tiny_bert_dir, tmp_path):
    data = tmp_path / "data"
    write_shards(data, count=2, rows=9)
    write_big_shard(data / "big.parquet", rows=63, group_rows=7)  # 9 row groups
    common = [str(data), "--model", str(tiny_bert_dir), "--device", "cpu", "--max-seqs", "8"]
    one = index_cli(*common, "--out", str(tmp_path / "one"))
    report = index_cli(*common, "--out", str(tmp_path / "two"), "--workers", "2", "--range-rows", "14")
    # the tokens of the rows embedded: the repeated id's row, embedded in its range and rejected at the assembly, is
    # not one of them (was: counted, more tokens than the single process's for the same input)
    assert report["tokens"] == one["tokens"] > 0 and report["rows"] == one["rows"], (report, one)
    one_rows, one_vectors = contents(tmp_path / "one")
    rows, vectors = contents(tmp_path / "two")
    assert rows == one_rows  # same ids and rows in the same FAISS order: the cross-range duplicate is dropped too
    np.testing.assert_allclose(vectors, one_vectors, rtol=0, atol=1e-5)
    assert sum(1 for r in rows if r["shard"] == "big.parquet") == 61  # 63 - the null text - the repeated id
    ranges = report["ranges"]
    assert ranges["split_rows"] == 14 and ranges["shards_split"] == 1 and ranges["reused"] == []
    assert [r["row_groups"] for r in ranges["embedded"]] == [[0, 2], [2, 4], [4, 6], [6, 8], [8, 9]]
    assert report["shards"] == {"total": 3, "embedded": 3, "reused": 0}
    assert sum(w["ranges"] for w in report["workers"]) == 5 and sum(w["shards"] for w in report["workers"]) == 2
    # the assembled entry is the single process's: rows, rejects, counts (the store's contract is unchanged)
    assert parts(tmp_path / "two") == []  # assembled: only shard entries are left
    one_meta = IndexReader(tmp_path / "one").manifest.shards
    two_meta = IndexReader(tmp_path / "two").manifest.shards
    assert [(s.path, s.entry, s.embedded, s.skipped) for s in one_meta] == \
        [(s.path, s.entry, s.embedded, s.skipped) for s in two_meta]
    big = next(s.entry for s in one_meta if s.path.endswith("big.parquet"))
    big_one = next((tmp_path / "one" / "store" / "shards").glob(f"*/{big}"))
    big_two = next((tmp_path / "two" / "store" / "shards").glob(f"*/{big}"))
    for table in ("rows.parquet", "rejects.parquet"):
        assert pq.read_table(big_one / table).equals(pq.read_table(big_two / table)), table
    assert pq.read_table(big_two / "rejects.parquet").to_pylist() == [{"row": 20, "reason": "null_text"},
                                                                      {"row": 41, "reason": "duplicate_id"}]
    # a rerun with the same or other splitting finds every shard committed
    again = index_cli(*common, "--out", str(tmp_path / "two"), "--workers", "2", "--range-rows", "7")
    assert again["status"] == "nothing-to-do" and "ranges" not in again


def test_range_rows_needs_workers(tmp_path):
    data = tmp_path / "data"
    write_shards(data, count=1, rows=3)
    result = CliRunner().invoke(cli, ["index", str(data), "--out", str(tmp_path / "o"), "--range-rows", "10"])
    assert result.exit_code == 2 and "--range-rows" in result.output


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def range_rows(report_ranges: list[dict]) -> set[int]:
    return {row for r in report_ranges for row in range(*r["rows"])}


@pytest.fixture(scope="module")
def killed_mid_range(fake_model, tmp_path_factory) -> tuple[Path, Path, list[str], list[str], set[int]]:
    """A ``--workers 2 --range-rows 20`` run over one big shard, a worker SIGKILLed mid-range (exit 75), checked
    once and shared by both reruns (each on its own copy of OUT). Returns (data, OUT, ids, the committed ranges,
    the rows the killed run embedded)."""
    root = tmp_path_factory.mktemp("killed-mid-range")
    data, out = root / "data", root / "out"
    ids = write_big_shard(data / "big.parquet", rows=120, group_rows=10)  # 12 row groups: 6 ranges of 20 rows
    first_log = root / "first.jsonl"
    child = Petal([*killed_base(data, out, fake_model), "--workers", "2", "--range-rows", "20"],
                  {"PETAL_TEST_FAKE_ENGINE": str(first_log), "PETAL_FAULT": "after_batch:1+:sleep=0.25"},
                  root / "first.json")
    wait_for(lambda: len(worker_pids(first_log, child.pid)) == 2 and len(parts(out)) >= 1)
    victim = embedding_worker(first_log, child.pid)  # mid-range
    os.kill(victim, signal.SIGKILL)
    rc, stderr, report = child.wait()
    assert rc == 75, stderr
    assert "SIGKILL" in stderr.strip().splitlines()[-1] and "units" in stderr.strip().splitlines()[-1]
    committed = parts(out)
    assert 1 <= len(committed) < 6
    # the report names the ranges whose commit reached the coordinator (the victim may die between its
    # commit and saying so: that range is on disk all the same, and the rerun keeps it)
    reported = {f"g{a:06d}-{b:06d}" for a, b in (r["row_groups"] for r in report["ranges"]["embedded"])}
    assert reported <= set(committed)
    assert report["shards"]["embedded"] == 0
    first_rows = {r["row"] for r in read_log(first_log) if "row" in r}
    return data, out, ids, committed, first_rows


def killed_base(data: Path, out: Path, model: Path) -> list[str]:
    return ["index", str(data), "--out", str(out), "--model", str(model), "-q", "--max-seqs", "4"]


@pytest.mark.parametrize("rerun", [["--workers", "2"], []], ids=["workers", "in-process"])
def test_kill_9_mid_range_then_the_rerun_embeds_only_the_missing_ranges(killed_mid_range, fake_model, tmp_path,
                                                                        rerun):
    data, killed_out, ids, committed, first_rows = killed_mid_range
    out = tmp_path / "out"
    shutil.copytree(killed_out, out, symlinks=True)  # NOTE: the store names the shard by its path: data stays put
    base = killed_base(data, out, fake_model)

    second_log = tmp_path / "second.jsonl"
    rc, stderr, report = Petal([*base, *rerun], {"PETAL_TEST_FAKE_ENGINE": str(second_log)},
                               tmp_path / "second.json").wait()
    assert rc == 0, stderr
    ranges = report["ranges"]
    reused = sorted(f"g{a:06d}-{b:06d}" for a, b in (r["row_groups"] for r in ranges["reused"]))
    assert reused == committed  # every committed range kept, none embedded again
    redone = range_rows(ranges["embedded"])
    assert redone and redone.isdisjoint(range_rows(ranges["reused"]))
    assert redone | range_rows(ranges["reused"]) == set(range(120))
    again = [r["row"] for r in read_log(second_log) if "row" in r]
    # NOTE: the rerun (without --range-rows 20) reads each gap of uncommitted ranges as one unit: when a gap
    # spans rows 3..41, row 41 (row 3's id) is a duplicate rejected at read, not embedded
    skipped = {20} | ({41} if set(range(3, 42)) <= redone else set())
    assert len(again) == len(set(again)) and set(again) == redone - skipped  # only the missing ranges, once each
    assert set(again).isdisjoint(range_rows(ranges["reused"])) and range_rows(ranges["reused"]) - {20} <= first_rows
    assert report["shards"] == {"total": 1, "embedded": 1, "reused": 0}
    assert ranges["rows_reused"] == len(range_rows(ranges["reused"]) - {20})  # row 41 is dropped at assembly
    rows, _ = contents(out)
    expected = [i for row, i in enumerate(ids) if row not in (20, 41)]
    assert [r["id"] for r in rows] == expected  # nothing lost, nothing twice, in row order
    assert parts(out) == []  # assembled: the ranges are gone, only the shard's entry is left
    assert not any((out / "store" / "tmp").iterdir())  # the killed worker's half-written range is removed
    assert embedded_ids(second_log)


def test_a_changed_big_shard_re_embeds_every_range(fake_model, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    write_big_shard(data / "big.parquet", rows=60, group_rows=10)
    write_shards(data, count=1, rows=5)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--workers", "2",
            "--range-rows", "20"]
    log = tmp_path / "log.jsonl"
    rc, stderr, first = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(log)}, tmp_path / "a.json").wait()
    assert rc == 0 and len(first["ranges"]["embedded"]) == 3, stderr
    ids = write_big_shard(data / "big.parquet", rows=60, group_rows=10, salt="changed")
    log2 = tmp_path / "log2.jsonl"
    rc, stderr, report = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(log2)}, tmp_path / "b.json").wait()
    assert rc == 0, stderr
    assert report["shards"] == {"total": 2, "embedded": 1, "reused": 1}
    assert report["shard_changes"]["changed"] == [str(data / "big.parquet")]
    assert [r["row_groups"] for r in report["ranges"]["embedded"]] == [[0, 2], [2, 4], [4, 6]]
    assert report["ranges"]["reused"] == []
    assert sorted(r["row"] for r in read_log(log2) if "row" in r) == [r for r in range(60) if r != 20]
    rows, _ = contents(out)
    assert [r["id"] for r in rows if r["shard"] == "big.parquet"] == [i for n, i in enumerate(ids) if n not in (20, 41)]


def test_plan_fills_the_gaps_between_committed_ranges_of_another_split(tmp_path):
    """A rerun with another ``--range-rows`` keeps every committed range that tiles the shard and cuts only the
    gaps; overlapping or out-of-bounds ranges are embedded again; reading a range yields exactly its rows."""
    from petal.pipeline.config import ReadConfig
    from petal.pipeline.ingest.documents import read_ranges
    from petal.pipeline.ingest.parquet import preflight
    from petal.pipeline.store.embeddings import EmbeddingStore
    from petal.pipeline.store.ranges import plan_ranges

    shard = tmp_path / "big.parquet"
    write_big_shard(shard, rows=100, group_rows=10)  # 10 row groups
    [info] = preflight([shard], ReadConfig())
    store = EmbeddingStore(tmp_path / "store")
    store.open()
    store.remember_sha256([info], ["0" * 64])
    whole = plan_ranges(store, [info], ["fp"], 0)
    assert [(r.first_row, r.num_rows, r.whole) for r in whole.ranges] == [(0, 100, True)] and not whole.split

    for first, stop in ((0, 3), (2, 4), (6, 7)):  # (2, 4) overlaps (0, 3): not reused
        commit_part(store, info, first, stop)
    plan = plan_ranges(store, [info], ["fp"], 20)
    assert [(r.first_group, r.stop_group) for r, _ in plan.reused[0]] == [(0, 3), (6, 7)]
    assert [(r.first_group, r.stop_group) for r in plan.ranges] == [(3, 5), (5, 6), (7, 9), (9, 10)]
    gaps = plan_ranges(store, [info], ["fp"], 0)  # in one process: one unit per gap
    assert [(r.first_group, r.stop_group) for r in gaps.ranges] == [(3, 6), (7, 10)]
    read = [(d.shard_index, row) for d in read_ranges([info], gaps.ranges, ReadConfig()) for row in
            [*d.rows, *(r for r, _ in d.rejects)]]
    assert sorted(row for unit, row in read if unit == 0) == list(range(30, 60))
    assert sorted(row for unit, row in read if unit == 1) == list(range(70, 100))


def test_an_id_repeated_across_ranges_leaves_every_count_as_in_one_process(fake_model, tmp_path):
    """A row a range embedded, or rejected after the read checks took its id, whose id an earlier range took, is a
    ``duplicate_id`` at the assembly and out of every count its range gave it: the report, the summary line, the
    manifest (``petal info --json``) and the store entry equal one process's. 40 rows in row groups of 5,
    ``--range-rows 10`` (4 ranges): row 23 repeats row 3's id with a text past the fake model's 128 tokens (was: 1
    truncated, where one process has 0); row 12 repeats row 2's, whose vector is not finite, and row 15 row 5's, a
    text the tokenizer sees nothing in (was: both embedded, where one process rejects them: the index differed);
    row 33 repeats row 7's with a long text whose vector is not finite (was: non_finite_embedding and truncated).
    Row 36's long text is truncated in both."""
    from tests.fake_engine import POISON_WORD

    ids, texts = [f"t-{n}" for n in range(40)], [f"doc {n} about subject {n % 7}" for n in range(40)]
    long_text = " ".join(["word"] * 300)
    for row, first in ((23, 3), (12, 2), (15, 5), (33, 7)):
        ids[row] = ids[first]
    texts[2], texts[5], texts[23] = f"{POISON_WORD} text", "\u0301", long_text
    texts[33], texts[36] = f"{POISON_WORD} {long_text}", long_text
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ids, "text": texts}), data / "t.parquet", row_group_size=5)
    env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def run(name: str, *flags: str) -> tuple[dict, str, dict]:
        out = tmp_path / name
        rc, stderr, report = Petal(["index", str(data), "--out", str(out), "--model", str(fake_model), "-q",
                                    *flags], env, tmp_path / f"{name}.json").wait()
        assert rc == 0, stderr
        summary = stderr.strip().splitlines()[-1].split(";")[1]  # "1 shards (...), N rows embedded, ..."
        info = CliRunner().invoke(cli, ["info", str(out), "--json"])
        assert info.exit_code == 0, info.output
        return report, summary, json.loads(info.output)

    one, one_summary, one_info = run("one")
    two, two_summary, two_info = run("two", "--workers", "2", "--range-rows", "10")
    assert [r["row_groups"] for r in two["ranges"]["embedded"]] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert one["rows"] == {"embedded": 34, "total": 40, "truncated": 1,
                           "skipped": {"duplicate_id": 4, "empty_text": 1, "non_finite_embedding": 1}}, one["rows"]
    assert two["rows"] == one["rows"] and two["tokens"] == one["tokens"] > 0, (two["rows"], two["tokens"])
    assert two["shards"] == one["shards"] and two_summary == one_summary, (two_summary, one_summary)
    assert two_info["counts"] == one_info["counts"], (two_info["counts"], one_info["counts"])
    assert [(s["path"], s["embedded"], s["skipped"], s["truncated"]) for s in two_info["shards"]] == \
        [(s["path"], s["embedded"], s["skipped"], s["truncated"]) for s in one_info["shards"]]
    one_entry, two_entry = (next((tmp_path / name / "store" / "shards").glob("*/*/entry.json")).parent
                            for name in ("one", "two"))
    assert json.loads((two_entry / "entry.json").read_text())["counts"] == \
        json.loads((one_entry / "entry.json").read_text())["counts"]
    for table in ("rows.parquet", "rejects.parquet"):
        assert pq.read_table(two_entry / table).equals(pq.read_table(one_entry / table)), table
    one_rows, one_vectors = contents(tmp_path / "one")
    two_rows, two_vectors = contents(tmp_path / "two")
    assert two_rows == one_rows and [r["row"] for r in one_rows if r["id"] in ("t-2", "t-5")] == []
    np.testing.assert_allclose(two_vectors, one_vectors, rtol=0, atol=1e-6)
