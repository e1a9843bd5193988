"""``petal index --workers 2``: workers whose coordinator is killed (SIGKILL) end quietly and promptly.

A real run (petal's CLI with the tests' fake engine, slowed to 0.25 s a batch, in a coordinator process forked
from the tests' preloaded forkserver: tests/_scale_shared.py; real Parquet, spawned worker processes), its
coordinator killed with SIGKILL once a shard is committed: every worker ends within seconds, none writes a
traceback (workers inherit the coordinator's stderr: a file here), and the next ``petal index`` completes the
index, reusing what the killed run committed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests._scale_shared import Coordinator, Petal, alive, worker_processes
from tests.fake_engine import make_fake_model_dir
from tests.test_incremental import contents

pytestmark = pytest.mark.slow

SHARDS, ROWS = 16, 40
TRACEBACK_WORDS = ("Traceback", "BrokenPipeError", "EOFError", "ConnectionResetError", "Exception ignored")


def _committed(out: Path) -> int:
    return len(list((out / "store" / "shards").glob("*/*/entry.json")))


def test_workers_of_a_killed_coordinator_exit_quietly_and_the_rerun_completes(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    ids = []
    for s in range(SHARDS):
        shard_ids = [f"s{s}-{i}" for i in range(ROWS)]
        texts = [f"shard {s} document {i} about topic {i % 7} and a few more words to embed" for i in range(ROWS)]
        pq.write_table(pa.table({"id": shard_ids, "text": texts}), data / f"shard-{s:02d}.parquet")
        ids += shard_ids
    out = tmp_path / "out"
    stderr_path = tmp_path / "stderr.txt"
    model = make_fake_model_dir(tmp_path / "model")
    env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl")}
    argv = ["index", str(data), "--out", str(out), "--model", str(model), "--workers", "2", "--max-seqs", "8", "-q"]
    # NOTE: 0.25 s a batch (5 batches a shard): the kill lands with shards left even when a loaded machine lets
    # the poll below lag by seconds
    coordinator = Coordinator(argv, {**env, "PETAL_FAULT": "after_batch:1+:sleep=0.25"}, stderr=stderr_path)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and coordinator.poll() is None:
            workers = sorted(set(workers) | set(worker_processes(coordinator.pid)))
            if len(workers) == 2 and _committed(out) >= 1:
                break
            time.sleep(0.1)
        assert coordinator.poll() is None, f"the run ended before it could be killed: {stderr_path.read_text()}"
        assert len(workers) == 2 and _committed(out) >= 1, "no worker committed a shard in time"
        assert _committed(out) < SHARDS
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait()
        # prompt: a worker notices at its next word on the pipe, or by its parent's pid (a watchdog)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(alive(pid) for pid in workers):
            time.sleep(0.1)
        survivors = [pid for pid in workers if alive(pid)]
    finally:
        coordinator.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not survivors, f"workers {survivors} outlived their coordinator"
    time.sleep(0.5)  # anything the workers' last moments wrote is in the file
    text = stderr_path.read_text(errors="replace")
    assert not any(word in text for word in TRACEBACK_WORDS), text
    committed = _committed(out)
    assert 1 <= committed <= SHARDS

    # the store is consistent: the next run reuses every committed shard, embeds the rest, and publishes them all
    report_path = tmp_path / "report.json"
    rc, stderr, report = Petal(argv, env, report_path).wait(600)
    assert rc == 0, stderr
    assert report["shards"]["embedded"] + report["shards"]["reused"] == SHARDS, report["shards"]
    assert report["shards"]["reused"] == committed  # every entry the killed run left is whole
    rows, _ = contents(out)
    assert sorted(row["id"] for row in rows) == sorted(ids)
