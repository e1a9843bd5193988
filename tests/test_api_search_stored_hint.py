"""``Index.search`` takes the model's float vectors; an ``Embedder`` made with the index's own ``dim=`` or
``quantize=`` gives vectors already in the index's space (what ``petal embed --dim/--quantize`` writes), which
``Index.search_stored`` takes. Passed to ``search``, the ``UsageError`` said only the shape it wanted; it now names
``search_stored``, and stays as it was for vectors of no form the index takes. Real tiny BERT, Parquet and FAISS."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal

TEXTS = ["glaciers flow downhill", "bread dough rises", "cats purr softly", "rivers carve valleys"] * 4


@pytest.mark.parametrize(("settings", "kind"), [({"dim": 16}, "vectors"), ({"quantize": "binary"}, "sign bits"),
                                               ({"quantize": "int8"}, "int8 codes")])
def test_vectors_of_the_index_space_passed_to_search_name_search_stored(tmp_path, tiny_bert_dir, settings, kind):
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": [f"{t} {i}" for i, t in enumerate(TEXTS)]}),
                   tmp_path / "s.parquet")
    petal.index(tmp_path / "s.parquet", tmp_path / "out", model=str(tiny_bert_dir), quiet=True, **settings)
    calibration = {"calibration": str(tmp_path / "out")} if settings.get("quantize") == "int8" else {}
    with petal.open_index(tmp_path / "out", device="cpu") as index, \
            petal.Embedder(str(tiny_bert_dir), "cpu", **settings, **calibration) as embedder:
        own = embedder.encode(["glaciers"], query=True)
        hint = rf"these look like the index's stored {kind} .*Index\.search_stored"
        with pytest.raises(petal.UsageError, match=hint):
            index.search(own, k=2)
        if "dim" in settings:  # integers of the index's width are its vectors too: never called int8 codes
            with pytest.raises(petal.UsageError, match=r"these look like the index's stored vectors \(dim 16\)"):
                index.search(np.ones((1, 16), np.int64), k=2)
        assert len(index.search_stored(own, k=2)[0]) == 2  # (sign bits rescore as +-1: not the text's own order)
        with pytest.raises(petal.UsageError) as refused:  # no form this index takes: no hint
            index.search(np.ones((1, 7), np.float32), k=2)
        assert "search_stored" not in str(refused.value)


@pytest.mark.parametrize("settings", [{}, {"dim": 16}, {"quantize": "binary"}, {"quantize": "int8"}])
def test_no_rows_search_to_no_answers_on_every_index_kind(tmp_path, tiny_bert_dir, settings):
    """Zero query rows gave ``[]`` on float and int8 indexes but a raw ``ValueError`` ("need at least one array to
    concatenate") on a binary one, for ``search`` and ``search_stored`` alike: what an ``Embedder``'s
    ``encode([])`` (0 rows, the index's own space) hands to ``search_stored``."""
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": [f"{t} {i}" for i, t in enumerate(TEXTS)]}),
                   tmp_path / "s.parquet")
    petal.index(tmp_path / "s.parquet", tmp_path / "out", model=str(tiny_bert_dir), quiet=True, **settings)
    calibration = {"calibration": str(tmp_path / "out")} if settings.get("quantize") == "int8" else {}
    with petal.open_index(tmp_path / "out", device="cpu") as index, \
            petal.Embedder(str(tiny_bert_dir), "cpu", **settings, **calibration) as embedder:
        none_stored = embedder.encode([], query=True)
        assert len(none_stored) == 0
        assert index.search_stored(none_stored, k=2) == []
        with petal.Embedder(str(tiny_bert_dir), "cpu") as plain:
            model_dim = plain.encode(["a"]).shape[1]
        assert index.search(np.zeros((0, model_dim), np.float32), k=2) == []
        assert index.search([], k=2) == []
