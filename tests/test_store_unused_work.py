"""Work an interrupted or refused run committed, and another run on the same OUT in between (README's Airflow job:
one OUT, each day's directory, retries with a delay): the other run's clean-up deleted every store entry no version
used and every committed range, so the retry embedded everything again, though the README promises "rerun the same
command: it embeds only what was not committed". Such work is now kept for ``--keep-unused`` (7 days) after its
commit; a changed shard's old entry, a dropped shard's and the parts of an assembled shard still go at once, so the
store stays bounded. A clean-up error names its path and goes on (``pruned.left``); a stop during the clean-up says
what was pruned. Real Parquet, FAISS and store; the fake engine logs what it embeds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests.conftest import REPO
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.test_reliability import ROWS, write_shards
from tests.test_scale_ranges import parts, write_big_shard

DAY = 86_400


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


class Out:
    """``petal index SOURCE --out OUT`` with the fake engine, one log and report per run, any source."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model, self.out = root, model, root / "out"
        self.count = 0

    def argv(self, source: Path, *extra: str) -> list[str]:
        self.count += 1
        self.report = self.root / f"report-{self.count}.json"
        self.log = self.root / f"fake-{self.count}.jsonl"
        return ["index", str(source), "--out", str(self.out), "--model", str(self.model), "-q", "--max-seqs", "4",
                "--json-report", str(self.report), *extra]

    def run(self, source: Path, *extra: str, fault: str | None = None) -> forkrun.Result:
        argv = self.argv(source, *extra)
        return forkrun.petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(self.log), "PETAL_FAULT": fault})

    def entries(self) -> list[Path]:
        return sorted((self.out / "store" / "shards").glob("*/*"))


def shards_of(log: Path) -> set[str]:
    return {doc.split("-")[0] for doc in embedded_ids(log)}


def airflow(tmp_path: Path, model: Path, *flags: str) -> Out:
    """s0 published; day1 (4 shards) killed after 3 commits; day2 published over it."""
    o = Out(tmp_path, model)
    write_shards(tmp_path / "s0", names="s")
    write_shards(tmp_path / "day1", names="abcd")
    write_shards(tmp_path / "day2", names="xy")
    assert o.run(tmp_path / "s0", *flags).rc == 0
    killed = o.run(tmp_path / "day1", *flags, fault="after_shard_commit:3:kill")
    assert killed.rc < 0, killed.stderr
    day2 = o.run(tmp_path / "day2", *flags)
    assert day2.rc == 0, day2.stderr
    return o


def test_a_retry_after_another_run_published_embeds_only_what_was_not_committed(tmp_path, fake_model):
    o = airflow(tmp_path, fake_model)
    day2 = o.run(tmp_path / "day2")  # nothing to do: keeps them too
    assert day2.rc == 0 and day2.report["status"] == "nothing-to-do"
    assert day2.report["pruned"]["unused_kept"] == 3 and day2.report["pruned"]["store_entries"] == 0
    assert "kept 3 store entries and committed ranges no version uses" in day2.stderr, day2.stderr
    retry = o.run(tmp_path / "day1")
    assert retry.rc == 0, retry.stderr
    assert retry.report["shards"]["embedded"] == 1, retry.report["shards"]
    assert len(shards_of(o.log)) == 1 and len(embedded_ids(o.log)) == ROWS
    assert retry.report["pruned"]["unused_kept"] == 0


def test_keep_unused_0_deletes_them_at_once(tmp_path, fake_model):
    o = airflow(tmp_path, fake_model, "--keep-unused", "0")
    retry = o.run(tmp_path / "day1", "--keep-unused", "0")
    assert retry.rc == 0 and retry.report["shards"]["embedded"] == 4


def test_unused_work_older_than_the_window_is_pruned(tmp_path, fake_model):
    o = airflow(tmp_path, fake_model)
    old = time.time() - 8 * DAY
    unused = [e for e in o.entries() if e.parent.name not in used_keys(o)]
    assert len(unused) == 3
    for entry in unused:
        os.utime(entry / "entry.json", (old, old))
    again = o.run(tmp_path / "day2")
    assert again.rc == 0 and again.report["pruned"]["unused_pruned"] == 3, again.report["pruned"]
    assert again.report["pruned"]["store_entries"] == 3
    assert "removed 3 store entries and committed ranges no version used, committed more than 7d ago" in again.stderr
    assert all(e.parent.name in used_keys(o) for e in o.entries())
    # fresh ones stay under a window of an hour too
    killed = o.run(tmp_path / "day1", fault="after_shard_commit:2:kill")
    assert killed.rc < 0
    assert o.run(tmp_path / "day2", "--keep-unused", "1h").report["pruned"]["unused_kept"] == 2


def used_keys(o: Out) -> set[str]:
    from petal.pipeline.layout import OutputDir
    from petal.pipeline.store.embeddings import EmbeddingStore
    from petal.pipeline.store.retention import entries_in_use

    return {p.parent.name for p in entries_in_use(OutputDir(o.out), EmbeddingStore(o.out / "store"))}


def test_a_bad_keep_unused_is_a_usage_error(tmp_path, fake_model):
    o = Out(tmp_path, fake_model)
    write_shards(tmp_path / "s0", names="s")
    for bad in ("-1", "soon", "7w"):
        result = o.run(tmp_path / "s0", "--keep-unused", bad)
        assert result.rc == 2 and "--keep-unused" in result.stderr, result.stderr


def test_a_refused_sync_is_resumed_after_another_run_published(tmp_path, fake_model):
    o = Out(tmp_path, fake_model)
    write_shards(tmp_path / "data", names="abcdefghij")
    assert o.run(tmp_path / "data").rc == 0
    for name in "abcdef":
        (tmp_path / "data" / f"{name}.parquet").unlink()
    write_shards(tmp_path / "data", names="klm")
    refused = o.run(tmp_path / "data", "--sync")  # 6 of 10 removed > 10%
    assert refused.rc == 65, refused.stderr
    write_shards(tmp_path / "other", names="z")
    assert o.run(tmp_path / "other").rc == 0
    retry = o.run(tmp_path / "data", "--sync", "--max-removed", "100%")
    assert retry.rc == 0, retry.stderr
    assert retry.report["shards"]["embedded"] == 0 and embedded_ids(o.log) == []


def test_repeated_runs_over_changing_shards_keep_the_store_bounded(tmp_path, fake_model):
    o = Out(tmp_path, fake_model)
    for salt in range(6):
        write_shards(tmp_path / "data", names="ab", salt=salt)
        write_shards(tmp_path / "data", names="c")
        result = o.run(tmp_path / "data")
        assert result.rc == 0, result.stderr
    # the live version and the one before it: a and b twice, c once; no unused entry kept
    assert len(o.entries()) == 5, o.entries()
    assert result.report["pruned"]["store_entries"] == 2 and result.report["pruned"]["unused_kept"] == 0
    # a changed shard embedded by a run that was then killed, superseded by a later run's entry of it
    write_shards(tmp_path / "data", names="a", salt=10)
    assert o.run(tmp_path / "data", fault="after_shard_commit:1:kill").rc < 0
    write_shards(tmp_path / "data", names="a", salt=11)
    result = o.run(tmp_path / "data", "--keep-versions", "1")
    assert result.rc == 0 and len(o.entries()) == 3, o.entries()
    assert result.report["pruned"]["unused_kept"] == 0


def test_a_changed_shard_an_unpublished_run_embedded_outlives_a_publish_that_kept_its_old_entry(tmp_path, fake_model):
    """Another run publishes the shard's old entry (it did not name the shard): the new one is the current file's."""
    o = Out(tmp_path, fake_model)
    write_shards(tmp_path / "data", names="abc")
    assert o.run(tmp_path / "data").rc == 0
    write_shards(tmp_path / "data", names="ab", salt=1)
    assert o.run(tmp_path / "data", fault="after_shard_commit:1:kill").rc < 0  # a's new content committed
    write_shards(tmp_path / "other", names="z")
    other = o.run(tmp_path / "other")
    assert other.rc == 0 and other.report["pruned"]["unused_kept"] == 1, other.report["pruned"]
    retry = o.run(tmp_path / "data")
    assert retry.rc == 0 and shards_of(o.log) == {"b"}, retry.stderr
    # reverted: the entry of the edit no version holds is garbage at once, though committed after the live one
    write_shards(tmp_path / "data", names="ab")
    assert o.run(tmp_path / "data", "--keep-versions", "1").rc == 0
    write_shards(tmp_path / "data", names="a", salt=2)
    assert o.run(tmp_path / "data", fault="after_shard_commit:1:kill").rc < 0
    write_shards(tmp_path / "data", names="a")
    reverted = o.run(tmp_path / "data", "--keep-versions", "1")
    assert reverted.rc == 0 and reverted.report["pruned"]["unused_kept"] == 0, reverted.report["pruned"]
    assert len(o.entries()) == 4  # a, b, c, z


def scaled(o: Out, source: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tests.fake_cli", *o.argv(source, "--workers", "2", "--range-rows", "20", *extra)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PETAL_TEST_FAKE_ENGINE": str(o.log)}
    env.pop("PETAL_FAULT", None)
    if fault:
        env["PETAL_FAULT"] = fault
    return subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO, timeout=300)


def test_committed_ranges_outlive_a_nothing_to_do_run_on_another_source(tmp_path, fake_model):
    o = Out(tmp_path, fake_model)
    write_shards(tmp_path / "s0", names="s")
    assert o.run(tmp_path / "s0").rc == 0
    write_big_shard(tmp_path / "big" / "big.parquet", rows=120, group_rows=10)
    killed = scaled(o, tmp_path / "big", fault="store_committed:2:kill")  # each worker dies at its 2nd commit
    assert killed.returncode == 75, killed.stderr
    committed = parts(o.out)
    assert 2 <= len(committed) < 6, committed
    nothing = o.run(tmp_path / "s0")
    assert nothing.rc == 0 and nothing.report["status"] == "nothing-to-do"
    assert parts(o.out) == committed and nothing.report["pruned"]["unused_kept"] == len(committed)
    assert "kept" in nothing.stderr
    retry = scaled(o, tmp_path / "big")
    assert retry.returncode == 0, retry.stderr
    rows = pq.read_metadata(tmp_path / "big" / "big.parquet").num_rows
    assert len(embedded_ids(o.log)) <= rows - 20 * len(committed)
    assert parts(o.out) == []  # assembled: its parts go at once


def changed_twice(tmp_path: Path, model: Path) -> Out:
    """Five shards published twice each with other content, --keep-versions 1 next: five old entries to prune."""
    o = Out(tmp_path, model)
    write_shards(tmp_path / "data", names="abcde")
    assert o.run(tmp_path / "data").rc == 0
    write_shards(tmp_path / "data", names="abcde", salt=1)
    assert o.run(tmp_path / "data").rc == 0
    write_shards(tmp_path / "data", names="abcde", salt=2)
    return o


def test_a_clean_up_error_names_its_path_and_the_rest_goes_on(tmp_path, fake_model):
    o = changed_twice(tmp_path, fake_model)
    result = o.run(tmp_path / "data", "--keep-versions", "1", fault="store_prune:1:eio")
    assert result.rc == 0, result.stderr
    left = result.report["pruned"]["left"]
    assert len(left) == 1 and "Input/output error" in left[0]["reason"], left
    assert left[0]["path"] in result.stderr and "cleaning up" not in result.stderr
    assert result.report["pruned"]["store_entries"] == 9  # the other 4 of v1 and the 5 of v2
    again = o.run(tmp_path / "data", "--keep-versions", "1")
    assert again.rc == 0 and again.report["pruned"]["store_entries"] == 1 and again.report["pruned"]["left"] == []


def test_a_stop_during_the_clean_up_says_what_was_pruned(tmp_path, fake_model):
    o = changed_twice(tmp_path, fake_model)
    result = o.run(tmp_path / "data", "--keep-versions", "1", fault="store_prune:1:term")
    assert result.rc == 143, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "pruning old versions and store entries is left to the next run" not in last, last
    assert "the report's pruned says what was" in last, last
    pruned = result.report["pruned"]["store_entries"]
    assert pruned < 10 and len(o.entries()) == 5 + 10 - pruned
    again = o.run(tmp_path / "data", "--keep-versions", "1")
    assert again.rc == 0 and len(o.entries()) == 5
