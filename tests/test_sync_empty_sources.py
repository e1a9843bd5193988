"""``petal index --sync`` over sources that now hold no shard, or only shards without rows (promise 16).

A mirroring run over an emptied directory (or a glob that matches nothing) exited 66 ("no *.parquet files under
directory") whatever the user asked, so ``--sync --max-removed 100%`` could never mirror an emptied corpus, while
the README says the guard is what stops an empty directory (65, naming the shards). Now: with a live version, a
directory or glob SOURCE that holds no shard names none and the guard judges the removal: 65 by default, an empty
version when ``--max-removed`` allows every document to go. A SOURCE that does not exist stays 66, and so does an
empty directory without ``--sync`` or without a live version. Real ``petal index`` processes (the fake engine),
real Parquet and FAISS.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.test_reliability import Job, write_shards


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def job(tmp_path, fake_model) -> Job:
    write_shards(tmp_path / "data")
    made = Job(tmp_path, fake_model)
    first = made.run()
    assert first.rc == 0, first.stderr
    return made


def empty_data(job: Job) -> None:
    for shard in job.data.glob("*.parquet"):
        shard.unlink()


def test_sync_over_an_emptied_directory_is_refused_by_the_guard_naming_the_shards(job):
    live = OutputDir(job.out).current_version()
    empty_data(job)
    result = job.run("--sync")
    assert result.rc == 65, result.stderr
    last = result.last_line
    assert "would remove 36 of the 36 documents" in last and "--max-removed 10%" in last, last
    assert all(str(job.data / f"{name}.parquet") in last for name in "abc") and "Nothing was published" in last
    assert OutputDir(job.out).current_version() == live
    assert result.report["status"] == "failed" and result.report["removed"]["documents"] == 36
    # a count below what it would remove is refused the same way
    assert job.run("--sync", "--max-removed", "35").rc == 65
    assert OutputDir(job.out).current_version() == live


@pytest.mark.parametrize("source", ["directory", "glob"])
def test_sync_with_max_removed_allowing_it_publishes_an_empty_version(job, source):
    empty_data(job)
    if source == "glob":  # a glob that now matches nothing names no shard either
        job.data = Path(f"{job.data}/*.parquet")
    result = job.run("--sync", "--max-removed", "100%")
    assert result.rc == 0, result.stderr
    report = result.report
    assert report["status"] == "success" and report["removed"]["documents"] == 36
    assert sorted(report["shard_changes"]["removed"]) == sorted(str(job.root / "data" / f"{n}.parquet")
                                                                for n in "abc")
    reader = IndexReader(job.out)
    assert reader.manifest.shards == () and reader.index.ntotal == 0
    assert embedded_ids(job.log) == []  # nothing to embed, and the model never ran
    # the dropped shards' entries stay while the version before (a rollback target) uses them
    assert len(list((job.out / "store" / "shards").glob("*/*"))) == 3
    again = job.run("--sync", "--max-removed", "100%")
    assert again.rc == 0 and again.report["status"] == "nothing-to-do", again.stderr
    # the corpus comes back: an additive run indexes it again, from the entries the version before kept
    job.data = job.root / "data"
    write_shards(job.data, names="ab")
    back = job.run()
    assert back.rc == 0 and back.report["rows"]["embedded"] == 0 and back.report["rows"]["reused"] == 24, back.stderr
    assert IndexReader(job.out).index.ntotal == 24


def test_sync_over_shards_without_rows_is_judged_by_the_guard_too(job):
    empty_data(job)
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                   job.data / "z.parquet")
    refused = job.run("--sync")
    assert refused.rc == 65 and "would remove 36 of the 36" in refused.last_line, refused.stderr
    allowed = job.run("--sync", "--max-removed", "36")
    assert allowed.rc == 0, allowed.stderr
    assert IndexReader(job.out).index.ntotal == 0


def test_an_empty_source_is_still_no_input_without_sync_without_a_live_version_or_when_missing(job, tmp_path):
    live = OutputDir(job.out).current_version()
    empty_data(job)
    additive = job.run("--max-removed", "100%")
    assert additive.rc == 66 and "no *.parquet files under directory" in additive.last_line, additive.stderr
    missing = Job(tmp_path, job.model)
    missing.data, missing.out = tmp_path / "not-there", job.out
    gone = missing.run("--sync", "--max-removed", "100%")  # a typo or a missing mount is no empty corpus
    assert gone.rc == 66 and "does not exist" in gone.last_line, gone.stderr
    assert OutputDir(job.out).current_version() == live
    fresh = Job(tmp_path / "fresh", job.model)
    fresh.data.mkdir(parents=True)
    first = fresh.run("--sync", "--max-removed", "100%")
    assert first.rc == 66 and "no *.parquet files under directory" in first.last_line, first.stderr


def test_sync_over_an_emptied_directory_with_delete_counts_the_ids_gone_with_their_shards(job):
    deletes = job.root / "deletes.parquet"
    pq.write_table(pa.table({"id": ["b-0-3", "not-an-id"]}), deletes)  # string ids, as the index holds them
    empty_data(job)
    result = job.run("--sync", "--max-removed", "100%", "--delete", str(deletes))
    assert result.rc == 0, result.stderr  # was: 65 'not an integer, and the index's ids are integers'
    report = result.report
    assert report["deletes"]["requested"] == 2 and report["deletes"]["deleted"] == 1
    assert report["deletes"]["not_found"] == 1 and report["deletes"]["sample_not_found"] == ["not-an-id"]
    assert report["removed"]["documents"] == 35  # b-0-3 was asked for: deleted, not counted as removed
    assert IndexReader(job.out).index.ntotal == 0
