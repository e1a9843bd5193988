"""A ``petal index --full`` run stopped (a signal, kill -9) after committing some shards: its rerun embedded every
shard again, though the stop said "finished shards are committed, rerun to resume" (RELIABILITY 3). A --full run
that changes a setting cannot be resumed without --full (the live version has the old settings: 78), so a long
migration hit by a timeout started over each time. The rerun with --full now reuses what the stopped --full run
committed, and only that (entries from before it are embedded again, as --full asks); once a version is published,
a later --full embeds everything again. Real Parquet, FAISS and store; the fake engine logs what it embeds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import forkrun
from tests.conftest import REPO
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.invariants import assert_clean, live
from tests.test_reliability import ROWS, Job, write_shards, write_vector_shards

FULL_RUN_FILE = "full-run.json"  # OUT/store/: the --full run not yet published


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def _shards_of(log: Path) -> set[str]:
    return {doc.split("-")[0] for doc in embedded_ids(log)}


@pytest.mark.parametrize("settings", [[], ["--max-length", "16"]], ids=["same settings", "a new max length"])
@pytest.mark.parametrize("stop", ["term", "kill"])
def test_a_stopped_full_run_resumes_with_full(tmp_path, fake_model, settings, stop):
    write_shards(tmp_path / "data", names="abcd")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    stopped = job.run("--full", *settings, fault=f"after_shard_commit:2:{stop}")
    assert stopped.rc == (143 if stop == "term" else -signal.SIGKILL), stopped.stderr
    if stop == "term":  # a plain rerun would end the stopped --full run, not resume it: the message says so
        assert "rerun with --full (and its other flags) to resume" in stopped.stderr.splitlines()[-1]
    assert {"a", "b"} <= _shards_of(job.log)  # committed two (the engine may have begun the third)
    if settings:  # the live version has the old settings: only --full goes on
        assert job.run(*settings).rc == 78
    resumed = job.run("--full", *settings)
    assert resumed.rc == 0, resumed.stderr
    assert resumed.report["shards"] == {"total": 4, "embedded": 2, "reused": 2}
    assert _shards_of(job.log) == {"c", "d"} and len(embedded_ids(job.log)) == 2 * ROWS
    assert not (job.out / "store" / FULL_RUN_FILE).exists()
    assert_clean(job.out)
    # the same as one uninterrupted --full run of those settings
    clean = Job(tmp_path / "clean", fake_model)
    write_shards(clean.data, names="abcd")
    assert clean.run(*settings).rc == 0
    ids, vectors = live(job.out)
    clean_ids, clean_vectors = live(clean.out)
    assert ids == clean_ids and np.allclose(vectors, clean_vectors, atol=1e-6)
    # published: the next --full embeds every shard again
    again = job.run("--full", *settings)
    assert again.rc == 0 and again.report["shards"]["embedded"] == 4 and _shards_of(job.log) == set("abcd")


def test_a_full_run_stopped_before_any_commit_reuses_nothing_from_before(tmp_path, fake_model):
    """Entries of the runs before a --full run are never taken for its own (same settings, same fingerprints)."""
    write_shards(tmp_path / "data", names="abc")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    assert job.run("--full", fault="after_model_load:1:term").rc == 143
    resumed = job.run("--full")
    assert resumed.rc == 0 and resumed.report["shards"] == {"total": 3, "embedded": 3, "reused": 0}
    assert _shards_of(job.log) == set("abc")
    assert_clean(job.out)


def test_a_stopped_full_run_of_workers_resumes_with_full(tmp_path, fake_model):
    """Worker processes commit the shards themselves: their commits are the --full run's too."""
    write_shards(tmp_path / "data", names="abcd")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0

    def run(fault: str | None) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tests.fake_cli", *job.argv("--full", "--max-length", "16", "--workers", "2")]
        env = {**os.environ, "PYTHONPATH": str(REPO), "PETAL_TEST_FAKE_ENGINE": str(job.log)}
        env.pop("PETAL_FAULT", None)
        if fault:
            env["PETAL_FAULT"] = fault
        return subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO, timeout=300)

    stopped = run("after_shard_commit:2:term")
    assert stopped.returncode == 143, stopped.stderr
    committed = json.loads(job.report.read_text())["shards"]["embedded"]
    assert committed >= 2
    resumed = run(None)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(job.report.read_text())["shards"] == {"total": 4, "embedded": 4 - committed,
                                                            "reused": committed}
    assert len(_shards_of(job.log)) == 4 - committed
    assert_clean(job.out)


def test_a_stopped_full_run_of_a_vectors_column_resumes_with_full(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    write_vector_shards(data, "abcd", salt=0, rows=50)
    argv = ["index", str(data), "--out", str(out), "--vectors-column", "emb", "-q", "--json-report",
            str(tmp_path / "report.json")]
    assert forkrun.petal(argv).rc == 0
    assert forkrun.petal([*argv, "--full"], {"PETAL_FAULT": "after_shard_commit:2:kill"}).rc == -signal.SIGKILL
    resumed = forkrun.petal([*argv, "--full"])
    assert resumed.rc == 0, resumed.stderr
    assert json.loads((tmp_path / "report.json").read_text())["shards"] == {"total": 4, "embedded": 2, "reused": 2}
    assert not (out / "store" / FULL_RUN_FILE).exists()
    assert_clean(out)
    again = forkrun.petal([*argv, "--full"])
    assert again.rc == 0 and json.loads((tmp_path / "report.json").read_text())["shards"]["embedded"] == 4


@pytest.mark.parametrize("between", ["killed after its publish", "a rebuild", "a run with nothing to do"])
def test_once_a_version_is_live_the_next_full_embeds_everything(tmp_path, fake_model, between):
    """The stopped --full run is resumed only while nothing else succeeded since: a --full killed right after its
    pointer swap (before it could say it was done), a petal rebuild publishing, or a plain run ending with nothing to
    do end it, and the marker does not outlive a successful run."""
    write_shards(tmp_path / "data", names="abc")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    if between == "killed after its publish":
        assert job.run("--full", fault="after_publish:1:kill").rc == -signal.SIGKILL
    else:
        assert job.run("--full", fault="after_shard_commit:1:term").rc == 143
        if between == "a rebuild":
            done = forkrun.petal(["rebuild", str(job.out), "--metric", "l2"])
            assert done.rc == 0, done.stderr
        else:
            done = job.run()
            assert done.rc == 0 and done.report["status"] == "nothing-to-do", done.stderr
        assert not (job.out / "store" / FULL_RUN_FILE).exists()
        assert_clean(job.out)
    again = job.run("--full")
    assert again.rc == 0 and again.report["shards"] == {"total": 3, "embedded": 3, "reused": 0}, again.stderr
    assert _shards_of(job.log) == set("abc")
    assert_clean(job.out)


def test_a_rollback_by_hand_after_a_publish_does_not_bring_the_stopped_full_run_back(tmp_path, fake_model):
    """The live version the stopped --full began over can be live again (a rollback by hand after another run
    published, killed before it could end the --full run): the versions handed out say a publish happened."""
    write_shards(tmp_path / "data", names="abcd")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    first = (job.out / "CURRENT").read_text()
    assert job.run("--full", fault="after_shard_commit:1:kill").rc == -signal.SIGKILL
    write_shards(tmp_path / "data", names="e")
    assert job.run(fault="after_publish:1:kill").rc == -signal.SIGKILL
    assert (job.out / "CURRENT").read_text() != first
    (tmp_path / "data" / "e.parquet").unlink()
    (job.out / "CURRENT").write_text(first)  # README's rollback
    again = job.run("--full")
    assert again.rc == 0 and again.report["shards"] == {"total": 4, "embedded": 4, "reused": 0}, again.stderr


def test_a_marker_that_cannot_be_written_is_said_and_the_run_embeds_everything(tmp_path, fake_model):
    write_shards(tmp_path / "data", names="abc")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    (job.out / "store" / FULL_RUN_FILE).mkdir()
    done = job.run("--full")
    assert done.rc == 0 and done.report["shards"]["embedded"] == 3, done.stderr
    assert f"cannot record this --full run in {job.out / 'store' / FULL_RUN_FILE}" in done.stderr
