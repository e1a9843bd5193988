"""``petal index --ray``: a real local Ray instance (``ray.init(num_cpus=2)``, CPU actors, one per module) embeds
the shards, and row-group ranges of a large one, through Ray Data; the driver publishes. Ray is in the ``test``
extra, so CI runs these; skipped only where Ray is not installed (``pip install 'petal[ray]'``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import make_fake_model_dir, read_log
from tests.test_incremental import contents
from tests.test_scale_ranges import write_big_shard
from tests.test_scale_workers import broken_copy, write_shards

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


_FAULT: dict[str, str | None] = {}  # "armed": the PETAL_FAULT the running local Ray gives its actors


def start_ray(fault: str | None = None) -> None:
    """The local Ray instance, its actors given ``PETAL_FAULT=fault`` (None: no fault). Actors take their environment
    from ``ray.init``, so Ray is started again only when ``fault`` is not what the running one gives."""
    if ray.is_initialized() and _FAULT.get("armed", "") == fault:
        return
    ray.shutdown()
    env = {"PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", **({"PETAL_FAULT": fault} if fault else {})}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    _FAULT["armed"] = fault


@pytest.fixture(scope="module")
def local_ray():
    """``start_ray``, for a test to call with the fault it needs; one local Ray per module, shut down at its end
    (NOTE: the test that arms a fault runs first, so Ray starts twice in the module, not three times)."""
    yield start_ray
    ray.shutdown()
    _FAULT.clear()


def index(*args: str, env: dict[str, str] | None = None):
    return fake_invoke(["index", *args, "-q"], env=env)


@contextlib.contextmanager
def sigterm_while_running(ready: Callable[[], bool], settle_s: float = 1.0,
                          within_s: float = 60.0) -> Iterator[threading.Event]:
    """SIGTERM this process (the CLI's stop signals are petal's own here: CliRunner) from a thread, ``settle_s`` after
    ``ready()``, while the ``with`` body (the run) still runs; the event yielded says whether it was sent.
    NOTE: never once the body has returned, nor when ``ready()`` is not true within ``within_s`` (the test fails on
    the event instead): a SIGTERM that no run's handler takes would stop pytest itself, the whole CI run. A handler
    that does nothing stands in for the instant between the run's end and the thread's last look."""
    done, sent, lock = threading.Event(), threading.Event(), threading.Lock()

    def terminate() -> None:
        deadline = time.monotonic() + within_s
        while not ready():
            if done.wait(0.1) or time.monotonic() > deadline:
                return
        if done.wait(settle_s):
            return
        with lock:
            if not done.is_set():
                os.kill(os.getpid(), signal.SIGTERM)
                sent.set()

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    killer = threading.Thread(target=terminate, daemon=True)
    killer.start()
    try:
        yield sent
    finally:
        with lock:
            done.set()
        killer.join()
        signal.signal(signal.SIGTERM, previous)


def test_an_actor_whose_engine_load_hangs_is_killed_after_the_start_timeout(local_ray, tmp_path):
    """Every actor's engine load hangs (a sleep at its after_model_load point): with PETAL_WORKER_START_TIMEOUT=2 the
    driver kills each 2 s after it began loading and exits 75 naming the setting, as the local worker pool does, and
    the actors' CPUs are free again. Before, Ray waited for the constructors without a limit: the run ended only when
    the load did (here after 120 s, exit 0; a real hung load, never)."""
    local_ray("after_model_load:1:sleep=120")
    model = make_fake_model_dir(tmp_path / "model")
    data = tmp_path / "data"
    write_shards(data, count=3, rows=5)
    started = time.monotonic()
    result = index(str(data), "--out", str(tmp_path / "out"), "--model", str(model), "--ray", "--workers", "2",
                   env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"), "PETAL_WORKER_START_TIMEOUT": "2"})
    took = time.monotonic() - started
    assert result.exit_code == 75, result.output
    last = result.output.strip().splitlines()[-1]
    assert "did not load" in last and "within 2 s" in last and "PETAL_WORKER_START_TIMEOUT" in last, last
    assert "0 of 3 shards committed" in last and took < 90, (took, last)  # NOTE: far from 120 on a busy machine
    deadline = time.monotonic() + 20
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2  # the hung actors are gone, not holding the cluster


def test_the_report_has_each_actors_oom_splits_and_engine_as_for_workers(local_ray, tmp_path):
    """--ray --json-report: an actor's first step runs out of device memory and is split (fault engine_step:1:oom).
    The report counts the split (retries.oom_splits, the summary's 'oom splits') and has each actor's engine, stats
    and load time, as --workers has each worker's. Before, the actor's split was dropped on the way (0, a run's
    device trouble silent) and the actors had only counts."""
    local_ray("engine_step:1:oom")
    model = make_fake_model_dir(tmp_path / "model")
    write_shards(tmp_path / "data", count=3, rows=5)
    result = index(str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model), "--ray",
                   "--workers", "1", "--json-report", str(tmp_path / "r.json"),
                   env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")})
    assert result.exit_code == 0, result.output
    assert "1 oom splits" in result.output.strip().splitlines()[-1], result.output
    report = json.loads((tmp_path / "r.json").read_text())
    [actor] = report["workers"]
    assert report["retries"]["oom_splits"] == 1 and actor["oom_splits"] == 1, report
    assert actor["engine"]["device"] == "cpu" and actor["stats"]["steps"] >= 1 and "start" in actor["timings_s"], actor
    assert report["engine"]["workers"] == 1 and report["engine"]["engines"][0]["pid"] == actor["pid"], report
    assert "model_load" in report["timings_s"], report


def test_an_actor_failing_between_its_commit_and_its_row_counts_the_commit(local_ray, tmp_path):
    """An actor's second shard is renamed into the store, then its batch fails before the row reaches the
    driver (fault ``store_committed``; later shards fail before committing): the exit message counts
    what the store holds, as the rerun reuses it, not what came back."""
    local_ray("store_committed:2:raise,store_commit_begin:3+:eio")  # NOTE: actors take their environment there
    model = make_fake_model_dir(tmp_path / "model")
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data, count=8, rows=10)
    first = index(str(data), "--out", str(out), "--model", str(model), "--ray", "--workers", "1",
                  "--json-report", str(tmp_path / "first.json"),
                  env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "first.jsonl")})
    assert first.exit_code == 75, first.output
    stored = len(list((out / "store" / "shards").glob("*/*/entry.json")))
    assert stored == 2, stored
    assert "2 of 8 shards committed" in first.output, first.output
    # petal's line, naming the actor's error and where Ray's own diagnostics went, not Ray Data's traceback on stderr
    last = first.output.strip().splitlines()[-1]
    assert "Traceback" not in first.output and "Ray's logs: " in last and "InjectedFault: " in last, first.output
    logs = Path(last.split("Ray's logs: ")[1].split(")")[0])
    assert any("Traceback" in log.read_text() for log in logs.glob("*.log")), logs
    assert json.loads((tmp_path / "first.json").read_text())["shards"]["embedded"] == 2
    # a rerun that fails too counts every shard of the run, the 2 it reused included (was: '2 of 6 shards committed',
    # of the 6 it had to embed, under the summary line's '8 shards (2 embedded, 2 reused)')
    second = index(str(data), "--out", str(out), "--model", str(model), "--ray", "--workers", "1",
                   "--json-report", str(tmp_path / "second.json"),
                   env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "second.jsonl")})
    assert second.exit_code == 75, second.output
    held = len(list((out / "store" / "shards").glob("*/*/entry.json")))
    shards = json.loads((tmp_path / "second.json").read_text())["shards"]
    assert shards == {"total": 8, "embedded": held - 2, "reused": 2}, (shards, held)
    assert f"; {held} of 8 shards committed, {8 - held} not" in second.output.strip().splitlines()[-1], second.output
    local_ray()
    rerun = index(str(data), "--out", str(out), "--model", str(model), "--ray", "--json-report",
                  str(tmp_path / "r.json"), env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "rerun.jsonl")})
    assert rerun.exit_code == 0, rerun.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["shards"] == {"total": 8, "embedded": 8 - held, "reused": held}


def test_ray_gives_the_single_process_index(local_ray, tiny_bert_dir, tmp_path):
    local_ray()
    data = tmp_path / "data"
    ids = write_shards(data, count=4, rows=17)
    big = write_big_shard(data / "big.parquet", rows=63, group_rows=7)  # 9 row groups
    common = [str(data), "--model", str(tiny_bert_dir), "--device", "cpu", "--max-seqs", "8"]
    one = index(*common, "--out", str(tmp_path / "one"))
    assert one.exit_code == 0, one.output
    on_ray = index(*common, "--out", str(tmp_path / "ray"), "--ray", "--workers", "2", "--range-rows", "14",
                   "--json-report", str(tmp_path / "r.json"))
    assert on_ray.exit_code == 0, on_ray.output
    one_rows, one_vectors = contents(tmp_path / "one")
    rows, vectors = contents(tmp_path / "ray")
    assert rows == one_rows and set(r["id"] for r in rows) == set(ids) | (set(big) - {"big-20"})  # row 20: null text
    np.testing.assert_allclose(vectors, one_vectors, rtol=0, atol=1e-5)
    report = json.loads((tmp_path / "r.json").read_text())
    # every shard is cut: the small ones (17 rows in groups of 7) in 2 ranges, the big one in 5
    assert report["shards"]["embedded"] == 5 and report["ranges"]["shards_split"] == 5
    assert sum(w["ranges"] for w in report["workers"]) == len(report["ranges"]["embedded"]) == 4 * 2 + 5
    again = index(*common, "--out", str(tmp_path / "ray"), "--ray")  # everything committed: Ray is not even asked
    assert again.exit_code == 0 and "nothing-to-do" in again.output


def test_killing_an_actor_mid_run_then_rerunning_completes(local_ray, tmp_path):
    local_ray()
    model = make_fake_model_dir(tmp_path / "model")
    data, out, log = tmp_path / "data", tmp_path / "out", tmp_path / "engine.jsonl"
    ids = write_shards(data, count=8, rows=20)
    env = {"PETAL_TEST_FAKE_ENGINE": str(log), "PETAL_FAULT": "after_batch:1+:sleep=0.1"}
    killed: list[int] = []

    done = threading.Event()

    def kill_an_actor() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not done.is_set():  # NOTE: none once the run is over
            embedding = [r["pid"] for r in read_log(log) if "id" in r and r["pid"] != os.getpid()]
            if len(embedding) >= 8:
                os.kill(embedding[-1], signal.SIGKILL)
                killed.append(embedding[-1])
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_an_actor)
    killer.start()
    try:
        first = index(str(data), "--out", str(out), "--model", str(model), "--max-seqs", "4", "--ray", "--workers",
                      "2", env=env)
    finally:
        done.set()
        killer.join()
    assert killed, "no actor was embedding"
    assert first.exit_code in (0, 75), first.output  # Ray retried the shard on a new actor, or the run stopped
    rerun = index(str(data), "--out", str(out), "--model", str(model), "--ray",
                  env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "rerun.jsonl")})
    assert rerun.exit_code == 0, rerun.output
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)  # nothing lost, nothing twice


def test_a_real_clusters_gcs_passes_the_address_check(local_ray):
    """The check that refuses an address where no gRPC server answers (tests/test_ray_connect.py) lets a real head's
    GCS through: it answers petal's HTTP/2 preface with its SETTINGS frame."""
    from petal.pipeline.jobs.ray_embed import _check_reachable

    local_ray()
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    _check_reachable(f"{host}:{port}", host, int(port))  # raises TemporaryFailure when refused


def test_without_ray_a_clear_message(tmp_path, monkeypatch):
    import builtins

    from petal.pipeline.jobs.ray_embed import RAY_MISSING, import_ray
    from petal.pipeline.reliability.errors import ConfigError

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError, match="pip install") as caught:
        import_ray()
    assert caught.value.exit_code == 78 and "petal[ray]" in RAY_MISSING


def test_an_actors_bad_input_keeps_its_exit_code(local_ray, tmp_path):
    """A shard whose row group is corrupt (its footer fine) is 65 naming the shard, as in one process. Before: Ray
    Data wrapped the actor's error in a UserCodeException that lost it on the way (its cause is not pickled), so
    the run ended 75 'the Ray run failed (ray::MapWorker...)' and Airflow retried bad data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    local_ray()
    model = make_fake_model_dir(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    shard = data / "bad.parquet"
    pq.write_table(pa.table({"id": [f"k{i}" for i in range(60)], "text": [f"text {i} " * 3 for i in range(60)]}),
                   shard, row_group_size=20)
    page = pq.ParquetFile(shard).metadata.row_group(1).column(1).data_page_offset
    raw = bytearray(shard.read_bytes())
    raw[page:page + 12] = b"\xab" * 12  # the page header of row group 1's text column
    shard.write_bytes(bytes(raw))
    result = index(str(data), "--out", str(tmp_path / "out"), "--model", str(model), "--ray", "--workers", "1",
                   env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")})
    assert result.exit_code == 65, result.output
    last = result.output.strip().splitlines()[-1]
    assert "bad.parquet" in last and "row group 1" in last and "Ray run failed" not in last, last
    # what the store holds and what cures it, as --workers says (a retry alone does not)
    assert last.endswith("; 0 of 1 shards committed, 1 not: once the input is fixed, a rerun embeds only what is "
                         "missing"), last
    assert "\x1b[" not in last and "Failed to apply UDF" not in last, last
    assert "Traceback" not in result.output and "ERROR" not in result.output, result.output  # Ray Data's own log


def test_an_actor_whose_model_fails_to_load_is_a_configuration_error(local_ray, tiny_bert_dir, tmp_path):
    """Weights cut in half (a copy that did not finish) fail every actor's engine load: exit 78 naming the weights
    file, as in one process and with --workers. Before: Ray's ActorDiedError had lost the actor's exception, so the
    run ended 75 'the Ray run failed (The actor died because of an error raised in its creation task, ...)', which
    Airflow retries (each retry a minute of Ray start and load, for a model that never loads)."""
    local_ray()
    data = tmp_path / "data"
    write_shards(data, count=2, rows=5)
    model = broken_copy(tiny_bert_dir, tmp_path / "model")
    result = index(str(data), "--out", str(tmp_path / "out"), "--model", str(model), "--device", "cpu", "--ray",
                   "--workers", "1")
    assert result.exit_code == 78, result.output
    last = result.output.strip().splitlines()[-1]
    assert "model.safetensors" in last and "Ray run failed" not in last, last


def test_json_on_stdout_is_the_report_alone_when_ray_pushes_errors(local_ray, tiny_bert_dir, tmp_path):
    """--json's stdout is the run report, one JSON document, however the actors fail. Before: Ray's driver printed
    the errors its cluster pushed to it (here 'Task MapWorker(...).get_location failed ... will be retried' with the
    actor's traceback) on stdout too, ahead of the report, so a job that parsed petal's stdout failed on it."""
    local_ray()
    data = tmp_path / "data"
    write_shards(data, count=2, rows=5)
    model = broken_copy(tiny_bert_dir, tmp_path / "model")
    result = index(str(data), "--out", str(tmp_path / "out"), "--model", str(model), "--device", "cpu", "--ray",
                   "--workers", "1", "--json")
    assert result.exit_code == 78, result.output
    report = json.loads(result.stdout)  # the report alone
    assert report["exit_code"] == 78 and "model.safetensors" in report["message"]
    assert "Traceback" not in result.stdout and "(raylet)" not in result.stdout, result.stdout


def test_no_more_actors_start_than_there_are_units(local_ray, tmp_path):
    """--ray --workers 3 over 1 shard starts 1 actor (one engine loaded), not 3 that load theirs for nothing."""
    local_ray()
    model = make_fake_model_dir(tmp_path / "model")
    data, log = tmp_path / "data", tmp_path / "log.jsonl"
    ids = write_shards(data, count=1, rows=10)
    result = index(str(data), "--out", str(tmp_path / "out"), "--model", str(model), "--ray", "--workers", "3",
                   "--json-report", str(tmp_path / "r.json"), env={"PETAL_TEST_FAKE_ENGINE": str(log)})
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["engine"]["actors"] == 1
    assert len({r["pid"] for r in read_log(log) if r.get("load")}) == 1
    rows, _ = contents(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == sorted(ids)


def test_progress_in_a_log_is_petals_plain_lines(local_ray, tmp_path):
    """--ray with stderr not a terminal (cron's 2>>index.log): the progress was Ray Data's (an INFO table of its
    operators every few seconds, its own bars on a terminal), not the bar one process and --workers draw; now it is
    petal's: plain ASCII lines, the last line still the run's summary."""
    local_ray()
    model = make_fake_model_dir(tmp_path / "model")
    write_shards(tmp_path / "data", count=3, rows=5)
    result = fake_invoke(["index", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model),
                          "--ray", "--workers", "2"], env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "\r" not in text and text.isascii(), repr(text)
    lines = text.splitlines()
    assert any(line.startswith("embedding (2 Ray actors): 100%|###") and "| 15/15 [" in line for line in lines), lines
    assert all(line.startswith(("embedding (2 Ray actors):", "petal index: ")) for line in lines), lines
    assert lines[-1].startswith("petal index: success;"), lines


def test_sigterm_leaves_no_actor_embedding(local_ray, tmp_path):
    """SIGTERM while both actors are inside a step (fault engine_step: a 120 s sleep): the run ends 143 with nothing
    published, and the actors are gone at once, their CPUs free. Before, they went on for the rest of their step
    and took new units (the pool was stopped only when Python collected Ray Data's iterator)."""
    local_ray("engine_step:1+:sleep=120")  # NOTE: far longer than the 30 s the CPUs may take to be free
    model = make_fake_model_dir(tmp_path / "model")
    log = tmp_path / "log.jsonl"
    write_shards(tmp_path / "data", count=4, rows=5)
    # (1 s after both actors loaded: both are in their first step's sleep)
    with sigterm_while_running(lambda: len([r for r in read_log(log) if r.get("load")]) >= 2) as sent:
        result = index(str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model), "--ray",
                       "--workers", "2", env={"PETAL_TEST_FAKE_ENGINE": str(log)})
    assert sent.is_set(), f"the two actors never loaded, or the run ended first: {result.output}"
    assert result.exit_code == 143, result.output
    assert not list((tmp_path / "out" / "versions").iterdir()), "published"
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2  # no actor left embedding


def test_sigterm_after_range_commits_lists_them_and_says_interrupted(local_ray, tmp_path):
    """SIGTERM once an actor reported one range and committed a second it has not reported (fault store_committed:
    a 30 s sleep after its second commit): the report lists both ranges as embedded and any actor it lists as
    interrupted (was: "done", and a range committed but not reported missing from ``ranges.embedded``)."""
    local_ray("store_committed:2:sleep=30")
    model = make_fake_model_dir(tmp_path / "model")
    write_big_shard(tmp_path / "data" / "big.parquet", rows=40, group_rows=5)  # 8 row groups: 4 ranges of 10 rows
    out, report = tmp_path / "out", tmp_path / "report.json"

    # (1 s after the second commit: the first range's row has reached the driver)
    with sigterm_while_running(lambda: len(list((out / "store").glob("parts/*/*/*/entry.json"))) >= 2) as sent:
        result = index(str(tmp_path / "data"), "--out", str(out), "--model", str(model), "--ray", "--workers", "1",
                       "--range-rows", "10", "--json-report", str(report),
                       env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")})
    assert sent.is_set(), f"the second range was never committed, or the run ended first: {result.output}"
    assert result.exit_code == 143, result.output
    got = json.loads(report.read_text())
    assert [r["rows"] for r in got["ranges"]["embedded"]] == [[0, 10], [10, 20]], got["ranges"]
    # NOTE: Ray Data may hold the first range's row back while the actor sleeps in the second: then no actor is listed
    assert {w["status"] for w in got["workers"]} <= {"interrupted"}, got["workers"]
