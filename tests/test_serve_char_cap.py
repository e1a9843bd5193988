"""``petal serve``: a text longer than the characters petal reads of a text (``MAX_TEXT_CHARS``, 2^20) whose first
2^20 characters hold fewer tokens than the limit (one huge unknown word) is refused with 413 saying so, not "more
than N tokens" (which it does not have: MiniLM makes one [UNK] of it). Before, /v1/embeddings and /search both said
"input item 0 has more than 512 tokens". With ``"truncate": true`` it is embedded from its first 2^20 characters.

The session's shared server (tests/_serve_shared.py: the packaged MiniLM, sample_data's index, default flags)."""

from __future__ import annotations

import numpy as np
import pytest

from tests._serve_shared import default_server

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

CHARS = 1 << 20  # pipeline/ingest/tokens.py MAX_TEXT_CHARS, spelled out (the message must say it)
HUGE_WORD = "x" * 1_100_000


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def _refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 413, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(f"{field} item 0 has 1100000 characters, over the {CHARS} petal reads of a text"), \
        message
    assert "tokens" not in message.split(";")[0].replace("fewer tokens than the limit", ""), message
    assert '"truncate": true' in message, message


def test_a_huge_word_is_refused_for_its_characters_not_for_tokens(server):
    response = server.client.post("/v1/embeddings", json={"input": HUGE_WORD})
    _refused(response, "input")
    response = server.client.post("/search", json={"query": HUGE_WORD})
    _refused(response, "query")


def test_truncate_embeds_its_first_characters(server):
    """``truncate: true`` (README): the text is cut, here at the characters petal reads, and embedded."""
    cut = server.client.post("/v1/embeddings", json={"input": HUGE_WORD, "truncate": True})
    assert cut.status_code == 200, cut.text
    prefix = server.client.post("/v1/embeddings", json={"input": HUGE_WORD[:CHARS]})
    assert prefix.status_code == 200, prefix.text
    np.testing.assert_array_equal(cut.json()["data"][0]["embedding"], prefix.json()["data"][0]["embedding"])


@pytest.mark.parametrize("words", [600, 140_000])
def test_a_text_over_the_token_limit_still_says_tokens(server, words):
    """Words over MiniLM's 256 tokens, within the characters petal reads or past them: the token limit."""
    response = server.client.post("/v1/embeddings", json={"input": "glacier " * words})
    assert response.status_code == 413, response.text
    assert "input item 0 has more than 256 tokens" in response.json()["error"]["message"], response.text


@pytest.mark.parametrize("filler", [" ", "\u0301"], ids=["blank", "combining marks"])
def test_a_text_whose_first_characters_hold_nothing_is_read_from_its_first_token(server, filler):
    """2^20 characters the model sees nothing in (spaces, or marks MiniLM's tokenizer drops), then words: read from
    the words on, as petal index, petal embed and petal query read it (tests/test_leading_dropped_run.py): 200, the
    words' vector. It was a 413 (cut at 2^20 characters it was an empty text), and the same text with 40,000
    fewer spaces was embedded."""
    text = filler * (CHARS + 5) + " hello"
    words = server.client.post("/v1/embeddings", json={"input": "hello"})
    assert words.status_code == 200, words.text
    response = server.client.post("/v1/embeddings", json={"input": text})
    assert response.status_code == 200, response.text
    assert response.json()["data"][0]["embedding"] == words.json()["data"][0]["embedding"]
    found = server.client.post("/search", json={"query": text})
    assert found.status_code == 200, found.text
    hits = found.json()["results"][0]["hits"]
    assert hits and hits == server.client.post("/search", json={"query": "hello"}).json()["results"][0]["hits"]
