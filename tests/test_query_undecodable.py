"""A query whose bytes are not UTF-8 gets the same answer from ``petal query TEXT``, ``petal query --stdin`` and
``petal.open_index(...).search``: each reads the bad bytes as U+FFFD and answers it. ``Index.search`` gave UTF-8
bytes with one bad byte no hits, silently (the rule of ``petal embed``, which skips such a text), while a ``str``
holding the same bytes as lone surrogates (how Python reads them from argv or a file opened with
``errors="surrogateescape"``) was answered. Real tiny BERT, real Parquet and FAISS, the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal

TEXTS = ["glaciers flow downhill", "bread dough rises", "cats purr softly", "rivers carve valleys"]
QUERY = b"glaciers \xff\xfe flow"


@pytest.fixture(scope="module")
def out(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("undecodable")
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "text": TEXTS}), root / "s.parquet")
    petal.index(root / "s.parquet", root / "out", model=str(tiny_bert_dir), quiet=True)
    return root / "out"


def _cli_hits(*args: str | bytes, stdin: bytes | None = None) -> list[tuple[int, float]]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "query", *args, "-k", "3", "--json"],
                          input=stdin, capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert b"not UTF-8, read as U+FFFD" in done.stderr
    (answer,) = [json.loads(line) for line in done.stdout.decode().split("\n") if line]
    assert answer["query"] == QUERY.decode("utf-8", "replace")
    return [(hit["id"], round(hit["score"], 5)) for hit in answer["hits"]]


def test_bytes_that_are_not_utf8_are_answered_alike_by_the_cli_and_the_api(out):
    by_argv = _cli_hits(str(out), QUERY)
    assert _cli_hits(str(out), "--stdin", stdin=QUERY + b"\n") == by_argv
    with petal.open_index(out, device="cpu") as index:
        by_replacement = index.search(QUERY.decode("utf-8", "replace"), k=3)
        for query in (QUERY, [QUERY], QUERY.decode("utf-8", "surrogateescape"), [None, QUERY]):
            found = index.search(query, k=3)
            hits = found[-1]
            assert [(h.id, round(h.score, 5)) for h in hits] == by_argv, query
            assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in by_replacement[0]]
        assert index.search([None, b"  ", QUERY], k=3)[:2] == [[], []]  # null and blank: still no hits
