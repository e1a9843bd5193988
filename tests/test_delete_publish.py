"""``--delete`` takes effect with the version that publishes it, never before, and holds once it is live.

A run with ``--delete`` that does not publish (a crash, an injected error, a full disk, a FAISS error, SIGTERM at
any point before the pointer swap) leaves no tombstone in force: the next plain run publishes nothing (the
deletion the failed run asked for does not happen behind the user's back) and leaves no tombstone behind. A run
killed after the swap keeps its deletion: ``petal rebuild`` and the next runs leave the rows out. What such a
killed run leaves staged beside the store is settled by the next writer, ``petal index`` or ``petal rebuild``.

Real processes (tests/forkrun.py) running the CLI with the tests' fake engine (text runs) or none
(``--vectors-column``); faults through ``PETAL_FAULT`` (pipeline/reliability/faults.py); Parquet, store and FAISS
are real.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.invariants import assert_clean, live

DELETED = {3, 12}


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def write_shard(path: Path, ids: list[int], vectors: bool = False) -> None:
    columns = {"id": pa.array(ids, pa.int64()), "text": [f"document {i} about topic {i % 4}" for i in ids]}
    if vectors:
        v = np.random.default_rng(ids[0]).standard_normal((len(ids), 8)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        columns["emb"] = pa.array([list(map(float, row)) for row in v], pa.list_(pa.float32()))
    pq.write_table(pa.table(columns), path)


class Job:
    """``petal index DATA --out OUT`` (text with the fake engine, or ``--vectors-column emb``), one report a run."""

    def __init__(self, root: Path, model: Path, vectors: bool = False) -> None:
        self.root, self.model, self.vectors = root, model, vectors
        self.data, self.out = root / "data", root / "out"
        self.deletes = root / "deletes.parquet"
        self.trace = root / "trace.txt"
        self.count = 0
        self.data.mkdir()
        write_shard(self.data / "a.parquet", list(range(10)), vectors)
        write_shard(self.data / "b.parquet", list(range(10, 20)), vectors)
        pq.write_table(pa.table({"id": pa.array(sorted(DELETED), pa.int64())}), self.deletes)

    def start(self, *extra: str | Path, fault: str | None = None) -> forkrun.Child:
        self.count += 1
        how = ["--vectors-column", "emb"] if self.vectors else ["--model", str(self.model), "--max-seqs", "4"]
        argv = ["index", str(self.data), "--out", str(self.out), "-q", *how,
                "--json-report", str(self.root / f"report-{self.count}.json"), *map(str, extra)]
        self.trace.unlink(missing_ok=True)
        env = {"PETAL_TEST_FAKE_ENGINE": str(self.root / f"fake-{self.count}.jsonl"), "PETAL_FAULT": fault,
               "PETAL_FAULT_TRACE": str(self.trace)}
        return forkrun.start(argv, env)

    def run(self, *extra: str | Path, fault: str | None = None) -> forkrun.Result:
        return self.start(*extra, fault=fault).wait()

    def delete(self, *extra: str | Path, fault: str | None = None) -> forkrun.Result:
        return self.run("--delete", self.deletes, *extra, fault=fault)

    def ids(self) -> set[int]:
        return set(live(self.out)[0])  # complete, one id per vector, ids unique (tests/invariants.py)

    def tombstones(self) -> list[str]:
        """Every file under store/deleted/ (committed tombstones ``<fp>.parquet``, staged ones, leftovers)."""
        root = self.out / "store" / "deleted"
        return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.is_dir() else []

    def reached(self) -> list[str]:
        return self.trace.read_text().split() if self.trace.exists() else []


@pytest.fixture
def job(tmp_path, fake_model) -> Job:
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    return job


@pytest.fixture
def vector_job(tmp_path) -> Job:
    job = Job(tmp_path, tmp_path, vectors=True)
    assert job.run().rc == 0
    return job


def check_report_deleted_nothing(report: dict) -> None:
    """The JSON report of a ``--delete`` run that published nothing says so: 0 deleted, the 2 ids ``planned``
    (was: ``deleted`` 2, what the run meant to do, while the next run found every row)."""
    assert report["rows"]["deleted"] == 0 and report["version"] is None, report
    assert report["deletes"]["deleted"] == report["deletes"]["rows"] == 0, report["deletes"]
    assert report["deletes"]["planned"] == 2, report["deletes"]


def check_nothing_deleted_later(job: Job, before: str) -> None:
    """After a ``--delete`` run that did not publish: the live version is the one before, and the next plain run
    publishes nothing, deletes nothing and leaves no tombstone behind; asked again, the deletion happens."""
    assert OutputDir(job.out).current_version() == before and job.ids() == set(range(20))
    plain = job.run()
    assert plain.rc == 0 and plain.report["status"] == "nothing-to-do", plain.stderr
    assert OutputDir(job.out).current_version() == before and job.ids() == set(range(20))
    assert job.tombstones() == []
    again = job.delete()
    assert again.rc == 0 and job.ids() == set(range(20)) - DELETED and "2 deleted" in again.last_line, again.stderr
    assert all(".staged-" not in name for name in job.tombstones()) and len(job.tombstones()) == 2
    assert_clean(job.out)


# the points a --delete run passes between planning its tombstones and making its version live
BEFORE_SWAP = [
    ("before_index_build:1:kill", -9), ("before_index_build:1:enospc", 74),
    ("after_index_build:1:raise", 1), ("after_index_build:1:term", 143), ("after_index_build:1:int", 130),
    ("tombstones_staged:1:kill", -9), ("tombstones_staged:1:raise", 1), ("tombstones_staged:1:enospc", 74),
    ("before_version_rename:1:kill", -9), ("before_version_rename:1:enospc", 74),
    ("before_current_swap:1:kill", -9), ("before_current_swap:1:enospc", 74),
]


@pytest.mark.parametrize("fault, rc", BEFORE_SWAP)
def test_a_delete_run_that_does_not_publish_deletes_nothing_later(job, fault, rc):
    before = OutputDir(job.out).current_version()
    failed = job.delete(fault=fault)
    assert failed.rc == rc, failed.stderr
    assert fault.split(":")[0] in job.reached()
    if rc != -9:  # it ran its clean-up: nothing of its deletion is left (a killed run's is, out of force)
        assert failed.report["status"] in ("failed", "interrupted") and job.tombstones() == [], job.tombstones()
        check_report_deleted_nothing(failed.report)
    check_nothing_deleted_later(job, before)


def test_a_faiss_error_in_the_build_deletes_nothing_later(job):
    before = OutputDir(job.out).current_version()
    # 20 rows read: 19 IVF lists pass the check before any work; the 18 vectors the deletion leaves cannot train them
    failed = job.delete("--index-factory", "IVF19,Flat")
    assert failed.rc == 78 and "IVF19,Flat" in failed.last_line, failed.stderr
    assert job.tombstones() == []
    check_report_deleted_nothing(failed.report)
    check_nothing_deleted_later(job, before)


def test_sigterm_before_the_publish_deletes_nothing_later(job):
    before = OutputDir(job.out).current_version()
    child = job.start("--delete", job.deletes, fault="after_index_build:1:sleep=1.5")
    deadline = time.monotonic() + 60
    while "after_index_build" not in job.reached():
        assert time.monotonic() < deadline and child.alive(), child.stderr_so_far()
        time.sleep(0.02)
    child.send(signal.SIGTERM)
    result = child.wait()
    assert result.rc == 143 and result.report["status"] == "interrupted", result.stderr
    assert job.tombstones() == []
    check_report_deleted_nothing(result.report)
    check_nothing_deleted_later(job, before)


@pytest.mark.parametrize("vectors", [False, True])
def test_a_delete_run_stopped_once_its_version_is_live_reports_the_deletion(tmp_path, fake_model, vectors):
    """SIGTERM right after the pointer swap: the run is interrupted, but its version (and its deletion) is live;
    the report names the version and counts the 2 deleted (was: no version, so the summary left the deletion out)."""
    job = Job(tmp_path, fake_model, vectors=vectors)
    assert job.run().rc == 0
    stopped = job.delete(fault="after_publish:1:term")
    assert stopped.rc == 143 and stopped.report["status"] == "interrupted", stopped.stderr
    assert stopped.report["version"] == OutputDir(job.out).current_version(), stopped.report
    assert stopped.report["rows"]["deleted"] == stopped.report["deletes"]["deleted"] == 2
    assert "planned" not in stopped.report["deletes"] and "2 deleted" in stopped.stderr.splitlines()[0], stopped.stderr
    assert job.ids() == set(range(20)) - DELETED


@pytest.mark.parametrize("point", ["after_publish", "store_prune", "version_prune"])
def test_a_delete_takes_effect_exactly_with_its_publish(job, fake_model, point):
    before = OutputDir(job.out).current_version()
    # killed a step before the pointer swap: nothing deleted, then or later
    assert job.delete(fault="before_current_swap:1:kill").rc == -9
    assert job.run().report["status"] == "nothing-to-do" and job.ids() == set(range(20))
    assert OutputDir(job.out).current_version() == before
    # killed a step after it (b replaced: a store entry to prune; --keep-versions 1: a version to prune)
    write_shard(job.data / "b.parquet", list(range(10, 21)))
    crashed = job.delete("--keep-versions", "1", fault=f"{point}:1:kill")
    assert crashed.rc == -9 and point in job.reached()
    published = OutputDir(job.out).current_version()
    assert published != before and job.ids() == set(range(21)) - DELETED
    # petal rebuild before any other run: the deletion holds
    rebuild = forkrun.petal(["rebuild", str(job.out), "--json-report", str(job.root / "rebuild.json")])
    assert rebuild.rc == 0 and rebuild.report["index"]["deleted"] == 2, rebuild.stderr
    assert job.ids() == set(range(21)) - DELETED
    # the next runs keep it, and the store holds it as committed tombstones
    rerun = job.run()
    assert rerun.rc == 0 and job.ids() == set(range(21)) - DELETED, rerun.stderr
    assert len(job.tombstones()) == 2 and all(".staged-" not in n for n in job.tombstones()), job.tombstones()
    assert job.run("--full").rc == 0 and job.ids() == set(range(21)) - DELETED
    assert job.run().report["status"] == "nothing-to-do"
    assert_clean(job.out)


@pytest.mark.parametrize("fault, published", [("after_publish:1:kill", True), ("before_current_swap:1:kill", False),
                                              ("tombstones_staged:1:kill", False)])
def test_petal_rebuild_settles_the_staged_tombstones_a_killed_delete_left(job, fault, published):
    """``petal rebuild`` settles what a ``--delete`` run killed around its publish left, under the lock, as ``petal
    index`` does: a staged tombstone its version published is renamed over the entry's tombstone and holds; one
    whose version never went live is removed and deletes nothing (was: both left beside the store as they were)."""
    before = OutputDir(job.out).current_version()
    killed = job.delete(fault=fault)
    assert killed.rc == -9 and fault.split(":")[0] in job.reached(), killed.stderr
    crashed = OutputDir(job.out).current_version()
    assert (crashed != before) == published
    staged = job.tombstones()
    assert len(staged) == 2 and all(".staged-" in name for name in staged), staged  # one per shard: 3 in a, 12 in b
    assert all(name.endswith(f".staged-{crashed}.parquet") for name in staged) == published

    rebuild = forkrun.petal(["rebuild", str(job.out), "--json-report", str(job.root / "rebuild.json")])
    assert rebuild.rc == 0 and rebuild.report["status"] == "success", rebuild.stderr
    rebuilt = OutputDir(job.out).current_manifest()
    assert rebuilt is not None and rebuilt.version == rebuild.report["version"] != crashed
    kept = set(range(20)) - DELETED if published else set(range(20))
    assert job.ids() == kept
    assert rebuild.report["index"]["deleted"] == rebuilt.counts.deleted == (2 if published else 0)
    if published:  # committed: each entry's own tombstone, the rows of 3 (a's row 3) and 12 (b's row 2)
        assert job.tombstones() == sorted(f"{s.entry}.parquet" for s in rebuilt.shards)
        rows = {Path(s.path).name: pq.read_table(next((job.out / "store" / "deleted").rglob(f"{s.entry}.parquet")))
                .column("row").to_pylist() for s in rebuilt.shards}
        assert rows == {"a.parquet": [3], "b.parquet": [2]}, rows
    else:
        assert job.tombstones() == []
    said = "was published: its 2 staged tombstones committed" if published else \
        "was not published: its 2 staged tombstones removed"
    assert said in rebuild.stderr, rebuild.stderr
    # the next runs find nothing left to settle and keep what the rebuild built
    rerun = job.run()
    assert rerun.rc == 0 and rerun.report["status"] == "nothing-to-do", rerun.stderr
    assert "staged tombstones" not in rerun.stderr and job.ids() == kept
    assert job.run("--full").rc == 0 and job.ids() == kept
    assert_clean(job.out)


@pytest.mark.parametrize("fault, rc", [("tombstones_staged:1:raise", 1), ("before_current_swap:1:kill", -9),
                                       ("before_version_rename:1:enospc", 74)])
def test_vectors_column_delete_that_does_not_publish_deletes_nothing_later(vector_job, fault, rc):
    before = OutputDir(vector_job.out).current_version()
    failed = vector_job.delete(fault=fault)
    assert failed.rc == rc and fault.split(":")[0] in vector_job.reached(), failed.stderr
    check_nothing_deleted_later(vector_job, before)


def test_vectors_column_delete_killed_after_its_publish_keeps_it(vector_job):
    assert vector_job.delete(fault="before_current_swap:1:kill").rc == -9
    assert vector_job.run().report["status"] == "nothing-to-do" and vector_job.ids() == set(range(20))
    assert vector_job.delete(fault="after_publish:1:kill").rc == -9
    assert vector_job.ids() == set(range(20)) - DELETED
    rerun = vector_job.run()
    assert rerun.rc == 0 and rerun.report["status"] == "nothing-to-do", rerun.stderr
    assert vector_job.ids() == set(range(20)) - DELETED and len(vector_job.tombstones()) == 2
    assert_clean(vector_job.out)
