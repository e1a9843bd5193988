"""``petal.Hit`` is a frozen dataclass, which promises a hash, but it hashed its ``fields`` dict too: ``set(hits)``,
``hit in seen`` or a dict keyed by hits (merging the answers of several queries) raised ``TypeError: unhashable type:
'dict'`` for every hit, kept columns or none. A hit now hashes by all but ``fields``; equality is unchanged. Real
Parquet and FAISS (a ``vectors_column`` index, no model)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal


@pytest.mark.parametrize("keep", [None, ["lang"]])
def test_hits_go_into_sets_and_dicts(tmp_path, keep):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((40, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(40)], "text": [f"t{i}" for i in range(40)],
                             "lang": ["en", "de"] * 20, "vec": list(vectors)}), tmp_path / "s.parquet")
    petal.index(tmp_path / "s.parquet", tmp_path / "out", vectors_column="vec", keep_columns=keep, quiet=True)
    with petal.open_index(tmp_path / "out") as index:
        first, again = index.search_stored(vectors[:3], k=5), index.search_stored(vectors[:3], k=5)
    merged = {hit for hits in first + again for hit in hits}
    assert merged == {hit for hits in first for hit in hits}
    assert len(merged) == len({(hit.id, hit.rank, hit.faiss_id) for hits in first for hit in hits})
    assert first[0][0] in merged and {first[0][0]: 1}[again[0][0]] == 1
    assert first[0][0] == again[0][0] and hash(first[0][0]) == hash(again[0][0])
    if keep:
        assert first[0][0].fields == {"lang": ["en", "de"][int(first[0][0].id[1:]) % 2]}
