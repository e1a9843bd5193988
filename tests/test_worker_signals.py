"""Stop signals and ``petal index --workers N``'s workers: whose signal it was decides what the run says.

Real spawned workers (the fake engine, tests/fake_engine.py), real signals, real Parquet and store:

- a Ctrl-C to the whole process group (as a terminal sends it) while the workers still start: the run's one line,
  exit 130, no worker's ``KeyboardInterrupt`` traceback (was: one raw traceback per worker, from the imports of
  its start, before the run's line);
- the same Ctrl-C once they embed: 130, every worker ``interrupted`` or ``done`` (the worker's word can come before
  the coordinator's next turn: still the run's signal);
- a stop signal (SIGTERM, SIGHUP, a Ctrl-C to the process group) while the workers load their engines: the run ends
  at once, 143/129/130, every worker ``interrupted``, the report written, and a rerun completes with no leftovers
  (was: each worker's load went on to its end with the stop only noted, the coordinator waited its 30 s grace, then
  killed them as ``lost``);
- the same while the workers import (torch's import: seconds): the run ends at once, every worker ``interrupted``
  (was: the signal stayed blocked in each worker until its imports ended);
- a signal to one worker alone (a supervisor's or an OOM guard's kill of that pid): a worker failure, exit 75 naming
  the worker and the signal, finished shards committed, and a rerun embeds only the rest (was: 143 'interrupted by
  SIGTERM', no worker named, though the coordinator had no signal).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._scale_shared import Petal, worker_processes
from tests.conftest import REPO
from tests.fake_engine import IMPORT_SLEEP_ENV, make_fake_model_dir, read_log
from tests.invariants import assert_clean
from tests.test_scale_workers import committed, wait_for, worker_pids, write_shards

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def importing(pid: int) -> bool:
    """Worker ``pid`` is past its interpreter's start, in the imports of unpickling its target (numpy is mapped)."""
    try:
        return "numpy" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def group_run(argv: list[str], env: dict[str, str], stderr: Path) -> subprocess.Popen[bytes]:
    """``petal ARGV`` (the fake engine seam) as its own process group, as a terminal's foreground job is."""
    with stderr.open("w") as err:
        return subprocess.Popen([sys.executable, "-m", "tests.fake_cli", *argv], stderr=err,
                                stdout=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env})


def ctrl_c(child: subprocess.Popen[bytes], ready) -> int:
    """SIGINT to ``child``'s process group (a terminal's Ctrl-C) once ``ready()`` (or it ended); its exit status."""
    try:
        wait_for(lambda: ready() or child.poll() is not None, timeout=180)
        os.killpg(child.pid, signal.SIGINT)
        return child.wait(timeout=180)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


def test_ctrl_c_while_workers_start_is_the_runs_line_alone(fake_model, tmp_path):
    data, out, report, err = tmp_path / "data", tmp_path / "out", tmp_path / "r.json", tmp_path / "err.txt"
    write_shards(data, count=3, rows=10)
    child = group_run(["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--workers", "2",
                       "--json-report", str(report)], {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}, err)
    rc = ctrl_c(child, lambda: any(importing(pid) for pid in worker_processes(child.pid)))
    stderr = err.read_text()
    assert rc == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip().splitlines()[-1].startswith("petal: error: interrupted by SIGINT"), stderr
    workers = json.loads(report.read_text())["workers"]
    assert {w["status"] for w in workers} <= {"interrupted"}, workers


def test_ctrl_c_while_workers_embed_is_the_runs_stop(fake_model, tmp_path):
    data, out, report, err = tmp_path / "data", tmp_path / "out", tmp_path / "r.json", tmp_path / "err.txt"
    write_shards(data, count=6, rows=20)
    child = group_run(["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
                       "--workers", "2", "--json-report", str(report)],
                      {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"),
                       "PETAL_FAULT": "after_batch:1+:sleep=0.3"}, err)
    rc = ctrl_c(child, lambda: committed(out) >= 1)
    stderr = err.read_text()
    assert rc == 130 and "Traceback" not in stderr, stderr
    result = json.loads(report.read_text())
    assert result["status"] == "interrupted", result
    assert {w["status"] for w in result["workers"]} <= {"interrupted", "done"}, result["workers"]


def importing_workers(log: Path, coordinator: int) -> list[int]:
    """The workers that logged their slow import (``IMPORT_SLEEP_ENV``)."""
    return sorted({r["pid"] for r in read_log(log) if r.get("importing") and r["pid"] != coordinator})


@pytest.mark.parametrize(("sig", "phase"), [(signal.SIGTERM, "load"), (signal.SIGHUP, "load"), (signal.SIGINT, "load"),
                                            (signal.SIGTERM, "import"), (signal.SIGINT, "import")],
                         ids=["SIGTERM-load", "SIGHUP-load", "ctrl-c-load", "SIGTERM-import", "ctrl-c-import"])
def test_a_stop_while_workers_start_ends_the_run_at_once(fake_model, tmp_path, sig, phase):
    data, out, report, err = tmp_path / "data", tmp_path / "out", tmp_path / "r.json", tmp_path / "err.txt"
    write_shards(data, count=4, rows=10)
    log = tmp_path / "log.jsonl"
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--workers", "2"]
    # "load": each worker's engine is made, then its load hangs (a large model's: no batch boundary for a minute);
    # "import": each worker's imports take a minute (torch's, CUDA's libraries on a slow disk)
    env = {"PETAL_FAULT": "after_model_load:1+:sleep=60"} if phase == "load" else {IMPORT_SLEEP_ENV: "60"}
    started = worker_pids if phase == "load" else importing_workers
    child = group_run([*argv, "--json-report", str(report)], {"PETAL_TEST_FAKE_ENGINE": str(log), **env}, err)
    try:
        wait_for(lambda: len(started(log, child.pid)) == 2 or child.poll() is not None, timeout=180)
        workers = started(log, child.pid)
        sent = time.monotonic()
        if sig == signal.SIGINT:  # a terminal's Ctrl-C: the coordinator and its workers have it at once
            os.killpg(child.pid, sig)
        else:
            child.send_signal(sig)
        rc = child.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    stderr = err.read_text()
    # NOTE: a correctness bound, not a speed target: the coordinator kills a worker that ignores the stop after 30 s
    assert rc == 128 + sig and took < 15, (rc, took, stderr)
    assert "Traceback" not in stderr and f"interrupted by {sig.name}" in stderr.strip().splitlines()[-1], stderr
    result = json.loads(report.read_text())
    assert result["status"] == "interrupted", result
    assert [w["status"] for w in result["workers"]] == ["interrupted", "interrupted"], result["workers"]
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers), workers
    if sig == signal.SIGTERM:  # the lock released, nothing left behind: a rerun completes, its output clean
        rc, stderr, again = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "second.jsonl")},
                                  tmp_path / "second.json").wait()
        assert rc == 0 and again["shards"]["embedded"] == 4, stderr
        assert_clean(out)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_one_worker_alone_is_that_workers_failure(fake_model, tmp_path, sig):
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data, count=6, rows=20)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
            "--workers", "2"]
    child = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "first.jsonl"),
                         "PETAL_FAULT": "after_batch:1+:sleep=0.3"}, tmp_path / "first.json")
    wait_for(lambda: (committed(out) >= 1 and len(worker_processes(child.pid)) == 2) or child.poll() is not None,
             timeout=180)
    pids = sorted(worker_processes(child.pid))
    os.kill(pids[0], sig)
    rc, stderr, report = child.wait()
    last = stderr.strip().splitlines()[-1]
    assert rc == 75 and report["status"] == "failed" and report["exit_code"] == 75, stderr
    stopped = next(w for w in report["workers"] if w["pid"] == pids[0])
    assert f"worker {stopped['worker']} (pid {pids[0]}, cpu) was stopped by {sig.name}, which this run did not " \
           "send" in last, stderr
    assert stopped["status"] == "interrupted", report["workers"]
    done = committed(out)
    assert done == report["shards"]["embedded"] < 6 and f"{done} of 6 shards committed" in last, stderr
    if sig == signal.SIGTERM:  # the rerun embeds only what is missing
        rc, stderr, again = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "second.jsonl")},
                                  tmp_path / "second.json").wait()
        assert rc == 0 and again["shards"] == {"total": 6, "embedded": 6 - done, "reused": done}, stderr


def test_a_worker_count_below_one_names_the_keyword_and_the_range(tmp_path):
    import petal

    with pytest.raises(petal.UsageError) as caught:
        petal.index(tmp_path / "none", tmp_path / "out", workers=0)
    assert str(caught.value) == "workers 0 < 1: the number of worker processes is 1 or more"
