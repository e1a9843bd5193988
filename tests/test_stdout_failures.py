"""stdout that fails where no command's own output code ran: ``petal --help``, ``--version`` and a command's help,
and the run report of ``petal index``/``petal rebuild`` with ``--json`` or ``--json-report -``. Through the real
``petal`` entry point in a fresh interpreter, stdout on ``/dev/full`` (a full disk under ``> FILE``) or a pipe whose
reader has gone (``| head -0``).

Before: help and version on a full stdout were a traceback and exit 1, on a closed pipe exit 1 (click's); a run's
``--json`` report that stdout refused was a warning and exit 0 (a cron job redirecting it to a file on a full disk
kept an empty file and a success), and ``--json-report -`` into a closed pipe was 74 "Broken pipe". Now a full
stdout is 74 naming stdout, a closed pipe 141 and nothing said, as for every command's own output."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.index_data import vector_shard

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


def _env() -> dict[str, str]:
    # NOTE: PYTHONPATH: this checkout's petal, whatever the working directory (a run's is its temporary one)
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}, "PYTHONPATH": str(REPO)}


def full_stdout(args: list[str], cwd: Path = REPO) -> tuple[int, str]:
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-m", "petal.cli.main", *args], stdout=full, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, cwd=cwd, env=_env(), timeout=300)
    return done.returncode, done.stderr.decode()


def closed_stdout(args: list[str], cwd: Path = REPO) -> tuple[int, str]:
    child = subprocess.Popen([sys.executable, "-m", "petal.cli.main", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=cwd, env=_env())
    assert child.stdout is not None
    child.stdout.close()  # the reader is gone before the first byte is written
    _, err = child.communicate(timeout=300)
    return child.returncode, err.decode()


HELP = [["--help"], ["--version"], ["query", "--help"], ["index", "-h"], ["bench", "startup", "--help"]]


@pytest.mark.parametrize("args", HELP, ids=" ".join)
def test_help_and_version_on_a_full_stdout_are_74_naming_stdout(args):
    code, err = full_stdout(args)
    assert code == 74, err
    assert err.strip().splitlines()[-1] == "petal: error: cannot write the output to stdout: No space left on device"
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("args", HELP, ids=" ".join)
def test_help_and_version_into_a_closed_pipe_end_quietly_with_141(args):
    code, err = closed_stdout(args)
    assert (code, err) == (141, "")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stdout-failures")
    (root / "data").mkdir()
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(vector_shard(root / "data", 0)),
                           "--out", "out", "--vectors-column", "emb", "-q"], capture_output=True, text=True,
                          cwd=root, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    return root


def _current(root: Path) -> str:
    return (root / "out" / "CURRENT").read_text().strip()


@pytest.mark.parametrize("command", ["rebuild", "index"])
@pytest.mark.parametrize("flag", [["--json"], ["--json-report", "-"]], ids=" ".join)
def test_a_run_report_a_full_stdout_refuses_is_74_naming_stdout_and_the_published_version(built, command, flag):
    args = ["rebuild", "out"] if command == "rebuild" else \
        ["index", "data", "--out", "out", "--vectors-column", "emb", "--full", "-q"]
    before = _current(built)
    code, err = full_stdout([*args, *flag], built)
    assert code == 74, err
    after = _current(built)
    assert after != before  # the run did its work: only its report is lost, and the error says so
    last = err.strip().splitlines()[-1]
    assert last.startswith("petal: error: cannot write the report to stdout: No space left on device"), err
    assert f"version {after} is published and live, only the report is missing" in last, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("command", ["rebuild", "index"])
def test_the_report_file_says_the_code_of_the_stdout_that_refused_the_report(built, command, tmp_path):
    """``--json`` with ``--json-report FILE``: the run wrote FILE (success, exit 0), then stdout refused the report and
    the command exits 74; FILE says so too (it said exit 0 while the process exited 74)."""
    import json

    report = tmp_path / "report.json"
    args = ["rebuild", "out"] if command == "rebuild" else \
        ["index", "data", "--out", "out", "--vectors-column", "emb", "--full", "-q"]
    code, err = full_stdout([*args, "--json", "--json-report", str(report)], built)
    assert code == 74, err
    said = json.loads(report.read_text())
    assert said["exit_code"] == 74 and "cannot write the report to stdout" in said["message"], said


@pytest.mark.parametrize("flag", [["--json"], ["--json-report", "-"]], ids=" ".join)
def test_a_run_report_into_a_closed_pipe_ends_quietly_with_141(built, flag):
    code, err = closed_stdout(["rebuild", "out", *flag], built)
    assert code == 141, err
    assert err.strip().splitlines()[-1].startswith("petal rebuild: success;"), err  # what happened, and nothing else
    assert "warning" not in err and "error" not in err and "Traceback" not in err, err


def test_a_failed_run_keeps_its_code_when_stdout_refuses_its_report(tmp_path):
    code, err = full_stdout(["rebuild", str(tmp_path / "none"), "--json"])
    assert code == 78, err
    assert "cannot write the report to stdout" in err and "is not a petal index" in err.strip().splitlines()[-1]


def _blocked_writing(child: subprocess.Popen[bytes], read_end: int) -> bool:
    """The child's main thread waits in a write to the pipe: the pipe took all it can.

    NOTE: not "the pipe holds 64 KiB": Linux puts a write that does not fit the rest of the pipe's last page in a
    new page, so the 16 pages of a pipe whose lines are 2-4 KiB long fill with ~3.4 KiB each (~54 KB in all) and
    the writer waits with far less than 64 KiB in the pipe (a wait on 60 000 bytes spun for ever, and CI with it).
    The kernel says where the thread sleeps; where it does not (no /proc), the pipe's byte count that stops
    growing for a second while the child lives does."""
    import fcntl
    import struct
    import termios

    def held() -> int:
        return struct.unpack("i", fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"))[0]

    try:
        where = Path(f"/proc/{child.pid}/wchan").read_text()
    except OSError:
        where = ""
    if where not in ("", "0"):  # NOTE: "0" where the kernel hides its symbols
        return "pipe_write" in where and held() > 0
    before = held()
    time.sleep(1.0)
    return 0 < before == held()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_while_stdout_s_reader_does_not_read_ends_the_command(tmp_path, tiny_bert_dir, sig):
    """``petal embed --stdin`` writing into a pipe whose reader has stopped reading (a stalled consumer, a scheduler's
    stop of the whole pipeline): the signal ends it with its code at once. Was: 'interrupted' said, then the
    interpreter's last flush of the line being written waited for the reader, past the signal, as long as it did not
    read; once the reader went away, 'Exception ignored ... BrokenPipeError' and exit 120."""
    (tmp_path / "in.txt").write_text("".join(f"text number {i}\n" for i in range(2_000)))
    read_end, write_end = os.pipe()
    with open(tmp_path / "in.txt", "rb") as stdin:
        child = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "embed", "--stdin", "--model",
                                  str(tiny_bert_dir)], stdin=stdin, stdout=write_end, stderr=subprocess.PIPE,
                                 cwd=REPO, env=_env())
    os.close(write_end)
    try:
        deadline = time.monotonic() + 120
        while not _blocked_writing(child, read_end):  # nobody reads: the pipe fills, then petal blocks writing
            assert child.poll() is None, child.communicate(timeout=60)[1].decode()[-2000:]
            assert time.monotonic() < deadline, "petal never blocked writing into the pipe"
            select.select([], [], [], 0.05)
        child.send_signal(sig)
        try:
            _, err = child.communicate(timeout=120)  # the reader still does not read
        except subprocess.TimeoutExpired:
            child.kill()
            raise AssertionError(f"still running after {sig.name}, blocked on stdout") from None
    finally:
        os.close(read_end)
    assert child.returncode == 128 + sig, err.decode()[-2000:]
    assert err.decode().strip().splitlines()[-1] == f"petal: interrupted by {sig.name}"
    assert b"Traceback" not in err and b"Exception ignored" not in err
