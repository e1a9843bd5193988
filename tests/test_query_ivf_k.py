"""``k`` more than an IVF index's probed lists hold: the search returns k hits (every vector, when k is more than
the index holds), as an exact index does (README: "more than the index holds returns what there is"). FAISS's IVF
search looks only in the nprobe lists nearest the query: a 400-vector IVF16 index tuned to a few probes answered
k=400 with the ~100 vectors those lists held, through the API, --vector-file and a --where search alike. Real
Parquet, real FAISS, the API and the CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from tests.test_query_hnsw_k import DIM, NUM, shard  # noqa: F401  (a fixture: the same 400 vectors)


@pytest.mark.parametrize("factory", ["IVF16,Flat", "IDMap2,IVF16,Flat", "IVF16_HNSW8,Flat", "IVF16,SQ8"])
def test_k_past_the_probed_lists_returns_k_hits(shard, factory):  # noqa: F811
    out = shard / factory.replace(",", "_")
    petal.index(shard / "a.parquet", out, vectors_column="emb", index_factory=factory, keep_columns="lang",
                quiet=True)
    queries = np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)
    with petal.open_index(out, nprobe=1) as probe_one, petal.open_index(out) as index:
        small = index.search_stored(queries, k=5)
        for k in (300, NUM, NUM + 50):
            found = probe_one.search_stored(queries, k=k)
            assert [len(hits) for hits in found] == [min(k, NUM)] * 3, (factory, k)
            for hits in found:
                assert len({h.id for h in hits}) == len(hits)
                assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
                assert all(a.score >= b.score - 1e-5 for a, b in itertools.pairwise(hits))
        filtered = probe_one.search_stored(queries, k=NUM, where="lang = 'en'")
        assert [len(hits) for hits in filtered] == [NUM // 2] * 3
        assert all(h.fields["lang"] == "en" for hits in filtered for h in hits)
        # a k its lists hold: as before
        assert [[h.id for h in hits] for hits in index.search_stored(queries, k=5)] == \
            [[h.id for h in hits] for hits in small]
    np.save(shard / "q.npy", queries)
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(shard / "q.npy"), "-k", str(NUM + 1),
                                      "--nprobe", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert [len(json.loads(line)["hits"]) for line in result.stdout.splitlines()] == [NUM] * 3
