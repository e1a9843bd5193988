"""``petal query``'s text output (without --json) with texts from untrusted shards: every part of a hit's line is
one line of printable characters, the --show-text snippet as the id and the kept columns. Real tiny BERT, real
Parquet and FAISS, the CLI."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from petal.cli.main import cli

# what a shard nobody checked may hold: a terminal escape (colours, a title change, a cursor move), a NUL, a C1
# control (U+009B: CSI on some terminals), a bell, a backspace, each in the text of a document
TEXTS = {"esc": "\x1b]0;owned\x07\x1b[2J glaciers and escape codes",
         "nul": "glaciers\x00 with a NUL byte",
         "c1": "glaciers \x9b31m with a C1 control",
         "bs": "glaciers\x08\x08\x08 with backspaces",
         "plain": "glaciers move slowly downhill"}


def test_show_text_snippets_are_printable_lines(tmp_path, tiny_bert_dir, monkeypatch):
    pq.write_table(pa.table({"id": list(TEXTS), "text": list(TEXTS.values())}), tmp_path / "odd.parquet")
    runner = CliRunner()
    built = runner.invoke(cli, ["index", str(tmp_path / "odd.parquet"), "--out", str(tmp_path / "idx"),
                                "--model", str(tiny_bert_dir), "-q"])
    assert built.exit_code == 0, built.output
    # NOTE: as on a terminal: click strips ANSI sequences from output that is not one, which hid the escape codes
    monkeypatch.setattr("click.utils.should_strip_ansi", lambda stream=None, color=None: False)
    text = runner.invoke(cli, ["query", str(tmp_path / "idx"), "glaciers", "-k", "5", "--show-text"])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    hits = lines[2:]
    assert len(hits) == 5
    for line in hits:
        assert line.isprintable(), repr(line)
    shown = {line.split()[2]: line for line in hits}
    assert "\\x1b]0;owned\\x07\\x1b[2J glaciers and escape codes" in shown["esc"]
    assert "glaciers\\x00 with a NUL byte" in shown["nul"]
    assert "\\x9b31m" in shown["c1"] and "\\x08" in shown["bs"]
    assert shown["plain"].endswith("  glaciers move slowly downhill")

    # --json keeps the text as it is (JSON escapes it), the same documents in the same order
    as_json = runner.invoke(cli, ["query", str(tmp_path / "idx"), "glaciers", "-k", "5", "--show-text", "--json"])
    assert as_json.exit_code == 0, as_json.output
    (answer,) = [json.loads(line) for line in as_json.stdout.split("\n") if line]
    assert [hit["id"] for hit in answer["hits"]] == [line.split()[2] for line in hits]
    assert {hit["id"]: hit["text"] for hit in answer["hits"]} == TEXTS
