"""``petal query --json``'s JSON lines stay one line each for every reader of lines: a document's text, id or kept
column holding U+2028, U+2029 or NEL (U+0085, common in text decoded from Windows-1252 or Latin-1) was written raw
(``ensure_ascii=False``), valid JSON but split into several lines by ``str.splitlines()``, Java's and many log
shippers' line readers; they are now written as JSON escapes. ``petal info --json`` and ``petal verify --json`` the
same. Real tiny BERT, real Parquet and FAISS, the CLI."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from petal.cli.main import cli

SEPARATORS = "\u2028\u2029\x85"


def test_json_outputs_are_one_line_whatever_their_strings_hold(tmp_path, tiny_bert_dir):
    ids = [f"doc{sep}{i}" for i, sep in enumerate(SEPARATORS)] + ["plain"]
    texts = [f"glaciers{sep}flow downhill" for sep in SEPARATORS] + ["glaciers flow"]
    shard = tmp_path / f"odd{SEPARATORS}.parquet"  # a shard path of the manifest, in info and verify
    pq.write_table(pa.table({"id": ids, "text": texts, "note": [f"n{sep}" for sep in SEPARATORS] + ["n"]}), shard)
    runner = CliRunner()
    built = runner.invoke(cli, ["index", str(shard), "--out", str(tmp_path / "idx"), "--model", str(tiny_bert_dir),
                                "-q", "--keep-columns", "note"])
    assert built.exit_code == 0, built.output
    query = f"glaciers{SEPARATORS}"
    for args in (["query", str(tmp_path / "idx"), query, "-k", "4", "--json", "--show-text"],
                 ["query", str(tmp_path / "idx"), "--stdin", "-k", "4", "--json", "--show-text"],
                 ["info", str(tmp_path / "idx"), "--json"], ["verify", str(tmp_path / "idx"), "--json"]):
        result = runner.invoke(cli, args, input=query.encode() + b"\n")
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert len(lines) == 1, (args, lines)
        assert not any(sep in result.stdout for sep in SEPARATORS)
        answer = json.loads(lines[0])
        if args[0] == "query":
            assert answer["query"] == query
            assert {h["id"]: h["text"] for h in answer["hits"]} == dict(zip(ids, texts))
            assert {h["fields"]["note"] for h in answer["hits"]} == {f"n{sep}" for sep in SEPARATORS} | {"n"}
        elif args[0] == "info":
            assert answer["shards"][0]["path"] == str(shard)
