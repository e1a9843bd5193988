"""A usage error found while click parses the flags still writes the ``--json-report`` (status failed, exit 2,
``usage error: ...``), in ``petal index`` and ``petal rebuild`` alike, at the path click itself would have taken
(the last ``--json-report`` wins; nothing after ``--`` is a flag); with ``--json`` the report is on stdout too.
Before: ``petal rebuild`` wrote no report at all on such an error, and ``petal index`` wrote it to the first
``--json-report`` given and to a ``--json-report`` word after ``--`` (a SOURCE named that way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PETAL = str(Path(sys.executable).parent / "petal")


def petal(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PETAL, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)


def report_of(path: Path) -> dict:
    return json.loads(path.read_text())


# (arguments before the report flag; what the message says) per command: an unknown flag, a missing argument or
# option, a bad choice, a number out of range
CASES = {
    "index": [(["src", "--out", "o", "--bogus"], "No such option"),
              (["--out", "o"], "Missing argument"),
              (["src"], "Missing option '--out'"),
              (["src", "--out", "o", "--metric", "cosine"], "cosine"),
              (["src", "--out", "o", "--target-recall", "2"], "--target-recall")],
    "rebuild": [(["o", "--bogus"], "No such option"),
                ([], "Missing argument"),
                (["o", "--metric", "cosine"], "cosine"),
                (["o", "--target-recall", "0"], "--target-recall")],
}


@pytest.mark.parametrize("command", ["index", "rebuild"])
def test_a_parse_error_writes_the_report(command, tmp_path):
    for args, said in CASES[command]:
        report = tmp_path / "r.json"
        report.unlink(missing_ok=True)
        done = petal(command, *args, "--json-report", report, cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        written = report_of(report)
        assert written["command"] == command and written["status"] == "failed" and written["exit_code"] == 2
        assert written["message"].startswith("usage error: ") and said in written["message"], written


@pytest.mark.parametrize("command", ["index", "rebuild"])
def test_the_report_goes_where_click_reads_the_flag(command, tmp_path):
    first, last = tmp_path / "first.json", tmp_path / "last.json"
    head = ["src", "--out", "o"] if command == "index" else ["o"]
    done = petal(command, *head, "--json-report", first, "--bogus", f"--json-report={last}", cwd=tmp_path)
    assert done.returncode == 2 and not first.exists() and report_of(last)["exit_code"] == 2
    # a flag that lacks its value: the arguments cannot be split; the words still say where the report goes
    done = petal(command, *head, "--json-report", first, "--metric", cwd=tmp_path)
    assert done.returncode == 2 and "requires an argument" in done.stderr and report_of(first)["exit_code"] == 2
    # --json: the report on stdout (one JSON object), with or without a report file
    done = petal(command, *head, "--bogus", "--json", cwd=tmp_path)
    assert done.returncode == 2 and json.loads(done.stdout)["message"].startswith("usage error: ")


def test_a_word_after_double_dash_is_a_source_not_the_report_path(tmp_path):
    """``petal index -- --json-report x`` names two SOURCES; without --out it is a usage error, and ``x`` (a source,
    maybe a shard) is not overwritten with a report."""
    shard = tmp_path / "x"
    shard.write_bytes(b"PAR1 a shard")
    done = petal("index", "--", "--json-report", shard, cwd=tmp_path)
    assert done.returncode == 2 and "Missing option '--out'" in done.stderr
    assert shard.read_bytes() == b"PAR1 a shard"


def test_an_unwritable_report_path_is_a_warning_and_the_exit_stays_2(tmp_path):
    done = petal("rebuild", "o", "--bogus", "--json-report", tmp_path / "missing" / "r.json", cwd=tmp_path)
    assert done.returncode == 2 and "warning: cannot write the report" in done.stderr
    assert "Traceback" not in done.stderr
