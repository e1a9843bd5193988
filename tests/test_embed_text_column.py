"""``petal embed --text-column`` names the text of every --input that has columns or keys: a ``.jsonl`` line's key,
as ``--id-column`` names its id key (it was ignored there: a line ``{"text": ..., "body": ...}`` embedded "text"
under ``--text-column body``, silently, and a file of "body" keys was 65 'expected a JSON object with a "text"
field'). Given where it sets nothing (an ``--input`` ``.txt``, TEXT arguments or ``--stdin`` alone) it is a usage
error (2), as ``--id-column`` there. Real tiny BERT, the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from petal.cli.main import cli


def embed(*args: str, stdin: bytes | None = None):
    return CliRunner().invoke(cli, ["embed", *args], input=stdin)


def test_jsonl_text_comes_from_the_text_column_key(tmp_path, tiny_bert_dir):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "the wrong field", "body": "glaciers move", "id": 1}\n{"body": null, "id": 2}\n')
    result = embed("--input", str(source), "--text-column", "body", "--id-column", "id", "--model", str(tiny_bert_dir))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    alone = json.loads(embed("glaciers move", "--model", str(tiny_bert_dir)).stdout)
    assert rows[0]["embedding"] == alone["embedding"] and rows[0]["id"] == 1
    assert rows[1]["skipped"] == "null_text" and rows[1]["id"] == 2
    missing = tmp_path / "other.jsonl"
    missing.write_text('{"text": "no body here"}\n')
    refused = embed("--input", str(missing), "--text-column", "body", "--model", str(tiny_bert_dir))
    assert refused.exit_code == 65 and '"body"' in refused.stderr, refused.output


@pytest.mark.parametrize("where", ["txt", "text", "stdin"])
def test_text_column_where_it_sets_nothing_is_a_usage_error(tmp_path, tiny_bert_dir, where):
    (tmp_path / "in.txt").write_text("glaciers\n")
    args = {"txt": ["--input", str(tmp_path / "in.txt")], "text": ["glaciers"], "stdin": ["--stdin"]}[where]
    result = embed(*args, "--text-column", "body", "--model", str(tiny_bert_dir), stdin=b"glaciers\n")
    assert result.exit_code == 2 and "--text-column" in result.stderr, result.output
    plain = embed(*args, "--model", str(tiny_bert_dir), stdin=b"glaciers\n")
    assert plain.exit_code == 0, plain.output
