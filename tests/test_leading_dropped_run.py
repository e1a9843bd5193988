"""A text whose first 2^20 characters (``MAX_TEXT_CHARS``, what petal reads of a text) are all characters the tokenizer
drops (spaces, zero-width characters, combining marks under MiniLM's accent stripping), with words after them, is read
from its first token: embedded as those words, in ``petal index``, ``petal embed``, ``petal query``, the Python API
and ``petal serve`` alike, the same vector everywhere. Before, its window of 2^20 characters held no token: it was
skipped as ``empty_text`` ("the model's tokenizer drops every character of it", which was false), while the same text
with 1,040,000 spaces in front was embedded. A text that holds nothing the model sees to its end is still
``empty_text``, found in bounded time however long it is. The real MiniLM tokenizer and model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.ingest.tokens import MAX_TEXT_CHARS, TextTokenizer
from tests.invariants import live
from tests.test_invisible_texts import index_rows

WORDS = "glaciers move"
LEADING = [" " * 1_100_000, "\u200b" * (MAX_TEXT_CHARS + 7), "\u0301" * (MAX_TEXT_CHARS + 3),
           " " * (MAX_TEXT_CHARS + 1) + "\u200b" * 3_000_000 + "\n" * 1000]  # a new dropped character past 2^20


def hf_ids(minilm_dir: Path, texts: list[str], max_length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm_dir))
    return hf(texts, truncation=True, max_length=max_length)["input_ids"]


@pytest.mark.parametrize("prompt", ["", "query: "])
def test_the_tokenizer_reads_such_a_text_from_its_first_token(minilm_dir, minilm_spec, prompt):
    """Its ids are the whole text's as Hugging Face tokenizes it (the run adds none), not truncated: the whole text
    was read. Batch and one-text paths alike."""
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 256, prompt=prompt)
    texts = [run + WORDS for run in LEADING]
    expected = hf_ids(minilm_dir, [prompt + WORDS] * len(texts), 256)
    batch = tokenizer.encode([*texts, "short"])
    for i, text in enumerate(texts):
        np.testing.assert_array_equal(batch.token_ids[i], expected[i])
        np.testing.assert_array_equal(tokenizer.encode([text]).token_ids[0], expected[i])
        assert not tokenizer.sees_nothing(batch.token_ids[i])
    assert batch.truncated.tolist() == [False] * len(texts) + [False]


def test_the_characters_read_start_at_its_first_token(minilm_spec):
    """After the run, a text is read for 2^20 characters from its first token, cut there and counted (as a text
    whose first 2^20 characters hold fewer tokens than max_length: ``over_chars``) or cut at max_length."""
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 256)
    run = " " * (MAX_TEXT_CHARS + 10)
    word = "x" * (MAX_TEXT_CHARS + 100) + " glaciers"  # one unknown word past the characters read: [UNK]
    long = "glacier " * 300_000  # past max_length
    out = tokenizer.encode([run + word, run + long, run + "x" * 1000 + " ice"])
    np.testing.assert_array_equal(out.token_ids[0], tokenizer.encode([word[:MAX_TEXT_CHARS]]).token_ids[0])
    np.testing.assert_array_equal(out.token_ids[1], tokenizer.encode([long]).token_ids[0])
    assert out.truncated.tolist() == [True, True, False]
    assert out.cut_at_chars().tolist() == [True, False, False]


def test_a_text_that_holds_nothing_to_its_end_is_empty_in_bounded_time(minilm_spec):
    """Nothing the model sees to the end (64 Mi combining marks): an empty text, not a cut one, in a few seconds
    (the run is skipped without tokenizing all of it)."""
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 256)
    text = "\u0301" * (64 * MAX_TEXT_CHARS)
    started = time.perf_counter()
    out = tokenizer.encode([text, "short"])
    elapsed = time.perf_counter() - started
    assert tokenizer.sees_nothing(out.token_ids[0]) and out.truncated.tolist() == [False, False]
    assert elapsed < 15, elapsed
    started = time.perf_counter()
    found = tokenizer.encode([text + " ice"])  # the word at its end: found too
    assert not tokenizer.sees_nothing(found.token_ids[0]) and time.perf_counter() - started < 15


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> Path:
    """A --stdin file: the audit's reproduction (1.1 M spaces, then words)."""
    path = tmp_path_factory.mktemp("padded") / "sp.txt"
    path.write_text(" " * 1_100_000 + WORDS + "\n")
    return path


def test_petal_embed_and_the_api_embed_it_as_its_words(padded: Path, minilm_dir: Path):
    from petal import Embedder

    args = ["embed", "--model", str(minilm_dir), "--device", "cpu"]
    streamed = CliRunner().invoke(cli, [*args, "--stdin"], input=padded.read_text())
    assert streamed.exit_code == 0, streamed.output
    line = json.loads(streamed.stdout)
    assert "skipped" not in line and line["embedding"] is not None
    plain = json.loads(CliRunner().invoke(cli, [*args, WORDS]).stdout)
    assert line["embedding"] == plain["embedding"]
    with Embedder(minilm_dir, device="cpu") as embedder:
        embedded = embedder.embed([padded.read_text().rstrip("\n"), WORDS])
    assert embedded.skipped == {} and embedded.truncated == 0
    np.testing.assert_array_equal(embedded.rows[0], embedded.rows[1])


def test_petal_index_stores_what_petal_embed_gives(tmp_path: Path, padded: Path, minilm_dir: Path):
    from petal import Embedder

    texts = [" " * 1_100_000 + WORDS, "\u0301" * (MAX_TEXT_CHARS + 3) + WORDS, "espresso"]
    rows = index_rows(tmp_path, minilm_dir, texts)
    assert rows["embedded"] == 3 and not rows["skipped"], rows
    ids, vectors = live(tmp_path / "out")
    with Embedder(minilm_dir, device="cpu") as embedder:
        expected = embedder.encode([*texts, WORDS])
    np.testing.assert_array_equal(expected[0], expected[3])  # the words' vector
    np.testing.assert_array_equal(expected[1], expected[3])
    # NOTE: to float32 rounding: the run packs the three rows together, encode() four (CPU matmul blocking)
    np.testing.assert_allclose(vectors[np.argsort(ids)], expected[:3], rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory) -> Path:
    from tests._serve_shared import copy_sample_out

    return copy_sample_out(tmp_path_factory, tmp_path_factory.mktemp("padded-queries") / "out")


def test_petal_query_and_index_search_answer_it(sample_index: Path, padded: Path):
    import petal

    streamed = CliRunner().invoke(cli, ["query", str(sample_index), "--device", "cpu", "--json", "--stdin"],
                                  input=padded.read_text())
    assert streamed.exit_code == 0, streamed.output
    answer = json.loads(streamed.stdout)
    assert answer["hits"] and "skipped" not in answer
    plain = json.loads(CliRunner().invoke(cli, ["query", str(sample_index), "--device", "cpu", "--json", WORDS])
                       .stdout)
    assert answer["hits"] == plain["hits"]
    with petal.open_index(sample_index, device="cpu") as index:
        found = index.search([padded.read_text().rstrip("\n"), WORDS], k=3)
        assert len(found[0]) == 3 and found[0] == found[1]
        assert index.query_model().unseen([padded.read_text().rstrip("\n")]) == []
