"""A row whose characters the tokenizer drops, every one, is empty to the model: MiniLM's BERT normaliser strips
combining marks (accent stripping) and U+FFFD (its text cleaning), so a row of only those encodes to [CLS] [SEP],
an empty text's ids, and every such row got that one vector, as rows of invisible characters did before
tests/test_invisible_texts.py. ``petal index`` skips and counts it (``empty_text``) as it does a blank row. Visible
characters are not the test: the ids are (``TextTokenizer.sees_nothing``), with a prompt in front too. ``petal embed``
answers such a text as skipped in its place; ``petal query`` (TEXT, ``--stdin``), ``petal.Index.search`` and ``petal
serve`` treat such a query as a blank one: skipped in its place and said, no hits (the API), 422 (serve). Before, the
query was embedded as an empty text and answered with that vector's neighbours, the same for every such query."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.invariants import live
from tests.test_invisible_texts import index_rows

DROPPED = ["\u0301\u0301", "\u0300 \u0308", "\ufffd\ufffd\ufffd", "\u0301\ufffd"]


def test_the_tokenizer_sees_nothing_of_them_with_or_without_a_prompt(minilm_spec):
    from petal.pipeline.ingest.tokens import TextTokenizer

    for prompt in ("", "query: "):
        tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 32, prompt=prompt)
        encoded = tokenizer.encode([*DROPPED, "e\u0301te\u0301", "\ufffd word", "a"]).token_ids
        assert [tokenizer.sees_nothing(ids) for ids in encoded] == [True] * len(DROPPED) + [False] * 3
        assert len({tuple(ids) for ids in encoded[: len(DROPPED)]}) == 1  # one and the same input for all of them
        lone = [tokenizer.encode([text]).token_ids[0] for text in DROPPED]  # the one-text path: the same ids
        assert all(np.array_equal(a, b) for a, b in zip(lone, encoded))


def test_petal_index_skips_and_counts_rows_the_model_sees_as_empty(tmp_path: Path, minilm_dir: Path):
    texts = [*DROPPED, "real words about glaciers", "caf\u00e9 au lait", "\ufffd mojibake and words"]
    rows = index_rows(tmp_path, minilm_dir, texts)
    assert rows["skipped"] == {"empty_text": len(DROPPED)} and rows["embedded"] == 3
    assert sorted(live(tmp_path / "out")[0]) == [4, 5, 6]
    strict = CliRunner().invoke(cli, ["index", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "strict"),
                                      "--model", str(minilm_dir), "--device", "cpu", "-q", "--strict"])
    assert strict.exit_code == 65 and "empty_text" in strict.output


def test_petal_embed_skips_them_as_petal_index_does(tmp_path: Path, minilm_dir: Path):
    """``petal embed`` (one call, ``--stdin`` streamed and ``--input``) answers such a text as skipped
    (``empty_text``), in its place, as a blank one; before, it wrote the [CLS] [SEP] vector for it."""
    args = ["embed", "--model", str(minilm_dir), "--device", "cpu"]
    result = CliRunner().invoke(cli, [*args, "real words", DROPPED[0], "more words"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["index"] for line in lines if line["embedding"] is not None] == [0, 2]
    assert [line.get("skipped") for line in lines if line["index"] == 1] == ["empty_text"]
    streamed = CliRunner().invoke(cli, [*args, "--stdin"], input="real words\n" + "\n".join(DROPPED) + "\nmore words\n")
    assert streamed.exit_code == 0, streamed.output
    assert [json.loads(line) for line in streamed.stdout.splitlines()] == [
        json.loads(line) for line in CliRunner().invoke(cli, [*args, "real words", *DROPPED, "more words"]).stdout
        .splitlines()]
    every = CliRunner().invoke(cli, [*args, *DROPPED])
    assert every.exit_code == 66 and "nothing to embed" in every.output  # as an input of blank texts only


def test_the_embedder_places_them_as_skipped(minilm_dir: Path):
    from petal import Embedder

    with Embedder(minilm_dir, device="cpu") as embedder:
        embedded = embedder.embed(["real words", *DROPPED, "more words"])
        alone = embedder.encode(["real words", "more words"])
    assert embedded.skipped == {i + 1: "empty_text" for i in range(len(DROPPED))}
    assert np.isnan(embedded.rows[1: 1 + len(DROPPED)]).all()
    np.testing.assert_array_equal(embedded.rows[[0, -1]], alone)


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory) -> Path:
    from tests._serve_shared import copy_sample_out

    return copy_sample_out(tmp_path_factory, tmp_path_factory.mktemp("unseen-queries") / "out")


def query(index: Path, *args: str, stdin: str | None = None):
    return CliRunner().invoke(cli, ["query", str(index), "--device", "cpu", "--json", *args], input=stdin)


def test_petal_query_skips_them_as_blank_queries(sample_index: Path):
    """TEXT and ``--stdin``: such a query is answered as skipped (``empty_text``) in its place and named on stderr,
    the others as usual; nothing but such queries is no input (66), as blank ones only."""
    given = query(sample_index, "how do glaciers move", DROPPED[0], "espresso")
    assert given.exit_code == 0, given.output
    answers = [json.loads(line) for line in given.stdout.splitlines()]
    assert [a["query"] for a in answers] == ["how do glaciers move", DROPPED[0], "espresso"]
    assert answers[1] == {"query": DROPPED[0], "hits": [], "skipped": "empty_text"}
    assert answers[0]["hits"] and answers[2]["hits"] and "skipped" not in answers[0]
    assert "petal: skipped query 1 (empty_text: the model's tokenizer drops every character" in given.stderr
    only = query(sample_index, *DROPPED)
    assert only.exit_code == 66 and only.stdout == "", only.output
    assert f"nothing to query: all {len(DROPPED)} query TEXTs hold only characters the model's tokenizer drops" \
        in only.stderr
    lines = ["how do glaciers move", DROPPED[1], "", DROPPED[2], "espresso"]
    streamed = query(sample_index, "--stdin", stdin="\n".join(lines) + "\n")
    assert streamed.exit_code == 0, streamed.output
    answers = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [a.get("skipped") for a in answers] == [None, "empty_text", "empty_text", "empty_text", None]
    assert answers[0]["hits"] and answers[4]["hits"] and not any(a["hits"] for a in answers[1:4])
    assert f'skipped --stdin line "{DROPPED[2]}" (empty_text: the model' in streamed.stderr, streamed.stderr
    assert "petal: 2 stdin lines skipped (empty_text: the model's tokenizer drops" in streamed.stderr
    nothing = query(sample_index, "--stdin", DROPPED[3], stdin=DROPPED[0] + "\n\n")
    assert nothing.exit_code == 66 and nothing.stdout == "", nothing.output
    assert "--stdin held only lines skipped (blank 1, nothing the model sees 1)" in nothing.stderr
    assert "the query TEXT holds only characters the model's tokenizer drops" in nothing.stderr


def test_the_api_answers_them_with_no_hits(sample_index: Path):
    import petal

    with petal.open_index(sample_index, device="cpu") as index:
        found = index.search(["how do glaciers move", *DROPPED, " ", "espresso"], k=3)
        assert [len(hits) for hits in found] == [3] + [0] * len(DROPPED) + [0, 3]
        assert index.query_model().unseen(["how do glaciers move", DROPPED[0]]) == [1]


def test_unseen_takes_what_search_takes_and_names_its_empty_answers(sample_index: Path):
    """``query_model().unseen(texts)`` tells which of ``search``'s answers are empty for want of text: it takes the
    queries ``search`` takes. Was: bytes, None, a lone surrogate, one str or a numpy array went to the tokenizer as
    given: a raw TypeError/ValueError from inside it ('TextInputSequence must be str', 'truth value of an array')."""
    import petal
    from petal.pipeline.reliability.errors import UsageError

    with petal.open_index(sample_index, device="cpu") as index:
        cases = [["\udcff"], [b"glacier"], [b"\xff\xfe"], [None], ["ice", None, " "], "how do glaciers move",
                 b"ice sheets", np.array(["ice", DROPPED[1]]), (text for text in ["ice", ""]), [DROPPED[2], "ice"]]
        for queries in cases:
            again = list(queries) if not isinstance(queries, (str, bytes, np.ndarray)) else queries
            unseen = index.query_model().unseen(again)
            found = index.search(list(again) if isinstance(again, list) else again, k=2)
            assert unseen == [i for i, hits in enumerate(found) if not hits], (queries, unseen)
        for wrong in ([1], [b"ok", 2.5], {"a": 1}, 7):
            with pytest.raises(UsageError, match=r"texts"):
                index.query_model().unseen(wrong)


def test_petal_serve_refuses_them_as_empty(request, tmp_path_factory):
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests._serve_shared import default_server

    server = default_server(request, tmp_path_factory)
    for path, body, field, item in [("/search", {"query": DROPPED[0]}, "query", 0),
                                    ("/search", {"queries": ["glaciers", DROPPED[1]]}, "queries", 1),
                                    ("/v1/embeddings", {"input": ["ok", "fine", DROPPED[2]]}, "input", 2)]:
        response = server.client.post(path, json=body)
        assert response.status_code == 422, (path, response.text)
        message = response.json()["error"]["message"]
        assert message.startswith(f"{field} item {item} is empty to the model") and "empty_text" in message, message
    assert server.client.post("/search", json={"query": "glaciers"}).status_code == 200
