"""The ``--max-removed`` guard holds when the live version's ``ids.parquet`` cannot be read (promise 16).

The guard counted the documents a run would remove against the live version's ``ids.parquet``; when that file
was damaged (garbage, truncated, unreadable) it had nothing to compare and let the run through, so ``--sync``
naming one shard of three published a version without the other two (20 of 30 documents gone, over the 10%
default). Now the live version's ids come from the store entries it was built from, and when those are gone
too, from its manifest's per-shard counts. Real ``petal index`` processes (the fake engine), real Parquet and FAISS.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests.fake_engine import make_fake_model_dir
from tests.test_reliability import Job, write_shards


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def job(tmp_path, fake_model) -> Job:
    write_shards(tmp_path / "data")
    made = Job(tmp_path, fake_model)
    assert made.run().rc == 0
    return made


def damage_ids(out: Path) -> str:
    version = OutputDir(out).current_version()
    assert version is not None
    (out / "versions" / version / "ids.parquet").write_bytes(b"not parquet at all")
    return version


def sync_one_shard(job: Job, *extra: str):
    one = job.data / "a.parquet"
    job.data = one  # --sync naming a.parquet only: b and c (24 of 36 documents) would go
    return job.run("--sync", *extra)


@pytest.mark.parametrize("store", ["kept", "gone"])
def test_a_damaged_live_id_map_does_not_let_sync_past_the_guard(job, store):
    live = damage_ids(job.out)
    if store == "gone":  # nor do missing store entries: the manifest's counts are the last resort
        for entry in (job.out / "store" / "shards").glob("*/*"):
            shutil.rmtree(entry)
    result = sync_one_shard(job)
    assert result.rc == 65, result.stderr
    last = result.last_line
    assert "would remove 24 of the 36 documents" in last and "Nothing was published" in last, last
    assert str(job.root / "data" / "b.parquet") in last and str(job.root / "data" / "c.parquet") in last
    if store == "kept":
        assert "ids such as b-0-0" in last
    else:
        assert "counted from the live version's manifest" in last and "ids such as" not in last
    assert OutputDir(job.out).current_version() == live
    assert result.report["removed"]["documents"] == 24


def test_allowed_by_max_removed_the_run_publishes_and_the_new_version_opens(job):
    damage_ids(job.out)
    result = sync_one_shard(job, "--max-removed", "24")
    assert result.rc == 0, result.stderr
    assert result.report["removed"]["documents"] == 24
    reader = IndexReader(job.out)
    assert reader.index.ntotal == 12 and [s.path for s in reader.manifest.shards] == [str(job.data)]
