"""``petal index --workers N`` (``--devices`` on CUDA): worker processes embed, the coordinator publishes.

Real processes (spawned workers, real SIGKILL), real Parquet, store and FAISS; the engine is the
real tiny BERT for the equality test and the logging fake (tests/fake_engine.py) where a test must
prove which rows were embedded by which run. A coordinator run as its own process (``Petal``) is forked
from the tests' preloaded forkserver (tests/_scale_shared.py): a real process that starts in milliseconds,
whose workers petal spawns as fresh interpreters.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.config import ScaleConfig
from tests._scale_shared import Petal, alive
from tests.fake_engine import embedded_ids, make_fake_model_dir, read_log
from tests.test_incremental import contents

pytestmark = pytest.mark.slow


def write_shards(data: Path, count: int, rows: int, salt: str = "") -> list[str]:
    data.mkdir(parents=True, exist_ok=True)
    ids = []
    for s in range(count):
        shard_ids = [f"s{s}-{i}" for i in range(rows)]
        texts = [f"shard {s} document {i} {salt} about topic {i % 5} and more words" for i in range(rows)]
        pq.write_table(pa.table({"id": shard_ids, "text": texts}), data / f"shard-{s:02d}.parquet", row_group_size=7)
        ids += shard_ids
    return ids


def index_cli(*args: str) -> None:
    result = CliRunner().invoke(cli, ["index", *args, "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_two_workers_give_the_single_process_index(tiny_bert_dir, tmp_path):
    data = tmp_path / "data"
    ids = write_shards(data, count=5, rows=23)
    common = [str(data), "--model", str(tiny_bert_dir), "--device", "cpu", "--max-seqs", "8"]
    index_cli(*common, "--out", str(tmp_path / "one"))
    index_cli(*common, "--out", str(tmp_path / "pool1"), "--workers", "1")
    index_cli(*common, "--out", str(tmp_path / "two"), "--workers", "2", "--json-report", str(tmp_path / "r.json"))
    one_rows, one_vectors = contents(tmp_path / "one")
    assert sorted(r["id"] for r in one_rows) == sorted(ids)
    for other in ("pool1", "two"):
        rows, vectors = contents(tmp_path / other)
        assert rows == one_rows  # same ids, rows and shards in the same FAISS order
        np.testing.assert_allclose(vectors, one_vectors, rtol=0, atol=1e-5)
    report = json.loads((tmp_path / "r.json").read_text())
    workers = report["workers"]
    assert [w["worker"] for w in workers] == [0, 1] and all(w["status"] == "done" for w in workers)
    assert sum(w["shards"] for w in workers) == 5 and sum(w["rows"] for w in workers) == len(ids)
    assert report["shards"]["embedded"] == 5 and report["tokens"] == sum(w["tokens"] for w in workers) > 0
    assert report["engine"]["workers"] == 2


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def committed(out: Path) -> int:
    return len(list((out / "store" / "shards").glob("*/*/entry.json")))


def wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def worker_pids(log: Path, coordinator: int) -> list[int]:
    return sorted({r["pid"] for r in read_log(log) if r.get("load") and r["pid"] != coordinator})


def embedding_worker(log: Path, coordinator: int) -> int:
    """The worker that embedded the latest rows: it holds uncommitted work (one that claimed nothing more may
    be done already: a worker's read-ahead can claim several small shards before the other asks)."""
    return [r["pid"] for r in read_log(log) if "id" in r and r["pid"] != coordinator][-1]


def test_kill_9_of_a_worker_exits_75_then_the_rerun_embeds_only_what_is_missing(fake_model, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    ids = write_shards(data, count=12, rows=20)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
            "--workers", "2"]
    first_log = tmp_path / "first.jsonl"
    # NOTE: every worker sleeps 0.25 s a batch (5 batches a shard), so 12 shards take the pair ~7.5 s: the kill
    # lands with shards left even when a loaded machine lets the poll below lag by seconds (at 0.05 s a batch a
    # busy CI host once saw all 12 committed before the SIGKILL).
    slow = "after_batch:1+:sleep=0.25"
    child = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(first_log), "PETAL_FAULT": slow}, tmp_path / "first.json")
    wait_for(lambda: len(worker_pids(first_log, child.pid)) == 2 and committed(out) >= 1)
    victim = embedding_worker(first_log, child.pid)
    os.kill(victim, signal.SIGKILL)
    rc, stderr, report = child.wait()
    assert rc == 75, stderr
    last = stderr.strip().splitlines()[-1]
    assert f"pid {victim}" in last and "SIGKILL" in last and "rerun" in last, last
    assert report["status"] == "failed" and report["exit_code"] == 75
    statuses = sorted(w["status"] for w in report["workers"])
    assert statuses == ["done", "lost"], report["workers"]
    done = committed(out)
    assert 1 <= done < 12 and report["shards"]["embedded"] == done
    # the lost worker's entry names its pid and what the coordinator saw it commit (was: worker, device, status)
    lost = next(w for w in report["workers"] if w["status"] == "lost")
    assert lost["pid"] == victim and {"shards", "ranges", "rows", "tokens"} <= lost.keys(), lost
    assert sum(w["shards"] for w in report["workers"]) == done, report["workers"]
    assert sum(w["rows"] for w in report["workers"]) == report["rows"]["embedded"] == 20 * done
    assert report["tokens"] == sum(w["tokens"] for w in report["workers"]) > 0, report["workers"]
    first_embedded = embedded_ids(first_log)

    second_log = tmp_path / "second.jsonl"
    rc, stderr, report = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(second_log)}, tmp_path / "second.json").wait()
    assert rc == 0, stderr
    assert report["shards"] == {"total": 12, "embedded": 12 - done, "reused": done}
    again = embedded_ids(second_log)
    assert len(again) == len(set(again)) == 20 * (12 - done)  # only the shards not committed, once each
    committed_first = {i.split("-")[0] for i in first_embedded} - {i.split("-")[0] for i in again}
    assert len(committed_first) == done  # a committed shard is never embedded again
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)  # nothing lost, nothing twice
    assert not any((out / "store" / "tmp").iterdir())


def test_a_worker_killed_between_its_commit_and_its_report_counts_the_commit(fake_model, tmp_path):
    """SIGKILL right after a worker's rename committed a shard, before its "commit" event: the coordinator
    finds the entry in the store, so the report and the exit message count what the store holds (what the
    rerun reuses), not one fewer."""
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data, count=12, rows=20)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
            "--workers", "2"]
    fault = "store_committed:2:kill,after_batch:1+:sleep=0.02"  # each worker dies just after its 2nd commit
    rc, stderr, report = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"), "PETAL_FAULT": fault},
                               tmp_path / "first.json").wait()
    assert rc == 75, stderr
    done = committed(out)
    assert 2 <= done < 12 and report["shards"]["embedded"] == done, (done, report["shards"])
    assert f"{done} of 12 shards committed" in stderr.strip().splitlines()[-1], stderr
    rc, stderr, report = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "second.jsonl")},
                               tmp_path / "second.json").wait()
    assert rc == 0, stderr
    assert report["shards"] == {"total": 12, "embedded": 12 - done, "reused": done}


def test_a_worker_error_right_after_a_commit_it_did_not_report_counts_the_commit(fake_model, tmp_path):
    """Shards of 5 rows complete two at a time (one step holds both): the first is renamed into the store, the second's
    commit fails (an error, fault ``store_commit_begin:2:eio``), so the worker never reports the first. The coordinator
    finds it in the store, as for a worker killed after its rename: the report, the worker's entry and the exit message
    count what the store holds (what the rerun reuses). Before: 0 embedded, '0 of 4 shards committed', one in the
    store."""
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data, count=4, rows=5)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--workers", "1"]
    rc, stderr, report = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"),
                                      "PETAL_FAULT": "store_commit_begin:2:eio"}, tmp_path / "r.json").wait()
    assert rc == 74, stderr
    held = committed(out)
    assert held == 1 and report["shards"]["embedded"] == held and report["rows"]["embedded"] == 5 * held, report
    assert [w["shards"] for w in report["workers"]] == [held], report["workers"]
    assert f"; {held} of 4 shards committed, {4 - held} not" in stderr.strip().splitlines()[-1], stderr


def test_a_worker_error_stops_the_run_with_its_exit_code(fake_model, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data, count=3, rows=10)
    rc, stderr, report = Petal(["index", str(data), "--out", str(out), "--model", str(fake_model), "-q",
                                "--workers", "2"], {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"),
                                                    "PETAL_FAULT": "read_batch:1+:eio"}, tmp_path / "r.json").wait()
    assert rc == 74 and report["exit_code"] == 74, stderr
    last = stderr.strip().splitlines()[-1]
    assert "read error" in last
    # a rerun cures a disk error only once the storage does (was: 'rerun to embed only what is missing', as for 75)
    assert "0 of 3 shards committed, 3 not: once the storage (or the host's memory) recovers, a rerun embeds only " \
        "what is missing" in last, last
    assert "rerun to embed only" not in last, last


def corrupt_page(path: Path, group: int) -> None:
    """Overwrite 8 bytes of row group ``group``'s text page of ``path`` (its footer still reads: preflight passes, the
    rows phase fails, 65)."""
    meta = pq.ParquetFile(path).metadata
    at = meta.row_group(group).column(1).data_page_offset + 20
    data = bytearray(path.read_bytes())
    data[at:at + 8] = b"\x7f\xff\x00\xff\x13\x80\xff\xee"
    path.write_bytes(bytes(data))


def write_plain_shard(path: Path, s: int) -> list[str]:
    """Shard ``s``: 40 rows in row groups of 10, uncompressed and without dictionary pages (``corrupt_page``'s aim)."""
    ids = [f"s{s}-{i}" for i in range(40)]
    pq.write_table(pa.table({"id": ids, "text": [f"shard {s} document {i}" for i in range(40)]}), path,
                   row_group_size=10, compression="none", use_dictionary=False)
    return ids


@pytest.mark.parametrize(("case", "code", "advice"), [
    ("corrupt-page", 65, "the committed ones are kept: once the input is fixed, a rerun embeds only what is missing"),
    ("bug", 1, "this is a bug in petal (the traceback is above): a rerun reuses the committed ones but may fail the "
               "same way"),
])
def test_a_worker_errors_rerun_advice_fits_its_exit_code(fake_model, tmp_path, case, code, advice):
    """A worker's error that a retry does not cure ends with what the store holds and what a rerun does for its code:
    a shard with a corrupt data page (65) is the one-process run's message, then 'N of 5 shards committed, K not' and
    that a rerun embeds only what is missing once the input is fixed (and it does); an internal error (1, an
    exception no code maps) says it is a bug, which a rerun (reusing the committed shards) may meet again. Before,
    both said 'rerun to embed only what is missing', as a lost worker (75) does, and a rerun failed the same way."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    ids = [i for s in range(5) for i in write_plain_shard(data / f"shard-{s}.parquet", s)]
    env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}
    if case == "corrupt-page":
        corrupt_page(data / "shard-3.parquet", 2)
    else:
        env["PETAL_FAULT"] = "store_commit_begin:2:raise"  # each worker's second commit raises (a bug: exit 1)
    argv = ["index", str(data), "--model", str(fake_model), "-q"]
    rc, stderr, report = Petal([*argv, "--out", str(out), "--workers", "2"], env, tmp_path / "two.json").wait()
    assert rc == code and report["exit_code"] == code, stderr
    last = stderr.strip().splitlines()[-1]
    held = committed(out)
    assert held == report["shards"]["embedded"] and 1 <= held < 5, (held, report["shards"])
    assert f"; {held} of 5 shards committed, {5 - held} not: {advice}" in last, last
    assert "rerun to embed only" not in last, last
    if code != 65:
        return
    one_rc, one_stderr, _ = Petal([*argv, "--out", str(tmp_path / "one")], env, tmp_path / "one.json").wait()
    assert one_rc == 65 and last.startswith(one_stderr.strip().splitlines()[-1] + "; "), (one_stderr, last)
    write_plain_shard(data / "shard-3.parquet", 3)  # the input fixed: the rerun embeds only what is missing
    rc, stderr, report = Petal([*argv, "--out", str(out), "--workers", "2"], env, tmp_path / "rerun.json").wait()
    assert rc == 0 and report["shards"] == {"total": 5, "embedded": 5 - held, "reused": held}, stderr
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)


def test_a_resumed_runs_failure_counts_every_shard_the_store_holds(fake_model, tmp_path):
    """A run that resumes an earlier one and fails too says 'N of M shards committed' of all its shards, as its summary
    line counts them: N the shards reused from the earlier run plus those it committed (what the store holds, what
    the next rerun reuses), M every shard. Before: only the shards this run had to embed ('6 shards (3 embedded, 2
    reused)' above '3 of 4 shards committed')."""
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data, count=6, rows=20)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4"]
    env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"),
           "PETAL_FAULT": "store_commit_begin:2:kill,after_batch:1+:sleep=0.2"}  # each worker dies at its 2nd commit
    rc, stderr, report = Petal([*argv, "--workers", "2"], env, tmp_path / "first.json").wait()
    first = committed(out)
    assert rc == 75 and 1 <= first < 6 and report["shards"]["embedded"] == first, stderr
    assert f"; {first} of 6 shards committed, {6 - first} not: rerun to embed only what is missing" in \
        stderr.strip().splitlines()[-1], stderr
    rc, stderr, report = Petal([*argv, "--workers", "3"], env, tmp_path / "second.json").wait()
    held = committed(out)
    assert rc == 75 and report["shards"]["reused"] == first and first < held < 6, (stderr, report["shards"])
    assert report["shards"]["embedded"] == held - first and report["shards"]["total"] == 6, report["shards"]
    summary, last = stderr.strip().splitlines()[-2:]
    assert f"6 shards ({held - first} embedded, {first} reused)" in summary, summary
    assert f"; {held} of 6 shards committed, {6 - held} not: rerun to embed only what is missing" in last, last


def test_devices_flag_checks(tmp_path, fake_model):
    assert ScaleConfig(devices="0,1").device_ids(2) == [0, 1]
    assert ScaleConfig(devices="all").device_ids(3) == [0, 1, 2]
    assert ScaleConfig(devices="2").device_ids(4) == [0, 1]
    assert ScaleConfig(devices="3,").device_ids(4) == [3]
    for bad in ("0,0", "x", "0", "-1"):
        with pytest.raises(ValueError):
            ScaleConfig(devices=bad)
    with pytest.raises(ValueError, match="does not exist"):
        ScaleConfig(devices="0,5").device_ids(2)
    data = tmp_path / "data"
    write_shards(data, count=1, rows=3)
    runner = CliRunner()
    bad = runner.invoke(cli, ["index", str(data), "--out", str(tmp_path / "o"), "--devices", "zero"])
    assert bad.exit_code == 2 and "--devices" in bad.output
    # NOTE: --devices on the CPU is a flag value the run judges, as --device cuda without CUDA: 2 (was 78, a
    # configuration error)
    for devices in ("1", "2", "all", "3,"):
        cpu = runner.invoke(cli, ["index", str(data), "--out", str(tmp_path / "o"), "--model", str(fake_model),
                                  "--device", "cpu", "--devices", devices, "-q"],
                            env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "l.jsonl")})
        assert cpu.exit_code == 2 and f"--devices {devices} needs CUDA" in cpu.output, cpu.output
        assert "--workers" in cpu.output and "Traceback" not in cpu.output


def test_devices_past_the_visible_ones_are_a_flag_error(monkeypatch):
    """``--devices 3`` on a host with two CUDA devices: 2 naming the flag, not 78."""
    import torch

    from petal.pipeline.jobs.workers import worker_slots
    from petal.pipeline.reliability.errors import FlagError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for devices, said in (("3", "only 2 CUDA device"), ("0,5", "device 5 does not exist")):
        with pytest.raises(FlagError, match=said) as caught:
            worker_slots(ScaleConfig(devices=devices), "cuda")
        assert caught.value.exit_code == 2 and "--devices" in str(caught.value)


def test_sigterm_of_the_coordinator_stops_every_worker_then_resumes(fake_model, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    ids = write_shards(data, count=8, rows=20)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
            "--workers", "2"]
    log = tmp_path / "first.jsonl"
    # NOTE: 0.05 s a batch (5 batches a shard), then 0.3 s from each worker's second shard on: the signal, sent once
    # a shard is committed, lands with shards left even when a loaded machine lets the poll lag by seconds (at
    # 0.05 s throughout, the other 7 shards took ~1 s: the kill-9 test above once saw all committed that way)
    slow = "after_batch:1+:sleep=0.05,after_batch:6+:sleep=0.25"
    child = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(log), "PETAL_FAULT": slow}, tmp_path / "first.json")
    wait_for(lambda: len(worker_pids(log, child.pid)) == 2 and committed(out) >= 1)
    workers = worker_pids(log, child.pid)
    child.send_signal(signal.SIGTERM)
    rc, stderr, report = child.wait()
    assert rc == 143 and report["status"] == "interrupted", stderr
    # each worker stopped by the signal says so (was "error", as a worker that failed)
    assert {w["status"] for w in report["workers"]} <= {"interrupted", "done"}, report["workers"]
    for pid in workers:  # no worker outlives the run
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    done = committed(out)
    assert done == report["shards"]["embedded"] < 8 and not any((out / "store" / "tmp").iterdir())
    # an interrupted worker still reports what it committed, and the run's tokens count it (was: only worker, device
    # and status, tokens 0)
    assert sorted(w["pid"] for w in report["workers"]) == workers, report["workers"]
    assert sum(w["shards"] for w in report["workers"]) == done, report["workers"]
    assert sum(w["rows"] for w in report["workers"]) == report["rows"]["embedded"] == 20 * done
    first_tokens = report["tokens"]
    assert first_tokens == sum(w["tokens"] for w in report["workers"]) > 0, report["workers"]
    rc, stderr, report = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "second.jsonl")},
                               tmp_path / "second.json").wait()
    assert rc == 0 and report["shards"] == {"total": 8, "embedded": 8 - done, "reused": done}, stderr
    # the stopped run's tokens and its resume's add up to one whole run's: tokens are the committed rows'
    rc, stderr, whole = Petal([*argv[:3], str(tmp_path / "whole"), *argv[4:]],
                              {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "third.jsonl")}, tmp_path / "third.json").wait()
    assert rc == 0 and first_tokens + report["tokens"] == whole["tokens"], (first_tokens, report["tokens"], whole)
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)


def test_every_worker_gets_units_when_the_first_could_read_them_all_ahead(fake_model, tmp_path):
    """6 small shards, 2 workers: a worker claims a unit only while fewer than 2 it claimed are not yet taken by its
    embed loop. Before, the first worker to start claimed every shard for its 16-chunk read-ahead (while the other
    still loaded), so the other embedded nothing and --workers 2 ran as one worker."""
    data, out = tmp_path / "data", tmp_path / "out"
    ids = write_shards(data, count=6, rows=20)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
            "--workers", "2"]
    env = {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"), "PETAL_FAULT": "after_batch:1+:sleep=0.3"}
    rc, stderr, report = Petal(argv, env, tmp_path / "report.json").wait()
    assert rc == 0, stderr
    assert sorted(w["shards"] for w in report["workers"])[0] >= 1, report["workers"]
    assert sum(w["shards"] for w in report["workers"]) == 6
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)


def test_a_worker_whose_engine_load_hangs_is_killed_and_the_run_exits_75(fake_model, tmp_path):
    """Every worker's engine load hangs (a sleep of 10 minutes at its after_model_load point, before its "ready"):
    with PETAL_WORKER_START_TIMEOUT=3 the coordinator kills each one 3 s after its spawn and exits 75 naming the
    worker and the limit, no worker left running; the rerun embeds everything. Before, it waited for ever."""
    data, out = tmp_path / "data", tmp_path / "out"
    ids = write_shards(data, count=3, rows=10)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--workers", "2"]
    log = tmp_path / "first.jsonl"
    env = {"PETAL_TEST_FAKE_ENGINE": str(log), "PETAL_FAULT": "after_model_load:1:sleep=600",
           "PETAL_WORKER_START_TIMEOUT": "3"}
    started = time.monotonic()
    child = Petal(argv, env, tmp_path / "first.json")
    workers = child.workers_until_exit(timeout=90)  # NOTE: killed 3 s after its spawn, loaded or not (a busy host)
    rc, stderr, report = child.wait(timeout=10)
    assert rc == 75 and report["exit_code"] == 75, stderr
    assert time.monotonic() - started < 60
    last = stderr.strip().splitlines()[-1]
    assert "did not load its engine within 3 s" in last and "PETAL_WORKER_START_TIMEOUT" in last, last
    assert "0 of 3 shards committed" in last and "rerun" in last, last
    assert "Traceback" not in stderr
    assert sorted(w["status"] for w in report["workers"]) == ["lost", "lost"], report["workers"]
    assert len(workers) == 2 and not any(alive(pid) for pid in workers), workers  # every worker killed
    rc, stderr, report = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "second.jsonl")},
                               tmp_path / "second.json").wait()
    assert rc == 0 and report["shards"]["embedded"] == 3, stderr
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)


def test_a_bad_worker_start_timeout_is_a_configuration_error(fake_model, tmp_path):
    data = tmp_path / "data"
    write_shards(data, count=1, rows=3)
    for bad in ("0", "-5", "soon", "inf"):
        result = CliRunner().invoke(cli, ["index", str(data), "--out", str(tmp_path / "out"), "--model",
                                          str(fake_model), "-q", "--workers", "2"],
                                    env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"),
                                         "PETAL_WORKER_START_TIMEOUT": bad})
        assert result.exit_code == 78, result.output
        assert f"PETAL_WORKER_START_TIMEOUT={bad!r} is not a number" in result.output.strip().splitlines()[-1]


def test_no_more_workers_start_than_there_are_units(fake_model, tmp_path):
    """--workers 4 over 2 shards starts 2 workers: each loads its engine (a GPU's memory, seconds to minutes), and the
    2 more would have loaded theirs for nothing. Before, 4 started and 2 or 3 embedded nothing."""
    data, out = tmp_path / "data", tmp_path / "out"
    ids = write_shards(data, count=2, rows=10)
    log = tmp_path / "log.jsonl"
    child = Petal(["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--workers", "4"],
                  {"PETAL_TEST_FAKE_ENGINE": str(log)}, tmp_path / "report.json")
    rc, stderr, report = child.wait()
    assert rc == 0, stderr
    assert [w["worker"] for w in report["workers"]] == [0, 1] and report["engine"]["workers"] == 2, report["workers"]
    assert len(worker_pids(log, child.pid)) == 2  # engines loaded
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)


def test_sigterm_ends_the_run_in_bounded_time_when_a_worker_never_reaches_a_batch_boundary(fake_model, tmp_path):
    """SIGTERM while every worker's engine load hangs (a 10-minute sleep before its "ready"): the workers get the
    signal, cannot act on it, and are killed once the shutdown grace (30 s) is over; the run ends 143 with no worker
    left. Before, the coordinator waited for them to end on their own: until the start timeout killed them (600 s by
    default; before that timeout existed, for ever)."""
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data, count=3, rows=10)
    argv = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--workers", "2"]
    log = tmp_path / "log.jsonl"
    child = Petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(log), "PETAL_FAULT": "after_model_load:1:sleep=600"},
                  tmp_path / "report.json")
    wait_for(lambda: len(worker_pids(log, child.pid)) == 2)  # both engines created, both loads now hanging
    workers = worker_pids(log, child.pid)
    started = time.monotonic()
    child.send_signal(signal.SIGTERM)
    rc, stderr, report = child.wait(timeout=150)
    assert rc == 143 and report["status"] == "interrupted", stderr
    assert time.monotonic() - started < 90
    assert not any(alive(pid) for pid in workers), workers
    assert "Traceback" not in stderr


def broken_copy(model: Path, path: Path) -> Path:
    """A copy of ``model`` at ``path`` with its weights cut in half: the header holds, the tensors' data does not (a
    copy that did not finish). Its config, tokenizer and hash pass the coordinator's checks; the load fails."""
    import shutil

    shutil.copytree(model, path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return path


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory, tiny_bert_dir) -> Path:
    return broken_copy(tiny_bert_dir, tmp_path_factory.mktemp("broken-model") / "model")


@pytest.mark.parametrize(("flags", "code", "named"), [
    (["--model", "BROKEN"], 78, "model.safetensors"),
    (["--model", "TINY", "--attention", "flashinfer"], 2, "flashinfer"),
], ids=["model-fails-to-load", "kernel-this-host-lacks"])
def test_a_workers_engine_load_error_has_the_exit_code_of_one_process(broken_model, tiny_bert_dir, tmp_path, flags,
                                                                     code, named):
    """A model whose weights do not load (78) or an attention kernel the flags ask for and the CPU lacks (2) is the
    same error with --workers 2 as in one process: its code, its one line, no traceback. Before: each worker printed
    its traceback and the run exited 1, 'internal error in worker 0: ModelError(...)' (a bug's code for a model
    that did not copy whole; Airflow retried it as one)."""
    data = tmp_path / "data"
    write_shards(data, count=3, rows=5)
    flags = [{"BROKEN": str(broken_model), "TINY": str(tiny_bert_dir)}.get(f, f) for f in flags]
    argv = ["index", str(data), "--device", "cpu", "-q", *flags]
    alone = CliRunner().invoke(cli, [*argv, "--out", str(tmp_path / "one")])
    assert alone.exit_code == code and named in alone.output, alone.output
    rc, stderr, report = Petal([*argv, "--out", str(tmp_path / "two"), "--workers", "2"], {},
                               tmp_path / "r.json").wait()
    assert rc == code, stderr
    last = stderr.strip().splitlines()[-1]
    assert named in last and "internal error" not in last, stderr
    assert "Traceback" not in stderr, stderr
    if named == "flashinfer":  # judged from the flags (--device cpu) before any worker starts: its report says so
        assert report["exit_code"] == code and not report.get("workers"), report
    else:
        assert report["exit_code"] == code and [w["status"] for w in report["workers"]] == ["error", "error"]
        # a retry does not cure it (was: 'rerun to embed only what is missing', as for a lost worker, 75)
        assert last.endswith("; 0 of 3 shards committed, 3 not: once the configuration is fixed, a rerun embeds only "
                             "what is missing (all of it again if the fix changes the model or an embedding setting)")


def test_sigterm_while_workers_start_is_interrupted_said_once(tmp_path):
    """SIGTERM to a real ``petal index --workers 2`` (the ``petal`` script, the packaged model) while both workers are
    still starting (held at ``worker_start``, before their stop signals are their own): exit 143, each worker
    ``interrupted`` in the report and the coordinator's message alone. Before, the workers (which multiprocessing's
    spawn gives the script's argv, so petal's quiet start-up handler) each printed the line too and exited before
    saying anything, and the coordinator reported them 'lost' (a death: kill -9, OOM)."""
    import subprocess
    import sys

    data = tmp_path / "data"
    write_shards(data, count=2, rows=5)
    trace, report = tmp_path / "trace.txt", tmp_path / "report.json"
    env = {**os.environ, "PETAL_FAULT": "worker_start:1:sleep=120", "PETAL_FAULT_TRACE": str(trace),
           "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen([str(Path(sys.executable).parent / "petal"), "index", str(data), "--out",
                              str(tmp_path / "out"), "-q", "--workers", "2", "--json-report", str(report)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: trace.exists() and trace.read_text().count("worker_start") == 2, timeout=240)
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 143, stderr
    assert "petal: error: interrupted by SIGTERM" in stderr and "Traceback" not in stderr, stderr
    assert "petal: interrupted by SIGTERM" not in stderr, stderr  # a starting worker's line (one each)
    workers = json.loads(report.read_text())["workers"]
    assert [w["status"] for w in workers] == ["interrupted", "interrupted"], workers
