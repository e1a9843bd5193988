"""The texts a Python caller passes (``Embedder.encode``/``embed``, ``Index.search``): one text or an ordered
collection of them. A dict iterated its keys and a set in an order nobody can match rows to, silently; a bytearray
or memoryview iterated into ints. Each is now a ``UsageError`` naming the argument and its type, before any model
work. Real packaged MiniLM, a real index (Parquet, FAISS)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal

TEXTS = ["glaciers flow downhill", "bread dough rises"]
# (a maker of the argument: a generator is used up by one call, its message's pattern)
REFUSED = {
    "dict": (lambda: dict(zip("ab", TEXTS)), ": a dict is not a list of texts .*keys"),
    "set": (lambda: set(TEXTS), ": a set is not a list of texts .*no order"),
    "frozenset": (lambda: frozenset(["glaciers flow downhill"]), ": a frozenset is not a list of texts"),
    "bytearray": (lambda: bytearray(b"glaciers"), ": a bytearray is not a text"),
    "memoryview": (lambda: memoryview(b"glaciers"), ": a memoryview is not a text"),
    "generator of ints": (lambda: (n for n in (1, 2)), r"\[0\] is an int, not a str"),
    "dict items": (lambda: {"a": "glaciers"}.items(), r"\[0\] is a tuple, not a str"),
}


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    return petal.Embedder(str(minilm_dir), "cpu")


@pytest.mark.parametrize("kind", REFUSED)
def test_embedder_refuses_unordered_or_keyed_texts(embedder, kind):
    make, said = REFUSED[kind]
    for call in (embedder.encode, embedder.embed):
        with pytest.raises(petal.UsageError, match="texts" + said):
            call(make())


def test_ordered_collections_are_still_taken(embedder):
    """What the README documents keeps working: one str or bytes, a list, tuple, generator, numpy array, and the
    ordered dict views (``d.values()``, ``d.keys()``: the caller asked for those)."""
    expected = embedder.encode(TEXTS)
    for texts in (TEXTS, tuple(TEXTS), iter(TEXTS), np.array(TEXTS), dict.fromkeys(TEXTS).keys(),
                  dict(zip("ab", TEXTS)).values()):
        np.testing.assert_array_equal(embedder.encode(texts), expected)
    np.testing.assert_array_equal(embedder.encode(TEXTS[0].encode()), expected[:1])


@pytest.fixture(scope="module")
def index(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("texts-args")
    pq.write_table(pa.table({"id": [1, 2, 3], "text": [*TEXTS, "cats purr"]}), root / "s.parquet")
    petal.index(root / "s.parquet", root / "out", model=str(minilm_dir), quiet=True)
    with petal.open_index(root / "out", device="cpu") as opened:
        yield opened


@pytest.mark.parametrize("kind", REFUSED)
def test_index_search_refuses_them_too(index, kind):
    make, said = REFUSED[kind]
    with pytest.raises(petal.UsageError, match="queries" + said):
        index.search(make(), k=2)
    assert [h.id for h in index.search(TEXTS[:1], k=1)[0]] == [1]
