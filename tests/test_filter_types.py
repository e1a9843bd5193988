"""A ``--where`` literal compares only with a kept column of its own kind: ``topic = 5`` on a string column is a
usage error naming the column, its stored type and the literal's type (exit 2; ``petal serve``: 422), never a
cast. Real tiny BERT, real Parquet and FAISS, the CLI, the API and a real ``petal serve``."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.filters import parse_filter
from petal.pipeline.index.search import IndexReader

ROWS = 48


@pytest.fixture(scope="module")
def typed_index(tmp_path_factory: pytest.TempPathFactory, tiny_bert_dir: Path) -> Path:
    """Kept columns of every kind: string topic ("0".."5"), int16 year, double score, bool flag, date day."""
    root = tmp_path_factory.mktemp("filter-types")
    pq.write_table(pa.table({
        "id": [f"d{i}" for i in range(ROWS)], "text": [f"document {i} about {i % 6}" for i in range(ROWS)],
        "topic": [str(i % 6) for i in range(ROWS)],
        "year": pa.array([2000 + i % 3 for i in range(ROWS)], pa.int16()),
        "score": [i / 4 for i in range(ROWS)], "flag": [i % 2 == 0 for i in range(ROWS)],
        "day": [datetime.date(2024, 1, 1 + i % 4) for i in range(ROWS)]}), root / "docs.parquet")
    out = root / "idx"
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(out), "-q",
                                      "--model", str(tiny_bert_dir), "--keep-columns", "topic,year,score,flag,day"])
    assert result.exit_code == 0, result.output
    return out


MISMATCHES = [  # (where, column, stored type, the literal as said, its kind)
    ("topic = 5", "topic", "string", "5", "an integer"),
    ("topic = 2.5", "topic", "string", "2.5", "a number"),
    ("topic = true", "topic", "string", "true", "a boolean"),
    ("topic IN ('1', 2)", "topic", "string", "2", "an integer"),
    ("year = '2001'", "year", "int16", "'2001'", "a string"),
    ("year IN (2001, '2002')", "year", "int16", "'2002'", "a string"),
    ("score = '2.5'", "score", "double", "'2.5'", "a string"),
    ("flag = 1", "flag", "bool", "1", "an integer"),
    ("flag = 'true'", "flag", "bool", "'true'", "a string"),
    ("day = 20240101", "day", "date32", "20240101", "an integer"),
    ("topic = '1' AND year = '2001'", "year", "int16", "'2001'", "a string"),
]


@pytest.mark.parametrize(("where", "column", "stored", "literal", "kind"), MISMATCHES,
                         ids=[m[0] for m in MISMATCHES])
def test_a_literal_of_another_kind_is_a_usage_error_naming_column_and_types(typed_index, where, column, stored,
                                                                             literal, kind):
    result = CliRunner().invoke(cli, ["query", str(typed_index), "some text", "--where", where])
    assert result.exit_code == 2, result.output
    said = f"--where: column {column!r} is {stored}"
    assert said in result.stderr and f"; {literal} is {kind}:" in result.stderr, result.stderr
    reader = IndexReader(typed_index)  # the Python API: the same rule, a ValueError
    with pytest.raises(ValueError, match=f"column {column!r} is {stored}"):
        reader.search(reader.index.reconstruct_n(0, 1), 5, where=where)


def test_the_hint_says_how_to_write_it(typed_index):
    for where, hint in [("topic = 5", "write '5' to compare it as text"),
                        ("year = '2001'", "write it unquoted (2001) to compare it as a number"),
                        ("year = 'recent'", "give a number"), ("flag = 0", "write true or false"),
                        ("day = 5", "give a quoted date or time")]:
        result = CliRunner().invoke(cli, ["query", str(typed_index), "x", "--where", where])
        assert result.exit_code == 2 and hint in result.stderr, (where, result.stderr)


def test_literals_of_the_column_kind_match_by_value(typed_index):
    reader = IndexReader(typed_index)
    query = reader.index.reconstruct_n(0, 1)

    def fields(where: str) -> list[dict]:
        (hits,) = reader.search(query, ROWS, where=where)
        return [h.fields for h in hits]

    assert {f["topic"] for f in fields("topic = '5'")} == {"5"} and len(fields("topic = '5'")) == ROWS // 6
    assert len(fields("year = 2001")) == ROWS // 3 and fields("year = 2001.0") == fields("year = 2001")
    assert fields("year = 2001.5") == [] and fields("year = 70000") == []  # no int16 equals them
    assert {f["score"] for f in fields("score IN (0.5, 2)")} == {0.5, 2.0}
    assert len(fields("flag = true")) == ROWS // 2 and all(not f["flag"] for f in fields("flag IN (FALSE)"))
    assert {f["day"] for f in fields("day = '2024-01-02'")} == {datetime.date(2024, 1, 2)}
    result = CliRunner().invoke(cli, ["query", str(typed_index), "x", "--where", "day = 'someday'"])
    assert result.exit_code == 2 and "column 'day' is date32" in result.stderr, result.output


def test_true_and_false_are_literals_quoted_names_are_columns():
    flt = parse_filter('flag = true AND "true" IN (FALSE, 1)')
    assert [(c.column, c.values) for c in flt.clauses] == [("flag", (True,)), ("true", (False, 1))]


def test_serve_search_gives_the_same_rule_as_a_422(typed_index, tmp_path):
    pytest.importorskip("httpx")
    from tests.test_serve import Server  # a real `petal serve` child process

    server = Server(tmp_path / "server.log", typed_index)
    try:
        for where, said in [("topic = 5", "'where': column 'topic' is string; 5 is an integer"),
                            ("year IN (2001, '2002')", "'where': column 'year' is int16; '2002' is a string"),
                            # JSON's lone surrogate: was a 500 (Arrow's UnicodeEncodeError)
                            ("topic = '\ud800'", "character 10 is not text")]:
            body = json.dumps({"query": "document", "k": 3, "where": where}).encode()  # NOTE: escapes the surrogate
            response = server.client.post("/search", content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == 422, response.text
            assert said in response.json()["error"]["message"], response.text
        good = server.client.post("/search", json={"query": "document", "k": 3, "where": "topic = '5'"})
        assert good.status_code == 200, good.text
        assert [h["fields"]["topic"] for h in good.json()["results"][0]["hits"]] == ["5"] * 3
    finally:
        server.stop()
