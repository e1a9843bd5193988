"""``petal.Embedder`` closes as ``petal.Index`` does: ``close()`` (or the end of ``with petal.Embedder(...) as
embedder:``) lets its engine go (weights, CUDA graphs, pinned buffers: freed once nothing else holds them, without
waiting for a garbage collection), and a closed one raises ``UsageError``, never an ``AttributeError``. Real tiny
BERT."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import petal


def test_an_embedder_is_a_context_manager_that_lets_its_engine_go(tiny_bert_dir):
    with petal.Embedder(tiny_bert_dir, device="cpu") as embedder:
        rows = embedder.encode(["glaciers move", "bread rises"])
        engine = weakref.ref(embedder.engine)
    assert rows.shape == (2, embedder.dim) and rows.dtype == np.float32
    assert engine() is None  # freed by the close itself (no gc.collect())
    for call in (lambda: embedder.encode("again"), lambda: embedder.embed(["again"]), lambda: embedder.engine):
        with pytest.raises(petal.UsageError, match="closed"):
            call()
    assert embedder.dim == rows.shape[1] and embedder.max_length > 0  # settings stay readable
    embedder.close()  # closing again does nothing


def test_with_on_a_closed_embedder_is_a_usage_error_as_on_a_closed_index(tiny_bert_dir, tmp_path):
    """``with embedder:`` on a closed Embedder went in without a word (``__enter__`` returned it), where a closed
    Index's ``with`` raises: the first encode inside failed instead."""
    embedder = petal.Embedder(tiny_bert_dir, device="cpu")
    embedder.close()
    with pytest.raises(petal.UsageError, match="this Embedder was closed"), embedder:
        pytest.fail("entered a closed Embedder")


def test_close_without_with(tiny_bert_dir):
    embedder = petal.Embedder(tiny_bert_dir, device="cpu")
    embedder.close()
    with pytest.raises(petal.UsageError, match="closed"):
        embedder.encode(["x"])


@pytest.mark.parametrize("settings", [{}, {"dim": 16}, {"output_dtype": "float16"}, {"quantize": "binary"},
                                      {"quantize": "int8"}, {"quantize": "int8", "dim": 32}])
def test_no_texts_is_an_empty_array_in_every_output_format(tiny_bert_dir, settings):
    """``encode([])`` is ``[0, dim]`` (``[0, dim // 8]`` sign bits) of the format's dtype; with int8 ranges learned
    from each call's texts it was a UsageError (no ranges from 0 vectors), unlike every other format."""
    with petal.Embedder(tiny_bert_dir, device="cpu", **settings) as embedder:
        one = embedder.encode(["glaciers move", "bread rises"])
        empty = embedder.encode([])
    assert empty.shape == (0, *one.shape[1:]) and empty.dtype == one.dtype
