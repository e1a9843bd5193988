"""A stdout whose encoding cannot hold every character (``PYTHONIOENCODING=latin-1``, a cp1252 console): ``petal
query`` ended in a UnicodeEncodeError traceback (exit 1), even for an ASCII query, since ``--show-text`` cuts a long
text with U+2026. Now a character the encoding cannot hold is written as its escape: in JSON lines a JSON escape (the
same JSON to a reader), in the text table a backslash escape. Real ``petal query`` processes on the sample index."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._serve_shared import sample_out


def _query(out, *argv: str, encoding: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", "query", str(out), *argv], capture_output=True,
                          input=stdin, timeout=120, env={**os.environ, "PYTHONIOENCODING": encoding})


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_query_output_to_a_narrow_stdout_is_escaped_not_a_traceback(tmp_path_factory, encoding):
    out = sample_out(tmp_path_factory)
    shown = _query(out, "glacier", "-k", "2", "--show-text", encoding=encoding)
    assert shown.returncode == 0 and b"Traceback" not in shown.stderr, shown.stderr.decode(errors="replace")
    text = shown.stdout.decode(encoding)
    assert "glacier" in text.lower() and text.count("\n") >= 3, text
    query = "日本 glacier ✓"
    lines = _query(out, query, "-k", "1", "--json", encoding=encoding)
    assert lines.returncode == 0, lines.stderr.decode(errors="replace")
    [answer] = [json.loads(line) for line in lines.stdout.decode(encoding).splitlines()]
    assert answer["query"] == query and len(answer["hits"]) == 1
    stdin = _query(out, "--stdin", "--json", "-k", "1", encoding=encoding, stdin="caf\xe9 日本\n".encode("latin-1",
                                                                                                      "ignore"))
    assert stdin.returncode == 0, stdin.stderr.decode(errors="replace")
    assert json.loads(stdin.stdout.decode(encoding))["query"] == "caf\ufffd "


def test_a_query_of_bytes_that_are_not_utf8_only_says_its_count_when_nothing_is_answered(tmp_path_factory):
    """``petal query OUT $'\\xff'``: U+FFFD, which the packaged model's tokenizer drops: no input (66), and the count
    of queries that held such bytes is said (it was said only after answers, so this exit left it out)."""
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "query", str(sample_out(tmp_path_factory)),
                           b"\xff"], capture_output=True, timeout=120)
    assert done.returncode == 66, done.stderr.decode(errors="replace")
    assert b"1 query held bytes that are not UTF-8" in done.stderr, done.stderr.decode(errors="replace")
