"""A store entry whose files still read but no longer hold what was committed (bit rot, a bad copy, an edit by
hand) is damaged (RELIABILITY.md promises 3, 17): petal index embeds its shard again instead of publishing the
changed vectors or ids, petal rebuild (no sources to embed) is 65 naming it. Real processes, the fake engine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests import forkrun
from tests.fake_engine import embedded_ids
from tests.store_homes import HomeJob, home_fixtures

ROWS = 6


def write(data: Path, name: str, salt: int = 0) -> None:
    texts = [f"{name} words {i} edition {salt}" for i in range(ROWS)]
    texts[2] = None  # a rejected row: rejects.parquet has a row to change
    pq.write_table(pa.table({"id": [f"{name}-{salt}-{i}" for i in range(ROWS)], "text": texts}),
                   data / f"{name}.parquet")


class Job(HomeJob):
    def vectors(self) -> dict[str, bytes]:
        reader = IndexReader(self.out)
        vectors = reader.index.reconstruct_n(0, reader.ntotal)
        return {doc: vectors[i].tobytes() for i, doc in enumerate(reader.ids.column("id").to_pylist())}


pristine, job = home_fixtures("damage", write, Job)


def nan_in_a_vector(entry: Path) -> None:
    vectors = np.load(entry / "embeddings.npy", mmap_mode="r+")
    vectors[0, 3] = np.nan
    vectors.flush()


def one_bit_flipped(entry: Path) -> None:
    vectors = np.load(entry / "embeddings.npy", mmap_mode="r+")
    vectors.view(np.uint32)[1, 0] ^= 1 << 20
    vectors.flush()


def an_id_changed(entry: Path) -> None:
    table = pq.read_table(entry / "rows.parquet")
    ids = table.column("id").to_pylist()
    ids[0] = ids[0][:-1] + "9"  # the id of another document, same length
    pq.write_table(table.set_column(1, "id", pa.array(ids)), entry / "rows.parquet")


def a_reject_changed(entry: Path) -> None:
    table = pq.read_table(entry / "rejects.parquet")
    pq.write_table(table.set_column(1, "reason", pa.array(["duplicate_id"] * table.num_rows)),
                   entry / "rejects.parquet")


@pytest.mark.parametrize("damage", [nan_in_a_vector, one_bit_flipped, an_id_changed, a_reject_changed])
def test_an_entry_changed_since_its_commit_is_embedded_again_and_refused_by_rebuild(job, damage):
    before = job.vectors()
    entry = job.entry_of("a")
    damage(entry)
    rebuilt, _ = job.run("rebuild", str(job.out))
    assert rebuilt.rc == 65 and str(entry) in rebuilt.last_line and "sha256" in rebuilt.last_line, rebuilt.stderr
    write(job.data, "b", salt=1)  # a change, so the run builds a new version from the store
    result, log = job.run()
    assert result.rc == 0, result.stderr
    assert f"{entry}" in result.stderr and "damaged" in result.stderr and "embedding the shard again" in result.stderr
    assert sorted(embedded_ids(log)) == sorted([f"a-0-{i}" for i in range(ROWS) if i != 2]
                                               + [f"b-1-{i}" for i in range(ROWS) if i != 2])
    after = job.vectors()
    assert {doc: v for doc, v in after.items() if doc.startswith("a-")} == \
        {doc: v for doc, v in before.items() if doc.startswith("a-")}  # the committed vectors, not the changed ones
    rejects = pq.read_table(job.entry_of("a") / "rejects.parquet").column("reason").to_pylist()
    assert rejects == ["empty_text"] or rejects == ["null_text"]
    again, log = job.run()
    assert again.rc == 0 and embedded_ids(log) == [] and "damaged" not in again.stderr  # the new entry is whole


@pytest.mark.parametrize("damage", [one_bit_flipped, an_id_changed])
def test_a_damaged_entry_of_a_kept_shard_is_65_naming_it_and_left_in_place(job, damage):
    """An additive run over b keeps a (not named): its damaged entry cannot be embedded again from a source the
    run does not read. It said 'embedding the shard again', moved the entry out, then exited 78 'the store has
    no embeddings'; now 65 naming the entry and what to do, the entry and the live version as they were."""
    entry = job.entry_of("a")
    damage(entry)
    current = (job.out / "CURRENT").read_text()
    write(job.data, "b", salt=1)
    result, log = job.run("index", str(job.data / "b.parquet"), "--out", str(job.out), "--model", str(job.model), "-q")
    assert result.rc == 65 and str(entry) in result.last_line and "damaged" in result.last_line, result.stderr
    assert "a.parquet" in result.last_line and "name it as a SOURCE" in result.last_line
    assert "embedding the shard again" not in result.stderr and embedded_ids(log) == []
    assert (entry / "entry.json").is_file() and (job.out / "CURRENT").read_text() == current
    named, log = job.run("index", str(job.data / "a.parquet"), "--out", str(job.out), "--model", str(job.model),
                         "-q")  # what the message says: naming it embeds it again (b's change waits for its run)
    assert named.rc == 0 and "embedding the shard again" in named.stderr, named.stderr
    assert sorted(embedded_ids(log)) == sorted(f"a-0-{i}" for i in range(ROWS) if i != 2)


def test_an_entry_of_an_older_petal_without_checksums_is_still_reused(job):
    meta_file = job.entry_of("a") / "entry.json"
    meta = json.loads(meta_file.read_text())
    del meta["checksums"]
    meta_file.write_text(json.dumps(meta))
    write(job.data, "b", salt=1)
    result, log = job.run()
    assert result.rc == 0 and "damaged" not in result.stderr, result.stderr
    assert {doc[0] for doc in embedded_ids(log)} == {"b"}  # a reused: no re-embedding storm after an upgrade


def _lookup_without_file_descriptors(store_root: str, source: str, fingerprint: str) -> None:
    """``lookup`` of a whole entry in a process that has no file descriptor left (RLIMIT_NOFILE at the lowest free
    one): every open fails with EMFILE, the host's failure. Exit 0 when that is 74 naming it, the entry in place."""
    import errno as errnos
    import os
    import resource

    from petal.pipeline.reliability.errors import PetalIOError
    from petal.pipeline.store.embeddings import EmbeddingStore

    store = EmbeddingStore(Path(store_root))
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    try:
        store.lookup(source, fingerprint)
    except PetalIOError as exc:
        os._exit(0 if os.strerror(errnos.EMFILE) in str(exc) else 3)
    os._exit(4)  # taken as damaged (moved out, embedded again) or read whole: not what the test is about


def test_a_read_of_an_entry_the_host_fails_is_74_and_the_entry_is_kept(job):
    """EIO, EMFILE, ENOMEM reading a store entry are the host's (promise 11), not damage: the entry was moved out of
    the store and embedded again (lost for good for a shard an additive run keeps, whose source is gone)."""
    entry = job.entry_of("a")
    source = json.loads((entry / "entry.json").read_text())["source"]["abs_path"]
    before = sorted(p.name for p in entry.iterdir())
    rc, stderr = forkrun.call(_lookup_without_file_descriptors, (str(job.out / "store"), source, entry.name))
    assert rc == 0, stderr
    assert sorted(p.name for p in entry.iterdir()) == before



def unseen(damage):
    """``damage``, then the entry's record of its files' stat set to what they are now: bytes changed under a stat
    that did not change, as bit rot changes them (a write through the file system changes the ctime)."""
    def damaged_unseen(entry: Path) -> None:
        damage(entry)
        meta = json.loads((entry / "entry.json").read_text())
        meta["stat"] = {name: [(st := os.stat(entry / name)).st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
                        for name in ("embeddings.npy", "rows.parquet", "rejects.parquet")}
        (entry / "entry.json").write_text(json.dumps(meta))
    damaged_unseen.__name__ = f"{damage.__name__}_unseen"
    return damaged_unseen


@pytest.mark.parametrize("damage", [unseen(one_bit_flipped), unseen(an_id_changed)])
def test_a_run_with_nothing_to_publish_hashes_only_changed_files_and_the_next_build_hashes_all(job, damage):
    """A nothing-to-do run read every byte of every reused entry (sha256) to build nothing from them: a 1.5 GB store
    added 0.4-3.3 s to each cron run. It now hashes only the files whose size, mtime, ctime or inode changed since
    the commit (an edit is still found at once: the tests above); the run that builds a version from the entries
    hashes every byte, so bytes changed under an unchanged stat are found there and the shard embedded again."""
    entry = job.entry_of("a")
    damage(entry)
    idle, log = job.run()
    assert idle.rc == 0 and "nothing-to-do" in idle.last_line, idle.stderr
    assert "damaged" not in idle.stderr and embedded_ids(log) == []
    write(job.data, "b", salt=1)
    built, log = job.run()
    assert built.rc == 0 and f"{entry}" in built.stderr and "embedding the shard again" in built.stderr, built.stderr
    assert sorted(embedded_ids(log)) == sorted([f"a-0-{i}" for i in range(ROWS) if i != 2]
                                               + [f"b-1-{i}" for i in range(ROWS) if i != 2])


def test_a_run_that_looked_idle_but_builds_checks_its_entries_first(job):
    """A run whose shards and settings match the live version (its entries looked up by their stat) that builds
    after all (here: a tombstone removed by hand, so the deletion the live version holds is gone) hashes every
    reused entry before building: a damaged one is 75 and moved out, the rerun embeds its shard again."""
    deletes = job.root / "delete.parquet"
    pq.write_table(pa.table({"id": ["a-0-0"]}), deletes)
    deleted, _ = job.run("index", str(job.data), "--out", str(job.out), "--model", str(job.model), "-q",
                         "--delete", str(deletes))
    assert deleted.rc == 0, deleted.stderr
    (tombstone,) = (job.out / "store" / "deleted").glob("*/*.parquet")
    tombstone.unlink()
    entry = job.entry_of("b")
    unseen(one_bit_flipped)(entry)
    current = (job.out / "CURRENT").read_text()
    refused, log = job.run()
    assert refused.rc == 75 and str(entry) in refused.last_line and "run again" in refused.last_line, refused.stderr
    assert embedded_ids(log) == [] and not entry.exists() and (job.out / "CURRENT").read_text() == current
    again, log = job.run()
    assert again.rc == 0, again.stderr
    assert sorted(embedded_ids(log)) == sorted(f"b-0-{i}" for i in range(ROWS) if i != 2)
