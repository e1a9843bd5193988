"""Query results people can use: stored text and --keep-columns with every hit, from any directory;
a shard that is gone is said, not a silent null. Real tiny BERT, real Parquet and FAISS, the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader

LANGS = ["en", "fr", "de"]


def write_corpus(root: Path, shards: int = 2, rows: int = 40) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        ids = [f"s{s}-{i}" for i in range(rows)]
        texts = [f"shard {s} text {i} about topic {i % 5}" for i in range(rows)]
        pq.write_table(pa.table({"id": ids, "text": texts, "lang": [LANGS[i % 3] for i in range(rows)],
                                 "year": [2000 + i % 4 for i in range(rows)]}), root / f"shard-{s}.parquet")


@pytest.fixture
def corpus_index(tmp_path, tiny_bert_dir, monkeypatch):
    """An index built from a relative SOURCE in tmp/work, with --keep-columns lang,year."""
    work = tmp_path / "work"
    write_corpus(work / "data")
    monkeypatch.chdir(work)
    result = CliRunner().invoke(cli, ["index", "data", "--out", "idx", "--model", str(tiny_bert_dir), "-q",
                                      "--keep-columns", "lang,year"])
    assert result.exit_code == 0, result.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return work / "idx", work


def query(*args: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["query", *args, "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr


def test_hits_carry_stored_text_and_kept_columns_from_any_directory(corpus_index):
    idx, work = corpus_index
    shutil.rmtree(work / "data")  # the text is stored with the index: the sources are not needed
    (answer,), stderr = query(str(idx), "text 7 about topic 2", "--show-text", "-k", "5")
    assert len(answer["hits"]) == 5 and "warning" not in stderr
    for hit in answer["hits"]:
        shard, row = hit["id"].split("-")
        assert hit["text"] == f"shard {shard[1:]} text {row} about topic {int(row) % 5}"
        assert hit["fields"] == {"lang": LANGS[int(row) % 3], "year": 2000 + int(row) % 4}
    text = CliRunner().invoke(cli, ["query", str(idx), "topic", "--show-text", "-k", "3"])
    assert text.exit_code == 0 and "lang=" in text.stdout and "about topic" in text.stdout

    reader = IndexReader(idx)  # the API: Hit.fields
    hits = reader.search(reader.index.reconstruct_n(0, 2), 3)
    assert all(set(h.fields) == {"lang", "year"} for row in hits for h in row)


def test_show_text_of_an_index_without_stored_text_resolves_the_shard_or_says_it_is_gone(corpus_index):
    idx, work = corpus_index
    version = IndexReader(idx).dir
    manifest = json.loads((version / "manifest.json").read_text())
    manifest.pop("columns")  # as an index built before text was stored
    (version / "manifest.json").write_text(json.dumps(manifest))
    (answer,), stderr = query(str(idx), "topic", "--show-text", "-k", "3")
    assert all(h["text"] and "text_missing" not in h for h in answer["hits"])  # read by absolute path
    shutil.move(work / "data" / "shard-0.parquet", work / "moved.parquet")
    shutil.move(work / "data" / "shard-1.parquet", work / "moved-1.parquet")
    (answer,), stderr = query(str(idx), "topic", "--show-text", "-k", "3")
    assert all(h["text"] is None and h["text_missing"] == "shard gone" for h in answer["hits"])
    assert "is gone" in stderr and "shard-" in stderr


@pytest.mark.parametrize("damage", ["rewritten", "shortened", "unreadable"])
def test_show_text_says_a_changed_or_unreadable_shard_as_such(corpus_index, damage):
    """A shard that is still there but no longer holds the hits' rows (rewritten with other ids, cut short) is said
    as changed, one that cannot be read as unreadable: not "gone (moved or deleted)", and never another
    document's text."""
    idx, work = corpus_index
    version = IndexReader(idx).dir
    manifest = json.loads((version / "manifest.json").read_text())
    manifest.pop("columns")  # as an index built before text was stored
    (version / "manifest.json").write_text(json.dumps(manifest))
    for shard in (work / "data").glob("shard-*.parquet"):
        if damage == "unreadable":
            shard.write_bytes(b"PAR1 not a parquet file PAR1")
            continue
        table = pq.read_table(shard)
        if damage == "rewritten":
            table = table.set_column(0, "id", pa.array([f"other-{i}" for i in range(table.num_rows)]))
        pq.write_table(table.slice(0, 0) if damage == "shortened" else table, shard)
    (answer,), stderr = query(str(idx), "topic", "--show-text", "-k", "3")
    said = {"rewritten": "changed", "shortened": "changed", "unreadable": "unreadable"}[damage]
    assert all(h["text"] is None and h["text_missing"] == f"shard {said}" for h in answer["hits"])
    assert "is gone" not in stderr
    assert ("has changed since it was indexed" if said == "changed" else "cannot be read") in stderr


def test_keep_columns_errors(tmp_path, tiny_bert_dir):
    write_corpus(tmp_path / "data", shards=1)
    out = str(tmp_path / "idx")
    run = CliRunner().invoke(cli, ["index", str(tmp_path / "data"), "--out", out, "--model", str(tiny_bert_dir),
                                   "-q", "--keep-columns", "lang,nope"])
    assert run.exit_code == 65 and "'nope'" in run.stderr and "shard-0.parquet" in run.stderr
    run = CliRunner().invoke(cli, ["index", str(tmp_path / "data"), "--out", out, "--model", str(tiny_bert_dir),
                                   "-q", "--keep-columns", "lang,,year"])
    assert run.exit_code == 2


def test_where_through_the_cli(corpus_index):
    idx, _ = corpus_index
    (answer,), _ = query(str(idx), "topic", "--where", "lang = 'fr' AND year IN (2001, 2002)", "-k", "20")
    assert answer["hits"] and all(h["fields"]["lang"] == "fr" and h["fields"]["year"] in (2001, 2002)
                                  for h in answer["hits"])
    for where, said in [("nope = 1", "unknown column 'nope'"), ("lang = ", "expected a 'string' or a number")]:
        result = CliRunner().invoke(cli, ["query", str(idx), "topic", "--where", where])
        assert result.exit_code == 2 and said in result.stderr, result.output


def test_one_rule_for_null_and_blank_texts_in_embed_and_query(tmp_path, tiny_bert_dir, corpus_index):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"key": ["k0", "k1", "k2", "k3"], "text": ["a text", None, "   ", "another text"]}), src)
    result = CliRunner().invoke(cli, ["embed", "--model", str(tiny_bert_dir), "--input", str(src),
                                      "--id-column", "key"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["index"], r["id"], r.get("skipped")) for r in rows] == [
        (0, "k0", None), (1, "k1", "null_text"), (2, "k2", "empty_text"), (3, "k3", None)]
    assert rows[1]["embedding"] is None and len(rows[3]["embedding"]) > 0
    assert "2 skipped (empty_text 1, null_text 1; at inputs 1, 2)" in result.stderr
    npy = tmp_path / "out.npy"
    result = CliRunner().invoke(cli, ["embed", "--model", str(tiny_bert_dir), "--stdin", "--output", str(npy)],
                                input="a text\n\nanother text\n")
    vectors = np.load(npy)
    assert result.exit_code == 0 and vectors.shape[0] == 3  # input positions kept
    assert np.isnan(vectors[1]).all() and np.isfinite(vectors[[0, 2]]).all()
    assert CliRunner().invoke(cli, ["embed", "--model", str(tiny_bert_dir), "", " "]).exit_code == 66

    idx, _ = corpus_index
    result = CliRunner().invoke(cli, ["query", str(idx), "--stdin", "--json"], input="topic\n\n  \ntext 3\n")
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.exit_code == 0 and [a["query"] for a in answers] == ["topic", "", "  ", "text 3"]  # one a line
    assert [a.get("skipped") for a in answers] == [None, "empty_text", "empty_text", None]
    assert answers[1]["hits"] == [] and answers[0]["hits"] and answers[3]["hits"]
    assert "2 stdin lines skipped" in result.stderr


def test_serve_search_returns_fields_stored_text_and_filters(corpus_index, tmp_path):
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.test_serve import Server

    idx, work = corpus_index
    shutil.rmtree(work / "data")  # the stored text needs no source shard
    server = Server(tmp_path / "server.log", idx)
    try:
        response = server.client.post("/search", json={"query": "topic", "k": 6, "include": ["text"],
                                                       "where": "lang = 'de'"})
        assert response.status_code == 200, response.text
        hits = response.json()["results"][0]["hits"]
        assert len(hits) == 6 and all(h["fields"]["lang"] == "de" and "about topic" in h["text"] for h in hits)
        bad = server.client.post("/search", json={"query": "topic", "where": "nope = 1"})
        assert bad.status_code == 422 and "unknown column 'nope'" in bad.text
    finally:
        server.stop()


def test_a_stdin_session_moves_on_to_each_version_published_while_it_runs(corpus_index, tiny_bert_dir):
    """As a new petal query would, with the model it has loaded (was: the version open at the start, to the end,
    nothing said); a version that cannot be opened is said and the session keeps the one it has."""
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.pipes import Pipes

    idx, work = corpus_index
    session = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "query", str(idx), "--stdin", "--json",
                                "-k", "200"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO)

    def ids_found(query: str) -> set[str]:
        session.stdin.write(query + "\n")
        session.stdin.flush()
        return {hit["id"] for hit in json.loads(pipes.line(f"the answer to {query!r}"))["hits"]}

    with Pipes(session) as pipes:
        assert len(ids_found("topic 1")) == 80
        pq.write_table(pa.table({"id": ["new-0", "new-1"], "text": ["a lighthouse", "a tide pool"],
                                 "lang": ["en", "fr"], "year": [2030, 2031]}), work / "data" / "new.parquet")
        publish = ["index", str(work / "data"), "--out", str(idx), "--model", str(tiny_bert_dir), "-q",
                   "--keep-columns", "lang,year"]
        published = CliRunner().invoke(cli, publish)
        assert published.exit_code == 0, published.output
        assert {"new-0", "new-1"} <= ids_found("topic 2")
        live = (idx / "CURRENT").read_text()
        (idx / "CURRENT").write_text("v999999-20990101T000000Z\n")  # names no version
        assert len(ids_found("topic 3")) == 82  # answered from the version it has
        (idx / "CURRENT").write_text(live)
        assert len(ids_found("topic 4")) == 82
        code, _, stderr = pipes.finish(60)
    assert code == 0, stderr
    assert stderr.count("published during this session") == 1, stderr
    assert "a new version was published but cannot be searched" in stderr and "v999999" in stderr, stderr

    import petal

    index = petal.open_index(idx)
    index.search("topic", 1)
    assert CliRunner().invoke(cli, [*publish, "--full"]).exit_code == 0
    fresh = index.reopened()
    assert fresh is not None and fresh.path != index.path and fresh.reopened() is None
    assert fresh._service is not None and fresh._service.model is index._service.model  # the warm model kept
