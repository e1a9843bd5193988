"""A dropped shard's store entry is garbage once a version used it, also after those versions are pruned (by ``petal
rebuild --keep-versions``, or by a run whose store clean-up then failed or was killed): was kept 7 days
(``--keep-unused``) as an interrupted run's work, with a note saying so. ``OUT/store/published`` records what the
versions on disk use before any is pruned; work no version ever used is kept for the window still. Through the CLI,
real Parquet, FAISS and store, the fake engine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.test_reliability import write_shards
from tests.test_store_unused_work import Out, airflow, shards_of

SYNC = ("--sync", "--max-removed", "100%")


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def dropped(tmp_path: Path, model: Path) -> tuple[Out, Path]:
    """Shards a, b, c published; c dropped from the source."""
    o = Out(tmp_path, model)
    write_shards(tmp_path / "src")
    assert o.run(tmp_path / "src").rc == 0
    (tmp_path / "src" / "c.parquet").rename(tmp_path / "c.parquet")
    return o, tmp_path / "src"


def rebuild(o: Out, *extra: str) -> forkrun.Result:
    result = forkrun.petal(["rebuild", str(o.out), "-q", *extra], {"PETAL_TEST_FAKE_ENGINE": str(o.root / "rb.log")})
    assert result.rc == 0, result.stderr
    return result


def test_a_dropped_shards_entry_goes_after_rebuild_pruned_its_versions(tmp_path, fake_model):
    o, src = dropped(tmp_path, fake_model)
    assert o.run(src, *SYNC).rc == 0 and len(o.entries()) == 3  # the first version, kept, still uses c's
    rebuild(o, "--keep-versions", "1")  # deletes no store entry (README)
    assert len(o.entries()) == 3
    after = o.run(src, *SYNC)
    assert after.rc == 0 and after.report["pruned"]["store_entries"] == 1, after.stderr
    assert after.report["pruned"]["unused_kept"] == 0 and "kept 1 store entries" not in after.stderr
    assert len(o.entries()) == 2
    # the dropped entry's record went with it; the live version's entries have none (recorded once another is live)
    assert list((o.out / "store" / "published").glob("*/*")) == []


@pytest.mark.parametrize("action", ["eio", "kill"])
def test_a_failed_store_clean_up_after_pruning_is_retried_by_the_next_run(tmp_path, fake_model, action):
    o, src = dropped(tmp_path, fake_model)
    failed = o.run(src, *SYNC, "--keep-versions", "1", fault=f"store_prune:1:{action}")
    assert (failed.rc == 0) if action == "eio" else (failed.rc < 0), failed.stderr
    assert len(o.entries()) == 3 and len(list((o.out / "versions").glob("v*"))) == 1
    after = o.run(src, *SYNC)
    assert after.rc == 0 and after.report["pruned"]["store_entries"] == 1, after.stderr
    assert after.report["pruned"]["unused_kept"] == 0 and len(o.entries()) == 2


def test_an_older_petals_out_keeps_what_it_cannot_tell_from_unpublished_work(tmp_path, fake_model):
    o, src = dropped(tmp_path, fake_model)
    assert o.run(src, *SYNC, "--keep-versions", "1", fault="store_prune:1:eio").rc == 0
    shutil.rmtree(o.out / "store" / "published", ignore_errors=True)  # as an older petal left it: no record
    after = o.run(src, *SYNC)
    assert after.rc == 0 and after.report["pruned"]["unused_kept"] == 1 and len(o.entries()) == 3, after.stderr


def test_work_no_version_used_is_kept_after_versions_are_pruned(tmp_path, fake_model):
    """Killed run (day1, 3 commits) -> another source publishes (day2) -> rebuild prunes -> its rerun embeds only d."""
    o = airflow(tmp_path, fake_model)
    rebuild(o, "--keep-versions", "1")
    again = o.run(tmp_path / "day2", "--keep-versions", "1")
    assert again.rc == 0 and again.report["pruned"]["unused_kept"] == 3, again.stderr
    retry = o.run(tmp_path / "day1")
    assert retry.rc == 0 and shards_of(o.log) == {"d"}, retry.stderr


def test_a_stale_record_never_marks_work_committed_again_as_published(tmp_path, fake_model):
    """A clean-up killed between deleting an entry and its record leaves the record; a run that commits the same
    entry again (the shard back, then killed) left work its rerun reuses, not garbage."""
    o, src = dropped(tmp_path, fake_model)
    assert o.run(src, *SYNC, "--keep-versions", "1", fault="store_prune:1:eio").rc == 0
    records = {p: p.stat().st_mtime_ns for p in (o.out / "store" / "published").glob("*/*")}
    assert o.run(src, *SYNC).rc == 0 and len(o.entries()) == 2  # c's entry and its record deleted
    [stale] = [p for p in records if not p.exists()]
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"")  # the record a killed clean-up left behind
    os.utime(stale, ns=(records[stale], records[stale]))
    (tmp_path / "c.parquet").rename(src / "c.parquet")
    assert o.run(src, fault="after_shard_commit:1:kill").rc < 0 and len(o.entries()) == 3
    write_shards(tmp_path / "other", names="x")
    other = o.run(tmp_path / "other")
    assert other.rc == 0 and other.report["pruned"]["unused_kept"] == 1 and len(o.entries()) == 4, other.stderr
    retry = o.run(src)
    assert retry.rc == 0 and "c" not in shards_of(o.log), retry.stderr


def test_a_clean_up_syncs_and_lists_by_what_it_may_leave_unused_not_by_the_store(tmp_path, fake_model, monkeypatch):
    """Clean-up took 10 s at 3,000 shards (0.7 s at 1,000): each recorded every entry of the live version, syncing one
    directory per new shard key, and walked the store's keys twice. Now it records (and syncs) only the entries a
    pruning may leave unused, and lists each key once: counted in-process, no timing."""
    from petal.pipeline.store import retention
    from petal.pipeline.store.embeddings import EmbeddingStore
    from tests.fake_cli import invoke

    syncs: list[Path] = []
    listed: list[Path] = []
    fsync_dir, listing = retention.fsync_dir, EmbeddingStore.listing

    def counted_sync(path: Path) -> None:
        syncs.append(path)
        fsync_dir(path)

    def counted_listing(self: EmbeddingStore, directory: Path, dirs_only: bool = True) -> list[Path]:
        listed.append(directory)
        return listing(self, directory, dirs_only)

    monkeypatch.setattr(retention, "fsync_dir", counted_sync)
    monkeypatch.setattr(EmbeddingStore, "listing", counted_listing)
    o, src = Out(tmp_path, fake_model), tmp_path / "src"
    names = "abcdefghijkl"
    write_shards(src, names=names)

    def run(*extra: str) -> None:
        syncs.clear(), listed.clear()
        result = invoke(o.argv(src, *extra), env={"PETAL_TEST_FAKE_ENGINE": str(o.root / "fake.log")})
        assert result.exit_code == 0, result.output

    def walked_once() -> bool:  # the store's shard keys, each listed once
        shards = o.out / "store" / "shards"
        walked = [p for p in listed if p.is_relative_to(shards)]
        return len(walked) == len({*walked}) and {*walked} >= {shards, *(e.parent for e in o.entries())}

    run()  # one version, the live one: nothing a pruning may leave unused
    assert syncs == [] and not any((o.out / "store" / "published").glob("*/*"))
    assert walked_once()
    run()  # nothing to do
    assert syncs == [] and walked_once()
    for name in "ab":
        (src / f"{name}.parquet").unlink()
    run(*SYNC, "--keep-versions", "1")  # a and b's entries: recorded (their key directories and the tree synced)
    assert len(syncs) == 3 and len(o.entries()) == len(names) - 2 and walked_once()
