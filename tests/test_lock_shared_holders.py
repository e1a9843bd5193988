"""The writer lock against holders that are no petal writer (RELIABILITY.md promise 5), in real processes: a starting
run's probe (``OutputDir.check_unlocked``, a shared flock held an instant) never makes a writer exit 75, and a refusal
never names a finished process as the holder (``.lock`` records the last writer until the next one records itself)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_engine import make_fake_model_dir
from tests.test_reliability import Job, wait_for, write_shards

# a process holding a flock on OUT/.lock (-s shared, -x exclusive) until its stdin closes
HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH if sys.argv[2] == "-s" else fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""
# a process probing the lock as every starting run does, in a loop, until its stdin closes
PROBE = """
import sys, threading
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.errors import TemporaryFailure
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
out = OutputDir(sys.argv[1])
print("probing", flush=True)
while not done.is_set():
    try:
        out.check_unlocked()
    except TemporaryFailure:  # a run holds the lock: the probe is refused, as it should be
        pass
"""


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def job(tmp_path, fake_model) -> Job:
    write_shards(tmp_path / "data")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    return job


def start(script: str, *argv: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", script, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() in (b"held\n", b"probing\n")
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    assert process.stdin is not None
    process.stdin.close()
    assert process.wait(30) == 0


def test_runs_beside_a_probing_run_are_never_refused(job):
    """Was: 9 of 120 back-to-back runs beside a probing loop exited 75 naming the last (finished) writer."""
    prober = start(PROBE, str(job.out))
    try:
        results = [job.run() for _ in range(20)]
    finally:
        stop(prober)
    assert [r.rc for r in results] == [0] * len(results), [r.stderr for r in results if r.rc]


def test_a_shared_holder_of_an_instant_is_waited_for(job):
    holder = start(HOLD, str(job.out / ".lock"), "-s")
    child = job.start()
    time.sleep(0.5)  # NOTE: under SHARED_GRACE_S (2 s): the writer meets the shared lock, which goes before the grace
    stop(holder)
    result = child.wait()
    assert result.rc == 0 and result.report["status"] == "nothing-to-do", result.stderr


def test_a_long_shared_holder_is_75_naming_no_finished_writer_and_wait_queues(job):
    finished = json.loads((job.out / ".lock").read_text())["pid"]  # the first run's, which has exited
    holder = start(HOLD, str(job.out / ".lock"), "-s")
    try:
        refused = job.run()
        assert refused.rc == 75, refused.stderr
        assert "shared lock on" in refused.stderr and "--wait" in refused.stderr, refused.stderr
        assert f'"pid": {finished}' not in refused.stderr and "being written by another petal" not in refused.stderr
        waiter = job.start("--wait")
        wait_for(lambda: "waiting for the writer lock" in waiter.stderr_so_far())
        assert "shared lock on" in waiter.stderr_so_far() and f'"pid": {finished}' not in waiter.stderr_so_far()
    finally:
        stop(holder)
    assert waiter.wait().rc == 0


def test_an_exclusive_holder_that_never_recorded_itself_is_not_the_finished_writer(job):
    """The window between a writer's flock and its record in .lock, held open: the process .lock names has exited."""
    finished = json.loads((job.out / ".lock").read_text())
    holder = start(HOLD, str(job.out / ".lock"), "-x")
    try:
        for second in (job.run(), job.run("--full")):  # the probe before preflight, and (--full reads) the same
            assert second.rc == 75, second.stderr
            assert "being written by another petal" not in second.stderr, second.stderr
            assert f'"pid": {finished["pid"]}' in second.stderr and "has exited" in second.stderr, second.stderr
    finally:
        stop(holder)
    assert job.run().rc == 0
