"""Stop signals in every phase of ``petal index`` (promises 10 and 3), in real processes.

Two phases read whole shards without looking at the stop flag: the content hash of every shard whose stat
changed (before any embedding), and the stored text's second read of each embedded shard (after embedding). A
SIGTERM in either waited until every shard had been read (on a large corpus, minutes); now each stops before the
next shard (and the text read before the next record batch). A signal that arrives while a version is being
published or old versions pruned (past the last stop) ends the run with the signal's exit code (130/143), saying the
version is live and leaving the clean-up to the next run: it used to go on pruning and exit 0.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from petal.pipeline.layout import OutputDir
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.test_reliability import Job, lock_is_free, write_shards


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def job(tmp_path, fake_model) -> Job:
    write_shards(tmp_path / "data")  # a, b, c: 12 rows each, one record batch each
    return Job(tmp_path, fake_model)


def reached(trace: Path, point: str) -> int:
    return trace.read_text().count(f"{point}") if trace.exists() else 0


def stop_at(job: Job, point: str, hit: int, *extra: str, signals: int = 1, sig: signal.Signals = signal.SIGTERM,
            argv: list[str] | None = None):
    """Run with ``point``'s ``hit``-th pass sleeping 3 s; send ``sig`` (``signals`` times) once it is reached.
    ``argv``: another command than the job's ``petal index``."""
    trace = job.root / f"trace-{job.count + 1}"
    argv = argv or job.argv(*extra)
    from tests import forkrun

    child = forkrun.start(argv, {**job.env(f"{point}:{hit}:sleep=3"), "PETAL_FAULT_TRACE": str(trace)})
    deadline = time.monotonic() + 60
    while reached(trace, point) < hit:
        assert time.monotonic() < deadline and child.alive(), child.stderr_so_far()
        time.sleep(0.02)
    time.sleep(0.2)
    for n in range(signals):
        if n:  # NOTE: a later signal only once the first one's handler ran (it restores the kernel's default): sent
            # after a fixed 0.2 s, both could be pending before a loaded machine ran the process, and merge into one
            child.wait_handled(sig)
        child.send(sig)
    return child.wait(), trace


def test_a_signal_while_the_stored_text_is_read_stops_before_the_next_shard(job):
    # read_batch: one per shard while embedding (3), then the stored text's second read of each shard
    result, trace = stop_at(job, "read_batch", 4)
    assert result.rc == 143, result.stderr
    assert result.report["status"] == "interrupted" and result.report["shards"]["embedded"] == 3
    assert reached(trace, "read_batch") == 4  # the other two shards' text is not read
    assert OutputDir(job.out).current_version() is None and lock_is_free(job.out)
    assert not list((job.out / "store" / "columns").glob("*/.*.tmp-*"))  # the side file being written is removed
    rerun = job.run()
    assert rerun.rc == 0 and rerun.report["shards"]["reused"] == 3, rerun.stderr
    assert embedded_ids(job.log) == []  # every shard was committed before the stop


def test_a_signal_while_shards_are_hashed_stops_before_the_next_shard(job):
    result, trace = stop_at(job, "read_content", 1, sig=signal.SIGINT)
    assert result.rc == 130, result.stderr
    assert reached(trace, "read_content") == 1 and reached(trace, "after_model_load") == 0
    assert lock_is_free(job.out)
    assert job.run().rc == 0


@pytest.mark.parametrize("point, sig", [("before_current_swap", signal.SIGTERM), ("version_prune", signal.SIGINT),
                                        ("version_prune", signal.SIGTERM)])
def test_a_signal_once_the_version_is_published_exits_with_its_code_and_leaves_the_clean_up(job, point, sig):
    # past the last stop (the pointer swap, pruning old versions): the version is live, the exit code is the
    # signal's (a person's Ctrl-C is 130, never 0) and the message says the version is live; nothing more is pruned
    assert job.run().rc == 0
    write_shards(job.data, names="d")
    assert job.run("--keep-versions", "3").rc == 0
    first, old = OutputDir(job.out).versions()
    write_shards(job.data, names="e")
    result, _ = stop_at(job, point, 1, "--keep-versions", "1", sig=sig)
    assert result.rc == 128 + sig, result.stderr
    new = OutputDir(job.out).current_version()
    assert new not in (first, old) and result.report["status"] == "interrupted" and result.report["version"] == new
    summary, last = result.stderr.strip().splitlines()[-2:]
    assert f"interrupted by {sig.name} after version {new} went live" in last and "left to the next run" in last
    assert f"version {new}" in summary and "vectors in" in summary  # the summary says what was published
    assert old in OutputDir(job.out).versions()  # pruning stopped: the newer old version is still there
    assert lock_is_free(job.out)
    rerun = job.run("--keep-versions", "1")
    assert rerun.rc == 0 and rerun.report["status"] == "nothing-to-do", rerun.stderr
    assert old in rerun.report["pruned"]["versions"] and OutputDir(job.out).versions() == [new]


def test_a_signal_while_a_rebuild_prunes_exits_with_its_code_and_the_rebuilt_version_live(job):
    for salt in range(3):  # three versions: a rebuild keeps 2, so it prunes two
        write_shards(job.data, names="a", salt=salt + 1)
        assert job.run("--keep-versions", "3").rc == 0
    first, second, third = OutputDir(job.out).versions()
    report = job.root / "rebuild.json"
    result, _ = stop_at(job, "version_prune", 1, sig=signal.SIGINT,
                        argv=["rebuild", str(job.out), "--index-factory", "Flat", "--json-report", str(report)])
    assert result.rc == 130, result.stderr
    new = OutputDir(job.out).current_version()
    assert new not in (first, second, third) and result.report["status"] == "interrupted"
    assert result.report["version"] == new and result.report["exit_code"] == 130
    assert f"interrupted by SIGINT after version {new} went live" in result.stderr.strip().splitlines()[-1]
    assert second in OutputDir(job.out).versions()  # the prune stopped after the one it was deleting
    rerun = job.run("--keep-versions", "2")  # publishes again (the rebuild's factory is not the run's auto)
    assert rerun.rc == 0 and second in rerun.report["pruned"]["versions"], rerun.stderr


def test_a_second_signal_while_stopping_kills_and_the_rerun_resumes(job):
    result, _ = stop_at(job, "read_batch", 4, signals=2)
    assert result.rc == -signal.SIGTERM and result.report is None  # the kernel's default: killed at once
    assert lock_is_free(job.out) and OutputDir(job.out).current_version() is None
    rerun = job.run()
    assert rerun.rc == 0 and rerun.report["shards"]["reused"] == 3, rerun.stderr
    assert not any((job.out / "store" / "tmp").iterdir())


def test_a_signal_during_preflight_stops_before_the_next_footer(job):
    # preflight reads every footer before the lock; with thousands of shards a stop used to wait for them all
    result, trace = stop_at(job, "read_footer", 1, sig=signal.SIGINT)
    assert result.rc == 130, result.stderr
    assert result.report["status"] == "interrupted"
    assert reached(trace, "read_footer") == 1 and reached(trace, "after_preflight") == 0
    assert OutputDir(job.out).current_version() is None and not (job.out / "store").exists()
    assert job.run().rc == 0


def test_a_signal_during_a_vectors_preflight_stops_before_the_next_footer(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests import forkrun

    data, out, trace = tmp_path / "data", tmp_path / "out", tmp_path / "trace"
    data.mkdir()
    for name in "abc":
        vectors = np.ones((4, 8), dtype=np.float32)
        pq.write_table(pa.table({"vec": pa.array(list(vectors), type=pa.list_(pa.float32(), 8))}),
                       data / f"{name}.parquet")
    argv = ["index", str(data), "--out", str(out), "--vectors-column", "vec", "-q"]
    child = forkrun.start(argv, {"PETAL_FAULT": "read_footer:1:sleep=3", "PETAL_FAULT_TRACE": str(trace)})
    deadline = time.monotonic() + 60
    while reached(trace, "read_footer") < 1:
        assert time.monotonic() < deadline and child.alive(), child.stderr_so_far()
        time.sleep(0.02)
    time.sleep(0.2)
    child.send(signal.SIGTERM)
    result = child.wait()
    assert result.rc == 143, result.stderr
    assert reached(trace, "read_footer") == 1 and not (out / "store").exists()
