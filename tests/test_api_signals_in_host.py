"""``petal.index()``/``petal.rebuild()`` run inside someone else's Python process (a script, a REPL, a notebook
kernel, a worker framework) handled signals as the ``petal index`` command does, which is wrong there:

- a second SIGINT killed the caller's whole process (the command's "a second signal kills at once"): no exception,
  the caller's ``finally`` never ran. It now goes to the caller's own handler (Python's: ``KeyboardInterrupt`` in the
  caller), and the run it ends is still reported as interrupted (130), lock released, committed shards kept;
- SIGHUP/SIGUSR1/SIGUSR2 stopped the run (138, ...) and the host's own handlers never ran: the API now takes SIGINT
  and SIGTERM only, and puts back exactly what the caller had installed (a second SIGTERM reaches its handler);
- a SIGINT during the first call's heavy import (index_run, vector_run, rebuild: ~1-2 s) was a bare
  ``KeyboardInterrupt`` with no report: the call now takes its signals before that import;
- a ``KeyboardInterrupt`` raised inside the run was reported as 'failed', exit 1, 'internal error'.

Real processes, real signals (sent to itself from the fake engine's step or from an import hook, so each lands at a
known point), real Parquet and FAISS.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.test_reliability import lock_is_free

RUN = r"""
import json, os, signal, sys, threading, time
from pathlib import Path
import petal
from tests.fake_engine import FakeEngine, make_fake_model_dir

root = Path(sys.argv[1])
src, model = root / "src", make_fake_model_dir(root / "model")
ACTIONS = {}  # engine step number -> what it does first


def send(*sigs):
    def act():
        for sig in sigs:
            os.kill(os.getpid(), sig)
            time.sleep(0.05)  # NOTE: the handler runs (petal's, then the caller's) before the next is sent
    return act


def raise_interrupt():
    raise KeyboardInterrupt


class Engine(FakeEngine):
    def step(self, batch):
        ACTIONS.pop(self.stats.steps + 1, lambda: None)()
        return super().step(batch)


def text_run(out, report):
    return petal.index(str(src), str(out), model=str(model), quiet=True, token_budget=256, json_report=str(report),
                       engine_factory=lambda spec, config: Engine(spec, config))


def vector_run(out, report):
    return petal.index(str(src), str(out), vectors_column="vec", quiet=True, json_report=str(report))


def outcome(call, report):
    try:
        said = {"returned": call().status}
    except BaseException as exc:
        said = {"raised": type(exc).__name__, "exit_code": getattr(exc, "exit_code", None),
                "carries_report": getattr(getattr(exc, "report", None), "status", None)}
    if report.exists():
        written = json.loads(report.read_text())
        said["report"] = [written["status"], written["exit_code"]]
        said["shards"] = written["shards"]
        report.unlink()
    return said


class SignalOnImport:
    # a SIGINT at the moment the run's heavy module starts to load (the first call in a fresh interpreter)
    def __init__(self, name):
        self.name = name

    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None


def handlers():
    return {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                                         signal.SIGUSR1, signal.SIGUSR2)}


def early():
    # NOTE: in this order: vector_run imports index_run, so the text run's must come first
    text, vectors, report = root / "text", root / "vectors", root / "r.json"
    sys.meta_path.insert(0, SignalOnImport("petal.pipeline.jobs.index_run"))
    yield "text", outcome(lambda: text_run(text, report), report)
    yield "text_rerun", outcome(lambda: text_run(text, report), report)
    sys.meta_path.insert(0, SignalOnImport("petal.pipeline.jobs.vector_run"))
    yield "vectors", outcome(lambda: vector_run(vectors, report), report)
    yield "vectors_rerun", outcome(lambda: vector_run(vectors, report), report)
    sys.meta_path.insert(0, SignalOnImport("petal.pipeline.jobs.rebuild"))
    yield "rebuild", outcome(lambda: petal.rebuild(str(vectors), index_factory="HNSW8", quiet=True,
                                                   json_report=str(report)), report)


def in_run():
    report = root / "r.json"
    before = handlers()
    ACTIONS[2] = raise_interrupt
    yield "raw_interrupt", outcome(lambda: text_run(root / "b", report), report)

    box = {}
    worker = threading.Thread(target=lambda: box.update(outcome(lambda: text_run(root / "c", report), report)))
    worker.start()
    worker.join()
    yield "thread", box
    yield "thread_handlers_kept", handlers() == before

    calls = []
    host = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)}
    for sig in host:
        signal.signal(sig, lambda signum, frame: calls.append(signal.Signals(signum).name))
    with_host = handlers()
    ACTIONS[1] = send(signal.SIGUSR1, signal.SIGHUP, signal.SIGUSR2)  # the host's: the run goes on
    ACTIONS[3] = send(signal.SIGTERM, signal.SIGTERM)  # the first stops the run, the second is the host's
    yield "host", outcome(lambda: text_run(root / "d", report), report)
    yield "host_calls", calls
    yield "host_handlers_kept", handlers() == with_host
    for sig, handler in host.items():
        signal.signal(sig, handler)

    # NOTE: last: it used to kill this process
    ACTIONS[2] = send(signal.SIGINT, signal.SIGINT)
    yield "second_sigint", outcome(lambda: text_run(root / "a", report), report)
    yield "second_sigint_handlers_kept", handlers() == before
    yield "second_sigint_rerun", outcome(lambda: text_run(root / "a", report), report)


said = {}
for key, value in {"early": early, "in_run": in_run}[sys.argv[2]]():
    said[key] = value
    print(json.dumps(said), flush=True)  # NOTE: each step's as it comes: a process killed midway says how far it got
"""


def run(root: Path, scenarios: str) -> Said:
    vectors = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    (root / "src").mkdir()
    for shard in range(4):  # one engine step a shard (token_budget 256)
        pq.write_table(pa.table({"id": [f"s{shard}-{i}" for i in range(40)],
                                 "text": [f"doc {shard} n {i}" for i in range(40)], "vec": list(vectors)}),
                       root / "src" / f"{shard}.parquet")
    done = subprocess.run([sys.executable, "-c", RUN, str(root), scenarios], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300,
                          stdin=subprocess.DEVNULL)
    said = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    ended = f"{done.returncode} ({signal.Signals(-done.returncode).name})" if done.returncode < 0 else done.returncode
    return Said(said, f"the process ended {ended} after {list(said)}: {done.stderr[-3000:]}")


class Said(dict):
    """What the script printed, step by step; a step it never got to fails the test that asks for it, saying how
    the process ended."""

    def __init__(self, said: dict, ending: str) -> None:
        super().__init__(said)
        self.ending = ending

    def __missing__(self, key: str) -> None:
        raise AssertionError(f"no {key!r}: {self.ending}")


@pytest.fixture(scope="module")
def in_run(tmp_path_factory) -> tuple[Path, Said]:
    root = tmp_path_factory.mktemp("in_run")
    return root, run(root, "in_run")


@pytest.fixture(scope="module")
def early(tmp_path_factory) -> tuple[Path, Said]:
    root = tmp_path_factory.mktemp("early")
    return root, run(root, "early")


def interrupted(code: int) -> dict:
    return {"raised": "Interrupted", "exit_code": code, "carries_report": "interrupted",
            "report": ["interrupted", code]}


def test_a_second_sigint_is_the_callers_keyboard_interrupt_and_the_run_is_reported_interrupted(in_run):
    root, said = in_run
    stopped = said["second_sigint"]
    assert {k: v for k, v in stopped.items() if k != "shards"} == {
        "raised": "KeyboardInterrupt", "exit_code": None, "carries_report": "interrupted",
        "report": ["interrupted", 130]}
    assert said["second_sigint_handlers_kept"]
    assert lock_is_free(root / "a")
    rerun = said["second_sigint_rerun"]  # resumable: what was committed before the stop is reused
    assert rerun["returned"] == "success"
    assert rerun["shards"]["reused"] == stopped["shards"]["embedded"] and rerun["shards"]["total"] == 4


def test_a_keyboard_interrupt_inside_the_run_is_an_interruption_not_a_bug(in_run):
    root, said = in_run
    assert {k: v for k, v in said["raw_interrupt"].items() if k != "shards"} == {
        "raised": "KeyboardInterrupt", "exit_code": None, "carries_report": "interrupted",
        "report": ["interrupted", 130]}
    assert lock_is_free(root / "b")


def test_the_hosts_handlers_run_and_are_put_back(in_run):
    root, said = in_run
    # SIGUSR1/SIGHUP/SIGUSR2 are the host's alone; the first SIGTERM stops the run, the second reaches the host
    assert said["host_calls"] == ["SIGUSR1", "SIGHUP", "SIGUSR2", "SIGTERM"]
    assert {k: v for k, v in said["host"].items() if k != "shards"} == interrupted(143)
    assert said["host_handlers_kept"]
    assert lock_is_free(root / "d")


def test_a_call_from_another_thread_runs_and_leaves_the_handlers_alone(in_run):
    _, said = in_run  # NOTE: signal.signal() outside the main thread is a ValueError
    assert (said["thread"]["returned"], said["thread"]["report"]) == ("success", ["success", 0])
    assert said["thread_handlers_kept"]


def test_a_sigint_during_the_first_calls_import_is_a_clean_stop_with_its_report(early):
    root, said = early
    for run_ in ("text", "vectors", "rebuild"):
        assert {k: v for k, v in said[run_].items() if k != "shards"} == interrupted(130), run_
    assert said["text_rerun"]["returned"] == said["vectors_rerun"]["returned"] == "success"
    assert lock_is_free(root / "text") and lock_is_free(root / "vectors")
