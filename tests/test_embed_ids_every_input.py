"""``petal embed --input FILE --id-column COL`` with TEXT arguments and ``--stdin`` too: every output row carries
the id of its input (``null`` for a TEXT argument or a ``--stdin`` line, which have none), in input order; the
``--stdin`` rows were past the end of the ids, an IndexError traceback (exit 1) after some lines were written.
Real tiny BERT, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli


@pytest.mark.parametrize("output", [None, "out.jsonl"])
def test_ids_of_input_rows_with_text_arguments_and_stdin(tmp_path, tiny_bert_dir, output):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "from the file", "id": 7}\n{"text": "second file row", "id": "b"}\n')
    args = ["embed", "an argument", "--input", str(source), "--id-column", "id", "--stdin", "--model",
            str(tiny_bert_dir)]
    if output:
        args += ["--output", str(tmp_path / output)]
    result = CliRunner().invoke(cli, args, input=b"a stdin line\n\nlast stdin line")
    assert result.exit_code == 0, result.output
    text = (tmp_path / output).read_text() if output else result.stdout
    rows = [json.loads(line) for line in text.splitlines()]
    assert [(r["index"], r["id"]) for r in rows] == [(0, None), (1, 7), (2, "b"), (3, None), (4, None), (5, None)]
    assert rows[4]["skipped"] == "empty_text" and all(r["embedding"] for i, r in enumerate(rows) if i != 4)
    alone = CliRunner().invoke(cli, ["embed", "last stdin line", "--model", str(tiny_bert_dir)])
    np.testing.assert_array_equal(json.loads(alone.stdout)["embedding"], rows[5]["embedding"])


def test_ids_with_a_npy_output_are_a_usage_error(tmp_path, tiny_bert_dir):
    """A .npy holds the rows only: --id-column there would set nothing (the ids were dropped, silently, exit 0)."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "from the file", "id": 7}\n')
    result = CliRunner().invoke(cli, ["embed", "--input", str(source), "--id-column", "id", "--output",
                                      str(tmp_path / "out.npy"), "--model", str(tiny_bert_dir)])
    assert result.exit_code == 2 and "--id-column" in result.stderr and ".jsonl" in result.stderr, result.output
    assert not (tmp_path / "out.npy").exists()
