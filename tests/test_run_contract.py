"""What a run keeps and removes: additive runs, --sync, the --max-removed guard, --delete, and an
--index-factory checked against the data before any work (FAISS errors mapped, staging cleaned).

Through the CLI with the tests' fake engine (tests/fake_engine.py); Parquet, store and FAISS are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import make_fake_model_dir, read_log
from tests.invariants import assert_clean


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def shard(path: Path, prefix: str, n: int, start: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [f"{prefix}-{i}" for i in range(start, start + n)]
    pq.write_table(pa.table({"id": ids, "text": [f"document {i} about {prefix}" for i in ids]}), path)
    return path


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


def live_ids(out: Path) -> set[str]:
    return set(IndexReader(out).ids.column("id").to_pylist())


def test_additive_by_default_keeps_shards_not_named(tmp_path, index):
    a, b, c = (shard(tmp_path / "shards" / f"{n}.parquet", n, 50) for n in "abc")
    rc, _, _, _ = index(a, b, c)
    assert rc == 0 and len(live_ids(tmp_path / "out")) == 150
    rc, stderr, report, log = index(c)  # the shrink-to-the-latest-run case: now kept
    assert rc == 0, stderr
    assert len(live_ids(tmp_path / "out")) == 150 and not [r for r in log if "id" in r]
    assert report["shards"]["reused"] == 3 and report["shard_changes"]["kept"] == [str(a), str(b)]
    assert report["status"] == "nothing-to-do" and "0 rows embedded, 50 reused" in stderr

    # a daily job: one directory per day into one --out keeps every day; a deleted day stays indexed
    for day in ("2026-11-30", "2026-12-01"):
        shard(tmp_path / "days" / day / "part-0.parquet", day, 10)
        assert index(tmp_path / "days" / day, out=tmp_path / "daily")[0] == 0
    (tmp_path / "days" / "2026-11-30" / "part-0.parquet").unlink()
    shard(tmp_path / "days" / "2026-12-02" / "part-0.parquet", "2026-12-02", 10)
    assert index(tmp_path / "days" / "2026-12-02", out=tmp_path / "daily")[0] == 0
    assert len(live_ids(tmp_path / "daily")) == 30


def test_sync_mirrors_the_sources_within_the_guard(tmp_path, index):
    a, b, c = (shard(tmp_path / "shards" / f"{n}.parquet", n, 50) for n in "abc")
    assert index(a, b, c)[0] == 0
    before = (tmp_path / "out" / "CURRENT").read_text()
    rc, stderr, report, _ = index(c, "--sync")
    assert rc == 65 and "100 of the 150 documents" in stderr and str(a) in stderr and str(b) in stderr
    assert "--max-removed 10%" in stderr and report["removed"]["documents"] == 100
    assert (tmp_path / "out" / "CURRENT").read_text() == before and len(live_ids(tmp_path / "out")) == 150
    assert not list((tmp_path / "out" / "versions").glob(".staging-*"))

    rc, stderr, report, _ = index(c, "--sync", "--max-removed", "70%")
    assert rc == 0, stderr
    assert live_ids(tmp_path / "out") == {f"c-{i}" for i in range(50)}
    assert report["shard_changes"]["removed"] == [str(a), str(b)] and "100 documents removed" in stderr

    rc, stderr, _, _ = index(c, "--sync", "--max-removed", "lots")
    assert rc == 2 and "--max-removed" in stderr


def test_a_replaced_shard_is_its_new_content_and_its_losses_are_counted(tmp_path, index):
    a, b = shard(tmp_path / "a.parquet", "a", 20), shard(tmp_path / "b.parquet", "b", 20)
    assert index(a, b)[0] == 0
    shard(a, "a", 15)  # a-15 .. a-19 are gone from the new content
    rc, stderr, report, _ = index(a)
    assert rc == 0, stderr
    assert report["removed"]["replaced"] == 5 and report["removed"]["documents"] == 0
    assert len(live_ids(tmp_path / "out")) == 35
    shard(b, "b", 10, start=100)  # --sync of a dropped shard beside a replaced one: only the dropped count
    c = shard(tmp_path / "c.parquet", "c", 30)
    rc, stderr, report, _ = index(b, c, "--sync")
    assert rc == 65 and "15 of the 35 documents" in stderr and str(a) in stderr and "a-0" in stderr


def test_delete_ids_persist_through_incremental_runs_and_rebuild(tmp_path, index):
    a, b = shard(tmp_path / "a.parquet", "a", 20), shard(tmp_path / "b.parquet", "b", 20)
    assert index(a, b)[0] == 0
    deletes = tmp_path / "deletes.parquet"
    pq.write_table(pa.table({"id": ["a-1", "b-2", "nope"]}), deletes)
    rc, stderr, report, _ = index(a, b, "--delete", deletes)
    assert rc == 0, stderr
    assert report["rows"]["deleted"] == 2 and report["deletes"]["not_found"] == 1 and "2 deleted" in stderr
    assert "nope" in stderr and live_ids(tmp_path / "out") == {f"a-{i}" for i in range(20)} - {"a-1"} | {
        f"b-{i}" for i in range(20)} - {"b-2"}
    assert IndexReader(tmp_path / "out").manifest.counts.deleted == 2

    c = shard(tmp_path / "c.parquet", "c", 5)  # a later incremental run (additive) does not bring them back
    assert index(c)[0] == 0
    ids = live_ids(tmp_path / "out")
    assert len(ids) == 43 and "a-1" not in ids and "b-2" not in ids
    assert fake_invoke(["rebuild", str(tmp_path / "out"), "--index-factory", "IVF2,Flat"]).exit_code == 0
    assert live_ids(tmp_path / "out") == ids

    shard(a, "a", 20)  # the same content written again: the deletion holds
    assert index(a)[0] == 0 and "a-1" not in live_ids(tmp_path / "out")
    pq.write_table(pa.table({"id": ["a-1", "a-99"], "text": ["a-1 is back", "new"]}), a)  # a changed: as it is now
    rc, stderr, _, _ = index(a, "--max-removed", "100")
    assert rc == 0, stderr
    ids = live_ids(tmp_path / "out")
    assert "a-1" in ids and "a-99" in ids and "b-2" not in ids
    assert_clean(tmp_path / "out")  # the layout of a clean output directory holds; side files follow entries
    # a's old entry keeps its tombstone (a-1) while the version before, a rollback target, uses it
    rows = sorted(pq.read_table(p).column("row").to_pylist() for p in (tmp_path / "out" / "store" / "deleted").rglob(
        "*.parquet"))
    assert rows == [[1], [2]], rows
    # that version pruned (by a publish, here of another factory): its entries and their side files go
    assert index(a, "--keep-versions", "1", "--index-factory", "Flat")[0] == 0
    assert_clean(tmp_path / "out", keep_versions=1)
    tombstones = list((tmp_path / "out" / "store" / "deleted").rglob("*.parquet"))
    assert len(tombstones) == 1 and pq.read_table(tombstones[0]).column("row").to_pylist() == [2]  # b-2 only
    live_entries = {s.entry for s in IndexReader(tmp_path / "out").manifest.shards}
    assert {p.stem for p in (tmp_path / "out" / "store" / "columns").rglob("*.parquet")} == live_entries


def test_delete_file_errors(tmp_path, index):
    a = shard(tmp_path / "a.parquet", "a", 5)
    assert index(a, "--delete", tmp_path / "missing.parquet")[0] == 66
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"x": [1], "y": [2]}), bad)
    rc, stderr, _, log = index(a, "--delete", bad)
    assert rc == 65 and "no column 'id'" in stderr and not log


def test_factory_checked_against_the_rows_before_any_work(tmp_path, index):
    a = shard(tmp_path / "a.parquet", "a", 150)
    rc, stderr, _, log = index(a, "--index-factory", "IVF4,PQ8")
    assert rc == 2 and "needs at least 256 vectors" in stderr and "at most 150" in stderr
    assert log == []  # not even the model was loaded
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out" / "versions").iterdir())


def test_a_faiss_error_after_embedding_is_exit_78_and_leaves_no_staging(tmp_path, index):
    texts = [f"document {i}" if i < 60 else "" for i in range(70)]  # 70 rows, 60 vectors
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(70)], "text": texts}), tmp_path / "a.parquet")
    rc, stderr, report, log = index(tmp_path / "a.parquet", "--index-factory", "IVF64,Flat")
    assert rc == 78 and "IVF64,Flat" in stderr and "60 vectors" in stderr and "Traceback" not in stderr
    assert report["exit_code"] == 78 and len([r for r in log if "id" in r]) == 60
    assert not list((tmp_path / "out" / "versions").glob(".staging-*"))
    rc, stderr, _, log = index(tmp_path / "a.parquet", "--index-factory", "IVF8,Flat")
    assert rc == 0 and not [r for r in log if "id" in r]  # the embeddings were kept


def test_report_on_stdout_and_into_non_regular_files(tmp_path, fake_model):
    import os
    import threading

    a = shard(tmp_path / "a.parquet", "a", 5)
    env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log")}
    base = ["index", str(a), "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"]
    result = fake_invoke([*base, "--json-report", "-"], env=env)
    assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "success"
    assert not Path("-").exists()
    result = fake_invoke([*base, "--json"], env=env)
    assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "nothing-to-do"
    rebuilt = fake_invoke(["rebuild", str(tmp_path / "out"), "--json"])
    assert rebuilt.exit_code == 0 and json.loads(rebuilt.stdout)["command"] == "rebuild"

    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    link = tmp_path / "stdout-link"
    link.symlink_to(fifo)  # like /dev/stdout -> /proc/self/fd/1: written through, never replaced
    result = fake_invoke([*base, "--json-report", str(link)], env=env)
    reader.join(timeout=30)
    assert result.exit_code == 0 and json.loads(got[0])["status"] == "nothing-to-do"
    assert link.is_symlink() and fifo.exists() and not fifo.is_file()

    target = tmp_path / "reports" / "latest.json"
    target.parent.mkdir()
    target.write_text("{}")
    alias = tmp_path / "latest-link.json"
    alias.symlink_to(target)
    assert fake_invoke([*base, "--json-report", str(alias)], env=env).exit_code == 0
    assert alias.is_symlink() and json.loads(target.read_text())["command"] == "index"


def test_summaries_say_what_happened(tmp_path, index, fake_model):
    a, b = shard(tmp_path / "a.parquet", "a", 30), shard(tmp_path / "b.parquet", "b", 30)
    # interrupted after the first shard: the planned "2 added" did not happen, so it is not said
    result = fake_invoke(["index", str(a), str(b), "--out", str(tmp_path / "out"), "--model",
                                      str(fake_model), "-q"],
                                env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log"),
                                     "PETAL_FAULT": "after_shard_commit:1:int"})
    last = result.stderr.strip().splitlines()[-2]
    assert result.exit_code == 130 and "interrupted" in last and "added" not in last, result.stderr
    rc, stderr, report, log = index(a, b)
    embedded = len([r for r in log if "id" in r])  # what went through the engine in this run
    assert rc == 0 and embedded < 60 and f"{embedded} rows embedded, {60 - embedded} reused" in stderr
    rc, stderr, report, _ = index(a, b)
    assert report["status"] == "nothing-to-do" and "0 rows embedded, 60 reused" in stderr
    assert report["tokens"] == 0 and report["throughput"]["tokens_per_s"] is None

    # a changed output setting is refused in words, not as a Python dict
    rc, stderr, _, _ = index(a, b, "--dim", "16")
    assert rc == 78 and "output.dim: 32 -> 16" in stderr and "{" not in stderr.splitlines()[-1]


def test_overrides_an_exact_index_ignores_are_said(built_exact_index):
    result = fake_invoke(["query", str(built_exact_index), "glaciers", "--nprobe", "8",
                                      "--rescore", "4"])
    assert result.exit_code == 0
    assert "--nprobe 8 is ignored" in result.stderr and "--rescore 4 is ignored" in result.stderr


@pytest.fixture(scope="module")
def built_exact_index(tmp_path_factory, tiny_bert_dir):
    """An exact (Flat) index of the sample data whose recorded model is a real one (tiny BERT, so that the text query
    loads and runs it); its vectors come from the tests' fake engine (their values are not what is checked)."""
    from tests.conftest import SAMPLE_DATA

    root = tmp_path_factory.mktemp("exact")
    out = root / "idx"
    result = fake_invoke(["index", str(SAMPLE_DATA), "--out", str(out), "--model", str(tiny_bert_dir), "-q"],
                         env={"PETAL_TEST_FAKE_ENGINE": str(root / "fake.jsonl")})
    assert result.exit_code == 0, result.output
    return out


def test_tokens_are_the_committed_rows_whether_stopped_or_not(tmp_path, fake_model):
    """The report's ``tokens`` are the tokens of the rows it says were embedded (``rows.embedded``): an interrupted
    run's and its resume's add up to one whole run's (was: the stopped run counted the batches of the shard it
    dropped too, so the pair counted more than the whole run)."""
    a, b = shard(tmp_path / "a.parquet", "a", 30), shard(tmp_path / "b.parquet", "b", 30)

    def run(out: str, fault: str | None = None) -> tuple[int, dict]:
        report = tmp_path / f"{out}-{bool(fault)}.json"
        env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log"), "PETAL_FAULT": fault}
        result = fake_invoke(["index", str(a), str(b), "--out", str(tmp_path / out), "--model", str(fake_model), "-q",
                              "--max-seqs", "4", "--json-report", str(report)], env=env)
        return result.exit_code, json.loads(report.read_text())

    rc, stopped = run("out", "after_batch:12:int")  # 8 batches a shard: in the second shard, not committed
    assert rc == 130 and stopped["rows"]["embedded"] == 30 and stopped["shards"]["embedded"] == 1, stopped
    rc, resumed = run("out")
    assert rc == 0 and resumed["rows"]["embedded"] == 30, resumed
    rc, whole = run("whole")
    assert rc == 0 and whole["rows"]["embedded"] == 60, whole
    assert 0 < stopped["tokens"] < whole["tokens"] and stopped["tokens"] + resumed["tokens"] == whole["tokens"], \
        (stopped["tokens"], resumed["tokens"], whole["tokens"])
