"""``petal index`` started with stdout or stderr closed (``>&-``, ``2>&-``: a cron line, a supervisor that gives no
fd 1 or 2), through the real ``petal`` entry point in a fresh interpreter, with the packaged model.

Before: with fd 1 closed, the run embedded its shards and then failed with an ``AttributeError`` traceback (exit 1,
nothing published: FAISS's write flushed ``sys.stdout``, which is None then; ``--json`` failed the same way); and
with fd 2 closed, every stderr line (the summary) went to stdout, into the JSON a reader parses. Now the closed
descriptors are ``/dev/null`` from the first line: the run publishes, exits 0, and stdout holds only the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]


def petal(args: list[str], close: tuple[int, ...]) -> subprocess.CompletedProcess:
    def closing() -> None:
        for fd in close:
            os.close(fd)

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PETAL_TEST_FAKE_ENGINE", None)
    return subprocess.run([sys.executable, "-c", "from petal.cli.main import main; main()", *args], env=env,
                          cwd=REPO, capture_output=1 not in close and 2 not in close, text=True,
                          stdout=subprocess.PIPE if 1 not in close and 2 in close else None,
                          preexec_fn=closing, timeout=300)


def test_a_run_with_stdout_or_stderr_closed_publishes_and_exits_0(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "bread rises"]}), tmp_path / "a.parquet")
    report = tmp_path / "report.json"
    done = petal(["index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "-q", "--json",
                  "--json-report", str(report)], close=(1,))
    assert done.returncode == 0
    assert json.loads(report.read_text())["status"] == "success" and (tmp_path / "out" / "CURRENT").is_file()
    pq.write_table(pa.table({"id": [3], "text": ["tides turn"]}), tmp_path / "b.parquet")
    done = petal(["index", str(tmp_path / "b.parquet"), "--out", str(tmp_path / "out"), "-q", "--json"], close=(2,))
    assert done.returncode == 0
    printed = json.loads(done.stdout)  # the JSON report alone: no stderr line in it
    assert printed["status"] == "success" and printed["index"]["num_vectors"] == 3
    done = petal(["index", str(tmp_path / "b.parquet"), "--out", str(tmp_path / "out"), "-q"], close=(1, 2))
    assert done.returncode == 0


def test_the_api_report_to_a_closed_stdout_is_an_os_error_the_run_warns_about(monkeypatch):
    # petal.index(json_report="-") in a process without stdout (pythonw, a daemon): no AttributeError (exit 1)
    import errno

    import pytest

    from petal.pipeline.jobs.report_file import write_report_to

    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(OSError) as caught:
        write_report_to("-", {"status": "success"})
    assert caught.value.errno == errno.EBADF and "stdout is closed" in str(caught.value)


def test_query_and_embed_with_stdout_closed_are_74_not_answers_lost_with_exit_0(tmp_path):
    """Their results go to stdout only: with fd 1 closed at start they went to /dev/null and the command exited 0
    (the embed summary on stderr even counted the vectors). Now 74 naming stdout, before anything loads; ``petal
    embed --output FILE`` needs no stdout and runs."""
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "bread rises"]}), tmp_path / "a.parquet")
    done = petal(["index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "out"), "-q"], close=())
    assert done.returncode == 0, done.stderr
    err = tmp_path / "err.txt"
    for args in (["query", str(tmp_path / "out"), "glaciers", "-k", "1"], ["embed", "glaciers"],
                 ["embed", "--stdin"]):
        with err.open("w") as stderr:
            code = subprocess.run([sys.executable, "-c", "from petal.cli.main import main; main()", *args],
                                  cwd=REPO, stderr=stderr, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(1),
                                  timeout=300).returncode
        said = err.read_text()
        assert code == 74 and "stdout is closed" in said and "Traceback" not in said, (args, code, said)
    done = petal(["embed", "glaciers", "--output", str(tmp_path / "v.npy")], close=(1,))
    assert done.returncode == 0 and (tmp_path / "v.npy").is_file()
