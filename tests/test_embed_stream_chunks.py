"""``Embedder.embed_stream`` took its ``(texts, more)`` chunks as they came: a chunk's texts given as one str was
iterated, one text per character (``("a long text", False)`` gave 11 rows, exit 0, no word), an int among them was
skipped as ``not_text`` where ``embed`` refuses it, and a chunk that is no pair was a bare ValueError from unpacking
(or, a 2-character str, taken as one). A chunk's texts are now judged as ``embed`` judges its own (one str is one
text), and a chunk that is no pair, or a ``more`` that is no bool, is a ``UsageError`` naming the chunk. Real
packaged MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

import petal


@pytest.fixture(scope="module")
def embedder():
    with petal.Embedder(device="cpu") as model:
        yield model


def test_one_str_is_one_text_as_in_embed(embedder):
    answers = list(embedder.embed_stream([("a long text", True), (b"another", False)]))
    rows = np.concatenate([answer.rows for answer in answers])
    np.testing.assert_allclose(rows, embedder.embed(["a long text", b"another"]).rows, atol=1e-6)


@pytest.mark.parametrize("chunks, named", [
    (["ab", "cd"], r"chunks\[0\] is a str, not a \(texts, more\) pair"),
    ([(["a"], False, 3)], r"chunks\[0\] is a tuple, not a \(texts, more\) pair"),
    ([(["a"], True), (["b", 5], False)], r"chunks\[1\]: texts\[1\] is an int"),
    ([(None, False)], r"chunks\[0\]: texts: a NoneType"),
    ([({"a": 1}, False)], r"chunks\[0\]: texts: a dict"),
    ([(["a"], "no")], r"chunks\[0\]: more='no' is a str"),
    (5, r"chunks an int is not an iterable"),
])
def test_a_malformed_chunk_is_a_usage_error_naming_it(embedder, chunks, named):
    with pytest.raises(petal.UsageError, match=named):
        list(embedder.embed_stream(chunks))
