"""``petal query --stdin`` and ``petal embed --stdin`` on a stdin opened O_NONBLOCK (a terminal that a program such as
node left non-blocking, a parent's pipe): Python's buffered reader returns ``b""`` when no byte is there yet, and
reading by lines took that for the end of the input, so both exited 66 'nothing to query/embed: --stdin is empty' at
once while the writer was still on its way. The lines are now waited for, and each --stdin query is answered as it
arrives. Real processes, real tiny BERT, real FAISS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.pipes import Pipes
from tests.test_stdout_full import small_index  # noqa: F401 (the fixture: 4 documents, tiny BERT)


def started(args: list[str]) -> tuple[subprocess.Popen, int]:
    """``petal ARGS`` with a non-blocking pipe for stdin, and the pipe's write end."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}
    proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", *args], stdin=read_end, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO, env=env)
    os.close(read_end)
    return proc, write_end


def still_waiting(proc: subprocess.Popen) -> None:
    """No line has come yet: petal is still running (was: 66 'stdin is empty' once the model had loaded)."""
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def test_query_stdin_waits_for_lines_and_answers_each_as_it_comes(request):
    proc, write_end = started(["query", str(request.getfixturevalue("small_index")), "--stdin", "--json", "-k", "2"])
    with Pipes(proc) as pipes:
        try:
            still_waiting(proc)
            for query in ("document 1", "document 3"):
                os.write(write_end, query.encode() + b"\r\n")
                assert json.loads(pipes.line(f"the answer to {query!r} before EOF"))["query"] == query
            os.write(write_end, b"\ndocu")
            os.write(write_end, b"ment 2")  # the last line without its line end, in two writes
        finally:
            os.close(write_end)
        code, out, err = pipes.finish()
    assert code == 0, err.decode()[-2000:]
    # the blank line, answered as skipped once a query was, then the last line
    assert [json.loads(line)["query"] for line in out.splitlines()] == ["", "document 2"]


def test_embed_stdin_waits_for_lines(tiny_bert_dir):
    proc, write_end = started(["embed", "--stdin", "--model", str(tiny_bert_dir)])
    with Pipes(proc) as pipes:
        try:
            still_waiting(proc)
            os.write(write_end, b"one\n\ntw")
            os.write(write_end, b"o\n")
        finally:
            os.close(write_end)
        code, out, err = pipes.finish()
    assert code == 0, err.decode()[-2000:]
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["skipped"] if row["embedding"] is None else "embedded" for row in rows] == \
        ["embedded", "empty_text", "embedded"]
