"""A UTF-8 byte order mark that starts a text input (Notepad, PowerShell's ``Out-File``, Excel's "CSV UTF-8"
write one) is no part of its first text, in every input: ``petal embed --input`` ``.jsonl`` (was 65 "line 1:
expected a JSON object with a "text" field") and ``.txt``, ``petal embed --stdin`` and ``petal query --stdin``
(whose ``--json`` echoed it in the first answer's ``query``, and a BPE tokenizer embedded it). Real tiny BERT,
real FAISS, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli

BOM = b"\xef\xbb\xbf"


def embedded(args: list[str], stdin: bytes | None = None) -> list[dict]:
    result = CliRunner().invoke(cli, ["embed", *args], input=stdin)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("form", ["jsonl", "txt", "stdin"])
def test_embed_drops_a_leading_bom(tmp_path, tiny_bert_dir, form):
    texts = ["glaciers flow", "bread rises"]
    plain = embedded(["--model", str(tiny_bert_dir), *texts])
    body = b"".join((json.dumps({"text": t}) if form == "jsonl" else t).encode() + b"\r\n" for t in texts)
    if form == "stdin":
        got = embedded(["--model", str(tiny_bert_dir), "--stdin"], BOM + body)
    else:
        (tmp_path / f"in.{form}").write_bytes(BOM + body)
        got = embedded(["--model", str(tiny_bert_dir), "--input", str(tmp_path / f"in.{form}")])
    assert got == plain


def test_query_stdin_drops_a_leading_bom(tmp_path, tiny_bert_dir):
    pq.write_table(pa.table({"id": [0, 1], "text": ["glaciers flow", "bread rises"]}), tmp_path / "d.parquet")
    runner = CliRunner()
    result = runner.invoke(cli, ["index", str(tmp_path / "d.parquet"), "--out", str(tmp_path / "out"), "--model",
                                 str(tiny_bert_dir), "-q"])
    assert result.exit_code == 0, result.output
    one_shot = runner.invoke(cli, ["query", str(tmp_path / "out"), "glaciers", "bread", "--json"])
    streamed = runner.invoke(cli, ["query", str(tmp_path / "out"), "--stdin", "--json"],
                             input=BOM + b"glaciers\r\nbread\r\n")
    assert one_shot.exit_code == streamed.exit_code == 0, (one_shot.output, streamed.output)
    answers = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [a["query"] for a in answers] == ["glaciers", "bread"]
    given = [json.loads(line) for line in one_shot.stdout.splitlines()]
    # NOTE: scores to float32's precision: two queries embedded together or one at a time differ in the last bits
    # (petal query --json writes FAISS's float32 scores whole; they were rounded to 6 decimals)
    assert [[h["id"] for h in a["hits"]] for a in answers] == [[h["id"] for h in a["hits"]] for a in given]
    np.testing.assert_allclose([[h["score"] for h in a["hits"]] for a in answers],
                               [[h["score"] for h in a["hits"]] for a in given], rtol=1e-6)
