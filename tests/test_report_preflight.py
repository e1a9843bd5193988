"""``--json-report PATH`` that cannot be written (its directory missing, a directory at the path, a directory petal
may not write) was a warning at the end of the run, exit 0: a cron job lost its report without a sign. It is now
judged before any work (73 naming the path, nothing read, nothing published), by ``petal index`` (text and
``--vectors-column``) and ``petal rebuild`` as ``petal embed --output`` is; a write that fails only at the end (the
directory removed during the run) is a non-zero exit that says the version was published. Real processes, real
Parquet and FAISS (the tests' fake engine for text).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests.fake_engine import make_fake_model_dir

DIM = 8


@pytest.fixture
def home(tmp_path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    flat = np.random.default_rng(0).standard_normal((20, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(20), "text": [f"doc {i}" for i in range(20)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), data / "a.parquet")
    make_fake_model_dir(tmp_path / "model")
    return tmp_path


def commands(home: Path, out: Path) -> dict[str, list[str]]:
    data = str(home / "data")
    return {"index": ["index", data, "--out", str(out), "--model", str(home / "model"), "-q"],
            "vectors": ["index", data, "--out", str(out), "-q", "--vectors-column", "emb"],
            "rebuild": ["rebuild", str(out)]}


def unwritable(home: Path) -> dict[str, tuple[Path, str]]:
    (home / "a-directory").mkdir()
    (home / "a-file").write_text("x")
    return {"missing directory": (home / "missing" / "r.json", "is not a directory"),
            "a directory": (home / "a-directory", "it is a directory"),
            "under a file": (home / "a-file" / "r.json", "is not a directory")}


@pytest.mark.parametrize("command", ["index", "vectors", "rebuild"])
def test_a_report_that_cannot_be_written_is_73_before_any_work(home, command):
    out = home / "out"
    if command == "rebuild":
        built = forkrun.petal(commands(home, out)["vectors"])
        assert built.rc == 0, built.stderr
    live = OutputDir(out).current_version() if out.exists() else None
    for path, why in unwritable(home).values():
        log = home / "fake.jsonl"
        result = forkrun.petal([*commands(home, out)[command], f"--json-report={path}"],
                               {"PETAL_TEST_FAKE_ENGINE": str(log)})
        assert result.rc == 73, result.stderr
        assert f"cannot create --json-report {path}" in result.last_line and why in result.last_line, result.stderr
        assert "Traceback" not in result.stderr and not log.exists()  # no model loaded, nothing embedded
        assert (OutputDir(out).current_version() if out.exists() else None) == live  # nothing published
    inside = out / "report.json"  # in the output directory a first run creates: judged with --out, and written
    first = forkrun.petal([*commands(home, out)[command], "--json-report", str(inside)],
                          {"PETAL_TEST_FAKE_ENGINE": str(home / "fake.jsonl")})
    assert first.rc == 0 and first.report is not None and first.report["exit_code"] == 0, first.stderr


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root bypasses file modes")
def test_a_report_in_a_directory_petal_may_not_write_is_73(home):
    import subprocess
    import sys

    from tests.conftest import REPO

    locked = home / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    command = [sys.executable, "-m", "petal.cli.main", *commands(home, home / "out")["vectors"],
               "--json-report", str(locked / "r.json")]
    if os.geteuid() == 0:  # root writes a mode-555 directory: drop the capabilities that allow it
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        locked.chmod(0o755)
    assert done.returncode == 73, done.stderr
    assert f"cannot create --json-report {locked / 'r.json'}" in done.stderr.strip().splitlines()[-1], done.stderr
    assert not (home / "out").exists()


def test_a_report_that_fails_at_the_end_is_non_zero_and_says_what_was_published(home):
    """The directory exists at the start and is gone when the report is written (here: removed while the run waits
    at a fault point): the version is published, the exit is 74 naming the report, and the last line says both."""
    out, reports = home / "out", home / "reports"
    reports.mkdir()
    trace = home / "trace"
    child = forkrun.start([*commands(home, out)["index"], "--json-report", str(reports / "r.json")],
                          {"PETAL_TEST_FAKE_ENGINE": str(home / "fake.jsonl"), "PETAL_FAULT": "after_lock:1:sleep=2",
                           "PETAL_FAULT_TRACE": str(trace)})
    deadline = time.monotonic() + 60
    while not (trace.exists() and "after_lock" in trace.read_text()):
        assert time.monotonic() < deadline and child.alive(), child.stderr_so_far()
        time.sleep(0.02)
    shutil.rmtree(reports)
    result = child.wait()
    version = OutputDir(out).current_version()
    assert version is not None  # published
    assert result.rc == 74, result.stderr
    assert f"--json-report {reports / 'r.json'}" in result.last_line, result.stderr
    assert f"version {version} is published and live" in result.last_line, result.stderr
    assert "Traceback" not in result.stderr


def test_rebuild_of_what_is_not_an_index_says_it_as_query_info_and_verify_do(home):
    """``petal rebuild FILE`` said 'cannot read FILE/CURRENT: Not a directory', and a missing or empty directory
    'has no published index to rebuild', where ``petal query``, ``info`` and ``verify`` say 'is not a petal index':
    one wording and one exit code (78) now, a FIFO included (never opened)."""
    empty = home / "empty"
    empty.mkdir()
    fifo = home / "fifo"
    os.mkfifo(fifo)
    for target in (home / "data" / "a.parquet", home / "missing", empty, fifo):
        said = {}
        for argv in (["rebuild", str(target)], ["query", str(target), "x"], ["info", str(target)],
                     ["verify", str(target)]):
            result = forkrun.petal(argv, timeout=60)
            assert result.rc == 78, (argv, result.stderr)
            said[argv[0]] = result.stderr.strip().splitlines()[-1]
        assert f"{target} is not a petal index" in said["query"]
        assert said["rebuild"] == said["query"] == said["info"] == said["verify"], said


@pytest.mark.parametrize("command", ["index", "vectors"])
def test_a_report_path_that_is_an_input_of_the_run_is_2_and_the_input_is_untouched(home, command):
    """``petal index --json-report data/*.parquet --out OUT`` (the shell expands the glob: the first shard is the
    report's path) wrote the report over that shard, exit 0: its rows were gone and the next run refused it (65).
    A SOURCE shard, the same file by a symbolic link or a hard link, a shard the live version keeps, the --delete
    file: refused before any work (2), the file as it was, and the failed run's report is not written there either."""
    data, out = home / "data", home / "out"
    argv = commands(home, out)[command]
    env = {"PETAL_TEST_FAKE_ENGINE": str(home / "fake.jsonl")}
    built = forkrun.petal(argv, env)
    assert built.rc == 0, built.stderr
    shard = data / "a.parquet"
    (home / "link.parquet").symlink_to(shard)
    os.link(shard, home / "hard.parquet")
    other = home / "other"
    other.mkdir()
    shutil.copy(shard, other / "b.parquet")
    deletes = home / "delete.parquet"
    pq.write_table(pa.table({"id": [3]}), deletes)
    named = [str(other / "b.parquet") if a == str(data) else a for a in argv]  # a.parquet kept (additive)
    cases = [(argv, shard), (argv, home / "link.parquet"), (argv, home / "hard.parquet"), (named, shard),
             ([*argv, "--delete", str(deletes)], deletes)]
    for run_argv, path in cases:
        before = Path(path).read_bytes()
        result = forkrun.petal([*run_argv, f"--json-report={path}"], env)
        assert result.rc == 2, (path, result.stderr)
        assert f"--json-report {path} is an input of this run" in result.stderr, result.stderr
        assert Path(path).read_bytes() == before
    again = forkrun.petal(argv, env)
    assert again.rc == 0 and "nothing-to-do" in again.last_line, again.stderr


def test_a_report_is_never_written_over_a_file_that_is_not_one(home):
    """A usage error found while the flags are parsed writes its report before any SOURCE is known: ``petal index
    DATA --out OUT --bogus --json-report DATA/a.parquet`` replaced the shard with the report. The writer now replaces
    only a report (a file starting with ``{``, or empty); a run names any other file before any work."""
    shard = home / "data" / "a.parquet"
    before = shard.read_bytes()
    out = str(home / "out")
    for argv in (["index", str(home / "data"), "--out", out, "--bogus"],
                 ["index", str(home / "data"), "--out", out, "--max-bad-rows", "xyz"],
                 ["rebuild", out, "--bogus"]):
        result = forkrun.petal([*argv, f"--json-report={shard}"])
        assert result.rc == 2, result.stderr
        assert f"--json-report {shard} holds Parquet data, not a petal report" in result.stderr, result.stderr
        assert shard.read_bytes() == before
    other = home / "elsewhere.parquet"
    shutil.copy(shard, other)  # a file no flag of the run names
    result = forkrun.petal([*commands(home, home / "out")["vectors"], f"--json-report={other}"])
    assert result.rc == 2 and "holds Parquet data" in result.last_line, result.stderr
    assert other.read_bytes() == before and not (home / "out").exists()
    earlier = home / "r.json"
    earlier.write_text('{"an": "earlier report"}')
    result = forkrun.petal([*commands(home, home / "out")["vectors"], f"--json-report={earlier}"])
    assert result.rc == 0 and '"status": "success"' in earlier.read_text(), result.stderr  # an earlier report: replaced
