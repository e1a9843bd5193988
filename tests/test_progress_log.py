"""``petal index``'s progress when stderr is a log (cron's ``2>>index.log``, Airflow's captured stderr) and when it
is a terminal. Real processes, real Parquet, the tests' fake engine."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.fake_engine import make_fake_model_dir
from tests.test_reliability import write_shards

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def run_index(tmp_path: Path, fake_model: Path, stderr: int, *more: str) -> int:
    write_shards(tmp_path / "data")  # a, b, c: 12 rows each
    # NOTE: PYTHONPATH: spawned workers import tests.fake_engine (the pickled engine factory)
    return subprocess.run([sys.executable, "-m", "tests.fake_cli", "index", str(tmp_path / "data"), "--out",
                           str(tmp_path / "out"), "--model", str(fake_model), *more], cwd=ROOT, stderr=stderr,
                          stdout=subprocess.DEVNULL, timeout=120,
                          env={**os.environ, "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log"),
                               "PYTHONPATH": str(ROOT)}).returncode


def test_progress_in_a_log_is_plain_lines(tmp_path, fake_model):
    """stderr a file: the bar was carriage returns and redraws every 0.5 s in block characters, one line that
    grew with the run (a 6-hour run: megabytes in one line of the log); now each shown state is a line of its own,
    in ASCII, and the last line is still the run's summary."""
    log = tmp_path / "index.log"
    with open(log, "w") as stream:
        assert run_index(tmp_path, fake_model, stream.fileno()) == 0
    text = log.read_text()
    assert "\r" not in text and text.isascii() and text.endswith("\n"), repr(text)
    lines = text.splitlines()
    assert any(line.startswith("embedding: 100%|###") and "| 36/36 [" in line for line in lines), lines
    assert all(line.startswith(("embedding:", "petal index: ")) for line in lines), lines
    assert lines[-1].startswith("petal index: success;"), lines


def test_progress_of_worker_processes_in_a_log_is_plain_lines(tmp_path, fake_model):
    """--workers: the coordinator's bar was tqdm's carriage-return redraws in a log too."""
    log = tmp_path / "index.log"
    with open(log, "w") as stream:
        assert run_index(tmp_path, fake_model, stream.fileno(), "--workers", "2") == 0
    text = log.read_text()
    assert "\r" not in text and text.isascii(), repr(text)
    lines = text.splitlines()
    assert any(line.startswith("embedding (2 workers): 100%|###") and "| 36/36 [" in line for line in lines), lines
    assert lines[-1].startswith("petal index: success;"), lines


def test_progress_on_a_terminal_is_a_live_bar(tmp_path, fake_model):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # NOTE: else 0 columns wide
    try:
        assert run_index(tmp_path, fake_model, follower) == 0
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    text = b"".join(chunks).decode()
    assert "\rembedding: 100%|" in text and "36/36" in text, repr(text)


def test_index_json_on_stdout_is_one_object_a_line_matching_the_report_and_the_summary(tmp_path, fake_model):
    """``petal index --json`` (and ``--json-report -``) printed the report indented over ~80 lines, where the README
    promises machine output one object a line: a line reader failed, and Airflow's BashOperator, which pushes the
    last line of stdout to XCom, pushed ``}``. Now each is one line, equal to the ``--json-report`` file (indented
    there), and the stderr summary says the same numbers; a usage error with --json too."""
    write_shards(tmp_path / "data")
    argv = [sys.executable, "-m", "tests.fake_cli", "index", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
            "--model", str(tmp_path / "model"), "-q", "--json-report", str(tmp_path / "r.json")]
    env = {**os.environ, "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log")}
    shutil.copytree(fake_model, tmp_path / "model")
    for extra in (["--json"], ["--json", "--json-report", "-"], ["--json", "--max-bad-rows", "lots"]):
        done = subprocess.run([*argv, *extra], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        lines = done.stdout.splitlines()
        assert len(lines) == (2 if "-" in extra else 1) and done.stdout.endswith("\n"), done.stdout[:300]
        report = json.loads(lines[-1])
        assert all(json.loads(line) == report for line in lines), lines
        assert report["exit_code"] == done.returncode == (2 if "lots" in extra else 0), done.stderr
        if "lots" in extra:
            continue
        assert report == json.loads((tmp_path / "r.json").read_text()) or "-" in extra
        summary = done.stderr.strip().splitlines()[-1]
        assert summary.startswith(f"petal index: {report['status']}; {report['shards']['total']} shards"), summary
        assert f"{report['rows']['embedded']} rows embedded" in summary and isinstance(report["seconds"], float)
        assert report["status"] == "nothing-to-do" or f"version {report['version']}" in summary, summary


SCRIPT = """
import sys, threading
import pyarrow as pa, pyarrow.parquet as pq
import petal

data, out = sys.argv[1], sys.argv[2]
pq.write_table(pa.table({"id": list(range(8)), "text": [f"glacier {i} moves" for i in range(8)]}), data + "/a.parquet")
for n, quiet in enumerate((True, False)):
    petal.index(data, out + str(n), quiet=quiet, device="cpu")
print(sorted(t.name for t in threading.enumerate()))
"""


def test_a_python_callers_run_leaves_no_thread_behind(tmp_path):
    """tqdm started its ``tqdm_monitor`` thread with petal's bar (a disabled one too) and it outlived the run."""
    (tmp_path / "data").mkdir()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "data"), str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "['MainThread']", proc.stdout
