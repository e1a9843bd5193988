"""``petal embed --input FILE.jsonl --id-column KEY`` takes the ids ``petal embed`` takes from a ``.parquet``: integers
or strings (README: "another type, or an id that is not UTF-8, exits 65 naming the file, column and row"). A .parquet
id column of floats or booleans was refused (65), but the same ids in a .jsonl (1.5, true, [1], {"a": 1}, a string
holding a lone surrogate, "\\ud800") were written out as they were, exit 0. Real tiny BERT, the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from petal.cli.main import cli

REFUSED = {"float": ("1.5", "a float"), "bool": ("true", "a bool"), "list": ("[1]", "a list"),
           "object": ('{"a": 1}', "a dict"), "lone surrogate": ('"x\\ud800"', "not UTF-8")}


@pytest.mark.parametrize("kind", REFUSED)
def test_a_jsonl_id_that_is_not_an_integer_or_string_is_65_naming_file_line_and_key(tmp_path, tiny_bert_dir, kind):
    value, said = REFUSED[kind]
    source = tmp_path / "in.jsonl"
    source.write_text(f'{{"text": "fine", "id": 7}}\n{{"text": "second", "id": {value}}}\n')
    result = CliRunner().invoke(cli, ["embed", "--input", str(source), "--id-column", "id", "--model",
                                      str(tiny_bert_dir)])
    assert result.exit_code == 65, result.output
    assert "in.jsonl:2" in result.stderr and "'id'" in result.stderr and said in result.stderr, result.stderr
    assert result.stdout == ""


def test_integer_string_and_null_ids_are_taken(tmp_path, tiny_bert_dir):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a", "id": 7}\n{"text": "b", "id": "x"}\n{"text": "c", "id": null}\n'
                      '{"text": "d", "id": 9223372036854775807}\n')  # int64's largest (beyond it: 65)
    result = CliRunner().invoke(cli, ["embed", "--input", str(source), "--id-column", "id", "--model",
                                      str(tiny_bert_dir)])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [7, "x", None, 2**63 - 1]
