"""``petal query --stdin`` answers every line in its place, a skipped one (blank) as skipped: it wrote nothing for a
blank line, so a coprocess that writes a line and waits for its answer waited forever, and the answers of a file of
queries no longer lined up with its lines. Lines skipped before the first answer are written with it, so a stdin of
blank lines only still writes nothing and exits 66. A real process, the packaged MiniLM, a real index."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.pipes import Pipes


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}


def _petal(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, args)], input=stdin,
                          capture_output=True, cwd=REPO, env=_env(), timeout=300)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdin-skipped")
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers flow downhill", "bread needs yeast", "lava"]}),
                   root / "docs.parquet")
    done = _petal("index", root / "docs.parquet", "--out", root / "out", "-q")
    assert done.returncode == 0, done.stderr.decode()
    return root / "out"


def test_a_blank_line_after_an_answer_is_answered_at_once_as_skipped(index_dir):
    proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "query", str(index_dir), "--stdin", "--json",
                             "-k", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env=_env())
    with Pipes(proc) as pipes:
        assert proc.stdin is not None
        answers = []
        for line in (b"glaciers\n", b"   \n", b"bread\n", b"\n"):
            proc.stdin.write(line)
            proc.stdin.flush()
            answers.append(json.loads(pipes.line(f"the answer to {line!r}")))
        code, _, stderr = pipes.finish()
    err = stderr.decode()
    assert code == 0, err
    assert [a["query"] for a in answers] == ["glaciers", "   ", "bread", ""]
    assert [a.get("skipped") for a in answers] == [None, "empty_text", None, "empty_text"]
    assert answers[0]["hits"][0]["id"] == 1 and answers[2]["hits"][0]["id"] == 2
    assert answers[1]["hits"] == [] == answers[3]["hits"]
    assert "2 stdin lines skipped" in err


@pytest.mark.parametrize("as_json", [True, False])
def test_answers_line_up_with_the_lines_and_blank_only_input_writes_nothing(index_dir, as_json):
    flags = ["--json"] if as_json else []
    done = _petal("query", index_dir, "--stdin", "-k", "1", *flags, stdin=b"\n\nlava\n\t\nglaciers\n")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().splitlines()
    if as_json:
        answers = [json.loads(line) for line in out]
        assert [a["query"] for a in answers] == ["", "", "lava", "\t", "glaciers"]
        assert [bool(a["hits"]) for a in answers] == [False, False, True, False, True]
    else:
        queries = [line for line in out if line.startswith("query:")]
        assert len(queries) == 5 and out.count("   (skipped: empty_text)") == 3
    blank = _petal("query", index_dir, "--stdin", *flags, stdin=b"\n \n")
    assert blank.returncode == 66 and blank.stdout == b"", blank.stderr.decode()


@pytest.mark.parametrize("as_json", [True, False])
def test_every_query_text_argument_gets_its_answer_in_its_place(index_dir, as_json):
    """A blank TEXT argument got no answer at all (only a stderr line), so the answers of ``petal query OUT "" "real
    query"`` no longer lined up with the arguments; each is now answered as skipped in its place, as a blank --stdin
    line is."""
    flags = ["--json"] if as_json else []
    done = _petal("query", index_dir, "", "glaciers", "   ", "bread", "-k", "1", *flags)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().splitlines()
    if as_json:
        answers = [json.loads(line) for line in out]
        assert [a["query"] for a in answers] == ["", "glaciers", "   ", "bread"]
        assert [a.get("skipped") for a in answers] == ["empty_text", None, "empty_text", None]
        assert [[h["id"] for h in a["hits"]] for a in answers] == [[], [1], [], [2]]
    else:
        assert [line for line in out if line.startswith("query:")] == ["query: ", "query: glaciers", "query:    ",
                                                                        "query: bread"]
        assert out[1] == out[6] == "   (skipped: empty_text)" and out[7] == "query: bread"
    err = done.stderr.decode()
    assert "skipped query 0 (empty_text)" in err and "skipped query 2 (empty_text)" in err


def test_blank_text_arguments_before_stdin_are_answered_with_its_first_answer(index_dir):
    done = _petal("query", index_dir, " ", "--stdin", "--json", "-k", "1", stdin=b"lava\n")
    assert done.returncode == 0, done.stderr.decode()
    answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [(a["query"], a.get("skipped")) for a in answers] == [(" ", "empty_text"), ("lava", None)]
    blank = _petal("query", index_dir, " ", "--stdin", "--json", stdin=b"\n")
    assert blank.returncode == 66 and blank.stdout == b"", blank.stderr.decode()


def test_one_skipped_line_is_counted_in_the_singular(index_dir):
    done = _petal("query", index_dir, "--stdin", "-k", "1", stdin=b"glaciers\n\n")
    assert done.returncode == 0, done.stderr.decode()
    assert "petal: 1 stdin line skipped (empty_text: blank lines are not queries)" in done.stderr.decode()


STDIN_CR = b"glaciers\r\r\nbread\r\n\r\n\r\r\nlava\r"


def test_a_stdin_line_loses_one_carriage_return_as_a_txt_line_does(index_dir, tmp_path):
    """A ``\\n`` and one ``\\r`` before it end a line, on stdin as in a ``.txt`` input: ``b"glaciers\\r\\r\\n"`` was
    the query ``"glaciers"`` on stdin (every ``\\r`` at a line's end dropped) and ``"glaciers\\r"`` from a file, a
    vector of another text for a model that reads ``\\r`` (the query echoed back showed it under MiniLM)."""
    from petal.pipeline.ingest.text_rule import input_lines
    from petal.pipeline.ingest.texts import read_texts

    (tmp_path / "q.txt").write_bytes(STDIN_CR)
    from_file = read_texts(tmp_path / "q.txt")[0]
    assert from_file == ["glaciers\r", "bread", "", "\r", "lava"]
    assert [line.decode() for line in input_lines(re.findall(rb"[^\n]*\n|[^\n]+$", STDIN_CR))] == from_file
    done = _petal("query", index_dir, "--stdin", "--json", "-k", "1", stdin=STDIN_CR)
    assert done.returncode == 0, done.stderr.decode()
    answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [a["query"] for a in answers] == from_file
    assert [a.get("skipped") for a in answers] == [None, None, "empty_text", "empty_text", None]
