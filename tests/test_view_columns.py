"""Arrow's view layouts (``string_view``, written by Polars and by pyarrow on request) as the text and
``--keep-columns`` columns of ``petal index``: read, stored and searched like their plain twins.

Before: the shard was embedded, then its stored text or kept column failed as 'cannot read rows from row 0: corrupt
data (Function 'array_take' has no kernel matching input types (string_view, int64))' (65: a good shard called
corrupt), and a kept ``string_view`` column beside a ``string`` one in another shard was 65 'needs one type'.
Real ``petal index`` processes with the packaged model, real Parquet and FAISS."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from tests.test_dictionary_columns import index, petal, version_ids

TEXTS = ["glaciers retreat in summer", "a recipe for bread", "tidal energy"]


def test_string_view_text_and_kept_columns_index_like_strings(tmp_path):
    pq.write_table(pa.table({"id": pa.array(["a", "b", "c"], pa.string_view()),
                             "text": pa.array(TEXTS, pa.string_view()),
                             "lang": pa.array(["en", "fr", "de"], pa.string_view())}), tmp_path / "views.parquet")
    pq.write_table(pa.table({"id": ["d"], "text": ["glaciers and ice"], "lang": ["en"]}), tmp_path / "plain.parquet")
    done, report = index(tmp_path, tmp_path / "views.parquet", tmp_path / "plain.parquet", "--keep-columns", "lang")
    assert done.returncode == 0, done.stderr
    assert report["rows"]["embedded"] == 4 and report["index"]["num_vectors"] == 4
    stored = version_ids(tmp_path / "out")
    assert stored.column("text").to_pylist() == ["glaciers and ice", *TEXTS]  # shards in path order
    assert stored.column("lang").to_pylist() == ["en", "en", "fr", "de"]
    found = petal("query", tmp_path / "out", "glaciers", "-k", "2", "--where", "lang = 'en'", "--json", "--show-text")
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)["hits"]
    assert {h["id"] for h in hits} == {"a", "d"} and all(h["fields"] == {"lang": "en"} for h in hits)
    assert {h["text"] for h in hits} == {TEXTS[0], "glaciers and ice"}


def test_nested_string_views_are_kept_as_their_values(tmp_path):
    # a view inside a list or a struct met the same missing kernel: 65 'corrupt data' after the embedding
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers", "bread"],
                             "tags": pa.array([["ice"], ["food", "baking"]], pa.list_(pa.string_view())),
                             "meta": pa.array([{"lang": "en"}, {"lang": "fr"}],
                                              pa.struct([("lang", pa.string_view())]))}),
                   tmp_path / "nested.parquet")
    done, _ = index(tmp_path, tmp_path / "nested.parquet", "--keep-columns", "tags,meta")
    assert done.returncode == 0, done.stderr
    stored = version_ids(tmp_path / "out")
    assert stored.column("tags").to_pylist() == [["ice"], ["food", "baking"]]
    assert stored.column("meta").to_pylist() == [{"lang": "en"}, {"lang": "fr"}]
